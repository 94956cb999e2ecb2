/*
 * requests: server-side latency per opcode, from kvs:cmd__done (worker,
 * opcode, status, latency_ns). cmd__done carries the latency itself, so
 * cmd__start is not attached (half the probe cost). The server fires it
 * for a sample of the requests; each counts as the `weight` requests it
 * stands for (its fifth argument), so the counts estimate every request's.
 *
 * Flags: those of common.h.
 */
#include "common.h"

#define REQUESTS_OPCODES 32

struct requests_key {
    u32 opcode;
    u32 slot;
};

enum requests_counter { REQUESTS_EVENTS, REQUESTS_MAP_FULL, REQUESTS_COUNTERS };

BPF_HASH(requests_hist, struct requests_key, u64, REQUESTS_OPCODES * HIST_SLOTS);
BPF_PERCPU_ARRAY(requests_counters, u64, REQUESTS_COUNTERS);  // per CPU: no line of ours bounces

int requests_on_done(struct pt_regs *ctx)
{
    if (!kv_is_target(bpf_get_current_pid_tgid()))
        return 0;
    int opcode = 0;
    u64 ns = 0;
    int sampled = 0;
    bpf_usdt_readarg(2, ctx, &opcode);
    bpf_usdt_readarg(4, ctx, &ns);
    bpf_usdt_readarg(5, ctx, &sampled);
    u64 weight = sampled > 0 ? sampled : 1;
    kv_add_percpu(requests_counters.lookup(KV_IDX(REQUESTS_EVENTS)), 1);

    struct requests_key k = {};
    k.opcode = opcode >= 0 && opcode < REQUESTS_OPCODES ? opcode : REQUESTS_OPCODES - 1;
    k.slot = kv_log2_slot(ns);
    u64 zero = 0;
    if (!kv_add(requests_hist.lookup_or_try_init(&k, &zero), weight))
        kv_add_percpu(requests_counters.lookup(KV_IDX(REQUESTS_MAP_FULL)), 1);
    return 0;
}
