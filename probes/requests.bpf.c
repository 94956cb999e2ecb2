/*
 * requests: server-side latency per opcode, from kvs:cmd__done (worker,
 * opcode, status, latency_ns). cmd__done carries the latency itself, so
 * cmd__start is not attached (half the probe cost). The server fires it
 * for 1 request in N (--probe-sample N): counts here are sampled.
 *
 * cflags: -DTARGET_PID=<tgid>
 */
#include <uapi/linux/ptrace.h>

#define HIST_SLOTS 64
#define MAX_OPCODES 32

struct hist_key {
    u32 opcode;
    u32 slot;
};

BPF_HASH(hist, struct hist_key, u64, MAX_OPCODES * HIST_SLOTS);
BPF_ARRAY(counters, u64, 2); /* events, map full */

int on_done(struct pt_regs *ctx)
{
    if ((bpf_get_current_pid_tgid() >> 32) != TARGET_PID)
        return 0;
    int opcode = 0;
    u64 ns = 0;
    bpf_usdt_readarg(2, ctx, &opcode);
    bpf_usdt_readarg(4, ctx, &ns);
    int which = 0;
    u64 *c = counters.lookup(&which);
    if (c)
        __sync_fetch_and_add(c, 1);

    struct hist_key k = {};
    k.opcode = opcode >= 0 && opcode < MAX_OPCODES ? opcode : MAX_OPCODES - 1;
    u32 slot = ns ? bpf_log2l(ns) - 1 : 0;
    k.slot = slot < HIST_SLOTS ? slot : HIST_SLOTS - 1;
    u64 zero = 0;
    u64 *h = hist.lookup_or_try_init(&k, &zero);
    if (!h) {
        which = 1;
        c = counters.lookup(&which);
        if (c)
            __sync_fetch_and_add(c, 1);
        return 0;
    }
    __sync_fetch_and_add(h, 1);
    return 0;
}
