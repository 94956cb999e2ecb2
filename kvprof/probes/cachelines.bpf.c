/*
 * cachelines: which shared counters' cache lines bounce, from
 * kvs:atomic__sample (counter address, site name, TSC cycles the update took).
 *
 * Ownership: `owner` keeps, per 64-byte line, the CPU (+1) that sampled it
 * last. A sample whose previous sample on the same line came from another
 * CPU is a transfer; the cpu -> socket array (filled by the loader from the
 * topology) splits transfers into same-socket and cross-socket and feeds a
 * socket x socket matrix per (site, line).
 *
 * The owner is swapped with an atomic exchange, so every sample sees exactly
 * the owner left by the sample before it in one total order per line: the
 * counts are exact for that order. The order can differ from the order of
 * the counter updates themselves (the probe fires just after the update),
 * which only matters for samples a few nanoseconds apart. Samples are a
 * sample of the updates (paced or 1 in N, per thread and site), so a
 * transfer here means "the line moved at least once between two sampled
 * updates". Each sample counts as the `weight` updates it stands for (the
 * probe's fourth argument): samples, transfers, cycles, the histograms and
 * the matrix are estimates of every update's.
 *
 * Flags: those of common.h, and -DCACHELINES_CPUS=<cpu array size>,
 * -DCACHELINES_SOCKETS=<matrix side>.
 */
#include "common.h"

// A site is keyed by the address of its name, a string constant in the
// server: the loader reads the name from the target's memory once per address
// (reading the string here at every sample cost more than the rest).
struct cachelines_key {
    u64 site;
    u64 line;
    u32 tid;
    u32 pad;
};

struct cachelines_val {
    u64 samples;
    u64 transfers;
    u64 cross;
    u64 cycles;
    u64 max_cycles;
};

struct cachelines_hist_key {  // per thread, as cachelines_key: only that thread writes its counts
    u64 site;
    u64 line;
    u32 slot;
    u32 tid;
};

struct cachelines_matrix_key {
    u64 site;
    u64 line;
    u32 from;
    u32 to;
};

struct cachelines_owner {
    u64 cpu1; /* last CPU + 1; 0 = never sampled */
};

enum cachelines_counter { CACHELINES_EVENTS, CACHELINES_MAP_FULL, CACHELINES_COUNTERS };

BPF_HASH(cachelines_lines, struct cachelines_key, struct cachelines_val, MAX_ENTRIES);
BPF_HASH(cachelines_hist, struct cachelines_hist_key, u64, MAX_ENTRIES);
BPF_HASH(cachelines_matrix, struct cachelines_matrix_key, u64, MAX_ENTRIES);
BPF_HASH(cachelines_owner, u64, struct cachelines_owner, MAX_ENTRIES);
BPF_ARRAY(cachelines_cpu_socket, u32, CACHELINES_CPUS);
BPF_PERCPU_ARRAY(cachelines_counters, u64, CACHELINES_COUNTERS);  // per CPU: no line of ours bounces

static __always_inline void cachelines_count(int which)
{
    kv_add_percpu(cachelines_counters.lookup(&which), 1);
}

static __always_inline u32 cachelines_socket_of(u32 cpu)
{
    u32 *s = cachelines_cpu_socket.lookup(&cpu);
    u32 sock = s ? *s : 0;
    return sock < CACHELINES_SOCKETS ? sock : CACHELINES_SOCKETS - 1;
}

int cachelines_on_sample(struct pt_regs *ctx)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if (!kv_is_target(pid_tgid))
        return 0;
    u64 counter = 0, site = 0, cycles = 0;
    int sampled = 0;
    bpf_usdt_readarg(1, ctx, &counter);
    bpf_usdt_readarg(2, ctx, &site);
    bpf_usdt_readarg(3, ctx, &cycles);
    bpf_usdt_readarg(4, ctx, &sampled);
    u64 weight = sampled > 0 ? sampled : 1;
    cachelines_count(CACHELINES_EVENTS);

    u32 cpu = bpf_get_smp_processor_id();
    u64 line = counter & ~63ULL;

    /* ownership first: one exchange per sample */
    struct cachelines_owner none = {};
    struct cachelines_owner *o = cachelines_owner.lookup_or_try_init(&line, &none);
    if (!o) {
        cachelines_count(CACHELINES_MAP_FULL);
        return 0;
    }
    u64 prev1 = __sync_lock_test_and_set(&o->cpu1, (u64)cpu + 1);
    int transfer = prev1 != 0 && prev1 != (u64)cpu + 1;
    int cross = 0;
    u32 from = 0, to = 0;
    if (transfer) {
        from = cachelines_socket_of((u32)(prev1 - 1));
        to = cachelines_socket_of(cpu);
        cross = from != to;
    }

    struct cachelines_key k = {};
    k.site = site;
    k.line = line;
    k.tid = (u32)pid_tgid;
    struct cachelines_val zero = {};
    struct cachelines_val *v = cachelines_lines.lookup_or_try_init(&k, &zero);
    if (!v) {
        cachelines_count(CACHELINES_MAP_FULL);
        return 0;
    }
    /* one key is one thread, so plain adds: kvprof's own counts bounce no line */
    v->samples += weight;
    v->cycles += cycles * weight;
    if (cycles > v->max_cycles)
        v->max_cycles = cycles;
    if (transfer) {
        v->transfers += weight;
        v->cross += cross ? weight : 0;
        struct cachelines_matrix_key mk = {};
        mk.site = site;
        mk.line = line;
        mk.from = from;
        mk.to = to;
        u64 nil = 0;
        if (!kv_add(cachelines_matrix.lookup_or_try_init(&mk, &nil), weight))
            cachelines_count(CACHELINES_MAP_FULL);
    }

    struct cachelines_hist_key hk = {};
    hk.site = site;
    hk.line = line;
    hk.slot = kv_log2_slot(cycles);
    hk.tid = (u32)pid_tgid;
    u64 nil2 = 0;
    if (!kv_add_percpu(cachelines_hist.lookup_or_try_init(&hk, &nil2), weight))  // keyed by thread
        cachelines_count(CACHELINES_MAP_FULL);
    return 0;
}
