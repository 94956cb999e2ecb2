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
 * which only matters for samples a few nanoseconds apart. Samples are 1 in
 * N updates (kvcached --probe-sample), so a transfer here means "the line
 * moved at least once between two sampled updates".
 *
 * cflags: -DTARGET_PID=<tgid>, -DMAX_ENTRIES=<entries per map>,
 *         -DMAX_CPUS=<cpu array size>, -DMAX_SOCKETS=<matrix side>
 */
#include <uapi/linux/ptrace.h>

#define SITE_LEN 32
#define HIST_SLOTS 64

struct line_key {
    char site[SITE_LEN];
    u64 line;
    u32 tid;
    u32 pad;
};

struct line_val {
    u64 samples;
    u64 transfers;
    u64 cross;
    u64 cycles;
    u64 max_cycles;
};

struct hist_key {
    char site[SITE_LEN];
    u64 line;
    u32 slot;
    u32 pad;
};

struct matrix_key {
    char site[SITE_LEN];
    u64 line;
    u32 from;
    u32 to;
};

struct owner_val {
    u64 cpu1; /* last CPU + 1; 0 = never sampled */
};

enum counter { C_EVENTS, C_MAP_FULL, C_COUNTERS };

BPF_HASH(lines, struct line_key, struct line_val, MAX_ENTRIES);
BPF_HASH(hist, struct hist_key, u64, MAX_ENTRIES);
BPF_HASH(matrix, struct matrix_key, u64, MAX_ENTRIES);
BPF_HASH(owner, u64, struct owner_val, MAX_ENTRIES);
BPF_ARRAY(cpu_socket, u32, MAX_CPUS);
BPF_ARRAY(counters, u64, C_COUNTERS);

static __always_inline void count(int which)
{
    u64 *c = counters.lookup(&which);
    if (c)
        __sync_fetch_and_add(c, 1);
}

static __always_inline u32 socket_of(u32 cpu)
{
    u32 *s = cpu_socket.lookup(&cpu);
    u32 sock = s ? *s : 0;
    return sock < MAX_SOCKETS ? sock : MAX_SOCKETS - 1;
}

int on_sample(struct pt_regs *ctx)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if ((pid_tgid >> 32) != TARGET_PID)
        return 0;
    u64 counter = 0, site = 0, cycles = 0;
    bpf_usdt_readarg(1, ctx, &counter);
    bpf_usdt_readarg(2, ctx, &site);
    bpf_usdt_readarg(3, ctx, &cycles);
    count(C_EVENTS);

    u32 cpu = bpf_get_smp_processor_id();
    u64 line = counter & ~63ULL;

    /* ownership first: one exchange per sample */
    struct owner_val none = {};
    struct owner_val *o = owner.lookup_or_try_init(&line, &none);
    if (!o) {
        count(C_MAP_FULL);
        return 0;
    }
    u64 prev1 = __sync_lock_test_and_set(&o->cpu1, (u64)cpu + 1);
    int transfer = prev1 != 0 && prev1 != (u64)cpu + 1;
    int cross = 0;
    u32 from = 0, to = 0;
    if (transfer) {
        from = socket_of((u32)(prev1 - 1));
        to = socket_of(cpu);
        cross = from != to;
    }

    struct line_key k = {};
    bpf_probe_read_user_str(k.site, sizeof(k.site), (void *)site);
    k.line = line;
    k.tid = (u32)pid_tgid;
    struct line_val zero = {};
    struct line_val *v = lines.lookup_or_try_init(&k, &zero);
    if (!v) {
        count(C_MAP_FULL);
        return 0;
    }
    __sync_fetch_and_add(&v->samples, 1);
    __sync_fetch_and_add(&v->cycles, cycles);
    if (cycles > v->max_cycles) /* one key is one thread: no race */
        v->max_cycles = cycles;
    if (transfer) {
        __sync_fetch_and_add(&v->transfers, 1);
        if (cross)
            __sync_fetch_and_add(&v->cross, 1);
        struct matrix_key mk = {};
        __builtin_memcpy(mk.site, k.site, sizeof(mk.site));
        mk.line = line;
        mk.from = from;
        mk.to = to;
        u64 nil = 0;
        u64 *m = matrix.lookup_or_try_init(&mk, &nil);
        if (m)
            __sync_fetch_and_add(m, 1);
        else
            count(C_MAP_FULL);
    }

    struct hist_key hk = {};
    __builtin_memcpy(hk.site, k.site, sizeof(hk.site));
    hk.line = line;
    u32 slot = cycles ? bpf_log2l(cycles) - 1 : 0;
    hk.slot = slot < HIST_SLOTS ? slot : HIST_SLOTS - 1;
    u64 nil2 = 0;
    u64 *h = hist.lookup_or_try_init(&hk, &nil2);
    if (h)
        __sync_fetch_and_add(h, 1);
    else
        count(C_MAP_FULL);
    return 0;
}
