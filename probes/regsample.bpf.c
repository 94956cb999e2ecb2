// User registers of one process at each on-CPU sample, for data addresses.
//
// Loaded by kvprof/collect/regsample.py, which attaches on_sample to one
// cpu-clock event per CPU at the on-CPU sampling rate (as oncpu.bpf.c does)
// and passes:
//   -DTARGET_TGID=<pid>     the process to keep; every other sample is dropped here
//   -DRING=<n>              raw samples kept (a power of two): the newest n
//   -DMAX_THREADS=<n>       threads counted in `threads`
//
// When the sample interrupted user mode, ctx->regs are the target's user
// registers: the loader decodes the instruction at (and just before) the IP
// and computes a locked instruction's data address from them. A sample taken
// in kernel mode only counts for its thread (its user registers are behind
// kernel structs, which this program never dereferences).
//
// The ring: `seq` numbers every user-mode sample; sample n goes to slot
// n % RING and its `seq` field is written last, as n + 1, so a reader takes a
// slot only when that field says it holds the sample it expects. A reader
// that falls more than RING behind (or reads once, at the end of a long
// window) loses the oldest ones: it counts them from `seq`.

#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>

#ifndef TARGET_TGID
#error "compile with -DTARGET_TGID=<pid>"
#endif
#ifndef RING
#define RING 32768
#endif
#ifndef MAX_THREADS
#define MAX_THREADS 4096
#endif

// The order of the loader's REGS tuple.
struct sample_t {
    u64 seq;  // n + 1 once complete, 0 while never written
    u32 tid;
    u32 cpu;
    u64 ip;
    u64 regs[16];  // ax bx cx dx si di bp sp r8 .. r15
};

struct thread_t {
    u64 user;    // samples in user mode (each one went to the ring)
    u64 kernel;  // samples in kernel mode (no user registers)
};

enum health {
    H_SAMPLES,      // samples of the target
    H_THREADS_FULL, // a new thread did not fit in `threads`
    H_COUNT,
};

BPF_ARRAY(ring, struct sample_t, RING);
BPF_ARRAY(seq, u64, 1);
BPF_HASH(threads, u32, struct thread_t, MAX_THREADS);
BPF_PERCPU_ARRAY(health, u64, H_COUNT);

static __always_inline void count(int what)
{
    int idx = what;
    u64 *v = health.lookup(&idx);
    if (v)
        (*v)++;
}

int on_sample(struct bpf_perf_event_data *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if ((id >> 32) != TARGET_TGID)
        return 0;
    count(H_SAMPLES);
    u32 tid = (u32)id;
    int user = (ctx->regs.cs & 3) == 3;

    struct thread_t zero = {};
    struct thread_t *t = threads.lookup_or_try_init(&tid, &zero);
    if (!t)
        count(H_THREADS_FULL);
    else if (user)
        __sync_fetch_and_add(&t->user, 1);
    else
        __sync_fetch_and_add(&t->kernel, 1);
    if (!user)
        return 0;

    int zero_idx = 0;
    u64 *n = seq.lookup(&zero_idx);
    if (!n)
        return 0;
    u64 mine = __sync_fetch_and_add(n, 1);
    int slot = (int)(mine & (RING - 1));
    struct sample_t *s = ring.lookup(&slot);
    if (!s)
        return 0;
    s->seq = 0;
    s->tid = tid;
    s->cpu = bpf_get_smp_processor_id();
    s->ip = ctx->regs.ip;
    s->regs[0] = ctx->regs.ax;
    s->regs[1] = ctx->regs.bx;
    s->regs[2] = ctx->regs.cx;
    s->regs[3] = ctx->regs.dx;
    s->regs[4] = ctx->regs.si;
    s->regs[5] = ctx->regs.di;
    s->regs[6] = ctx->regs.bp;
    s->regs[7] = ctx->regs.sp;
    s->regs[8] = ctx->regs.r8;
    s->regs[9] = ctx->regs.r9;
    s->regs[10] = ctx->regs.r10;
    s->regs[11] = ctx->regs.r11;
    s->regs[12] = ctx->regs.r12;
    s->regs[13] = ctx->regs.r13;
    s->regs[14] = ctx->regs.r14;
    s->regs[15] = ctx->regs.r15;
    barrier();  // x86 keeps stores in order; the compiler must too
    s->seq = mine + 1;
    return 0;
}
