// User registers of one process at each on-CPU sample, for data addresses.
//
// Loaded by kvprof/collect/regsample.py. regsample_sample runs at every
// sample of the target taken by the module's cpu-clock events, one per CPU at
// the on-CPU sampling rate (clock.bpf.c), the events oncpu.bpf.c samples at
// too. Flags: those of common.h, and
//   -DREGSAMPLE_RING=<n>       raw samples kept (a power of two): the newest n
//   -DREGSAMPLE_THREADS=<n>    threads counted in `regsample_threads`
//
// When the sample interrupted user mode, ctx->regs are the target's user
// registers: the loader decodes the instruction at (and just before) the IP
// and computes a locked instruction's data address from them. A sample taken
// in kernel mode keeps the user registers the thread entered the kernel with
// (the task's saved pt_regs, whose layout the x86-64 ABI fixes, as
// probes/unwind.h reads them): inside a syscall they are its arguments, so the
// loader can say which mutex a futex call under pthread_mutex_lock acts on.
// Each slot also keeps the user stack oncpu.bpf.c took at the same sample (its
// key in `ustacks`; 0 when oncpu is not in the module), which names the caller.
//
// The ring: `regsample_seq` numbers every sample; sample n goes to
// slot n % RING and its `seq` field is written last, as n + 1, so a reader
// takes a slot only when that field says it holds the sample it expects. A
// reader that falls more than RING behind (or reads once, at the end of a
// long window) loses the oldest ones: it counts them from `regsample_seq`.

#include "common.h"

#if !defined(REGSAMPLE_RING) || !defined(REGSAMPLE_THREADS)
#error "compile with -DREGSAMPLE_RING=<n> -DREGSAMPLE_THREADS=<n>"
#endif

// The order of the loader's REGS tuple.
struct regsample_slot {
    u64 seq;  // n + 1 once complete, 0 while never written
    u32 tid;
    u32 cpu;
    u64 ustack;  // the sample's user stack in `ustacks` (oncpu.bpf.c), 0: none
    u32 kernel;  // 1: taken in kernel mode (the registers are those the thread entered it with)
    u32 pad;
    u64 ip;
    u64 regs[16];  // ax bx cx dx si di bp sp r8 .. r15
};

struct regsample_thread {
    u64 user;    // samples in user mode
    u64 kernel;  // samples in kernel mode
};

enum regsample_health {
    REGSAMPLE_SAMPLES,       // samples of the target
    REGSAMPLE_THREADS_FULL,  // a new thread did not fit in `regsample_threads`
    REGSAMPLE_HEALTH,
};

BPF_ARRAY(regsample_ring, struct regsample_slot, REGSAMPLE_RING);
BPF_ARRAY(regsample_seq, u64, 1);
BPF_HASH(regsample_threads, u32, struct regsample_thread, REGSAMPLE_THREADS);
BPF_PERCPU_ARRAY(regsample_health, u64, REGSAMPLE_HEALTH);

// Inlined at each call: the verifier wants the context's fields and the stack's
// read by different instructions.
static __always_inline void regsample_fill(struct regsample_slot *s, struct pt_regs *r)
{
    s->ip = r->ip;
    s->regs[0] = r->ax;
    s->regs[1] = r->bx;
    s->regs[2] = r->cx;
    s->regs[3] = r->dx;
    s->regs[4] = r->si;
    s->regs[5] = r->di;
    s->regs[6] = r->bp;
    s->regs[7] = r->sp;
    s->regs[8] = r->r8;
    s->regs[9] = r->r9;
    s->regs[10] = r->r10;
    s->regs[11] = r->r11;
    s->regs[12] = r->r12;
    s->regs[13] = r->r13;
    s->regs[14] = r->r14;
    s->regs[15] = r->r15;
}

static __always_inline void regsample_sample(struct kv_perf_event_data *ctx, u64 id, u64 ustack)
{
    kv_add_percpu(regsample_health.lookup(KV_IDX(REGSAMPLE_SAMPLES)), 1);
    u32 tid = (u32)id;
    int user = (ctx->regs.cs & 3) == 3;

    struct regsample_thread zero = {};
    struct regsample_thread *t = regsample_threads.lookup_or_try_init(&tid, &zero);
    if (!t)
        kv_add_percpu(regsample_health.lookup(KV_IDX(REGSAMPLE_THREADS_FULL)), 1);
    else if (user)
        __sync_fetch_and_add(&t->user, 1);
    else
        __sync_fetch_and_add(&t->kernel, 1);
    struct pt_regs saved = {};
    if (!user && bpf_probe_read_kernel(&saved, sizeof(saved), (void *)bpf_task_pt_regs(bpf_get_current_task_btf())))
        return;

    int zero_idx = 0;
    u64 *n = regsample_seq.lookup(&zero_idx);
    if (!n)
        return;
    u64 mine = __sync_fetch_and_add(n, 1);
    int slot = (int)(mine & (REGSAMPLE_RING - 1));
    struct regsample_slot *s = regsample_ring.lookup(&slot);
    if (!s)
        return;
    s->seq = 0;
    s->tid = tid;
    s->cpu = bpf_get_smp_processor_id();
    s->ustack = ustack;
    s->kernel = !user;
    if (user)
        regsample_fill(s, &ctx->regs);
    else
        regsample_fill(s, &saved);
    barrier();  // x86 keeps stores in order; the compiler must too
    s->seq = mine + 1;
}
