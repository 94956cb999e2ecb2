// Off-CPU time and futex waits of one process.
//
// Loaded by kvprof/collect/offcpu.py with:
//   -DTARGET_TGID=<pid>       the process to keep; everything else is dropped here
//   -DSTACK_STORAGE=<n>       stack ids per stack map
//   -DMAX_ENTRIES=<n>         entries per aggregation map
//   -DSTACK_SAMPLE=<n>        take the stacks of 1 in n switch-outs (random)
//   -DUNWIND_*                the bounds of unwind.h (user stacks walked from unwind tables)
//
// Walking two stacks at every switch-out of a thread that blocks per batch
// (epoll_wait) was the single largest cost of an attached kvprof: ~3 µs per
// switch, 25k switches/s, 10 % of a core. So every off-CPU period is timed
// (per-thread totals are exact), but its stacks are taken for a random
// 1 in STACK_SAMPLE of them only, and `offcpu` holds the sampled periods'
// ns: the loader scales them by STACK_SAMPLE (an unbiased estimate).
//
// Only tracepoint format fields, plain raw-tracepoint arguments, the user
// pt_regs (bpf_task_pt_regs: the task is in the kernel here, so its user
// registers are the ones saved at its entry) and helpers are used: no other
// kernel struct is ever dereferenced (the headers may not match the running kernel).
//
// sched_switch is taken as a raw tracepoint and runs in the task switching
// out, so only the current task is ever looked at: a thread's off-CPU period
// runs from its switch-out to when it came back on a CPU, which is that CPU's
// previous switch (`last_switch`), and is accounted at its next switch-out.
// Threads of other processes cost one per-CPU store (the formatted
// tracepoint copied both tasks' fields and looked up a hash for every
// switch in the system).

#include <uapi/linux/ptrace.h>

#ifndef TARGET_TGID
#error "compile with -DTARGET_TGID=<pid>"
#endif
#ifndef STACK_STORAGE
#define STACK_STORAGE 16384
#endif
#ifndef MAX_ENTRIES
#define MAX_ENTRIES 10240
#endif
#ifndef STACK_SAMPLE
#define STACK_SAMPLE 1
#endif

#include "unwind.h"

#define KV_EEXIST 17
#define KV_ENOMEM 12
#define KV_EAGAIN 11

// futex(2) commands that put the caller to sleep (op & FUTEX_CMD_MASK).
#define FUTEX_WAIT 0
#define FUTEX_LOCK_PI 6
#define FUTEX_WAIT_BITSET 9
#define FUTEX_WAIT_REQUEUE_PI 11
#define FUTEX_LOCK_PI2 13
#define FUTEX_CMD_MASK 127  // without FUTEX_PRIVATE_FLAG (128) and FUTEX_CLOCK_REALTIME (256)

// Index order is the loader's HEALTH tuple.
enum health {
    H_SWITCHES,          // target threads switched out
    H_STACK_ERR,         // get_stackid -EEXIST or -ENOMEM, or a user stack that did not fit in `ustacks`
    H_MAP_FULL,          // a key did not fit in an aggregation map
    H_START_FULL,        // a thread's record did not fit
    H_PREEMPTED_NS,      // off-CPU ns that began with the thread still runnable (preempted)
    H_FUTEX_WAITS,
    H_FUTEX_EAGAIN,      // wait calls that returned at once (the word had changed): not counted as waits
    H_COUNT,
};

// One per target thread, only ever written by that thread (at its own
// switch-out), so its fields are updated in place without atomics.
struct thread_t {
    u64 ts;        // when it last left the CPU; 0 before its first switch-out
    u64 total_ns;  // off-CPU time of every period accounted so far
    u64 user_stack;  // key in `ustacks`, 0: none
    s32 kernel_stack;
    u16 preempted;
    u16 sampled;  // stacks were taken for the period that began at ts
};

struct off_key_t {
    u32 tid;
    s32 kernel_stack;
    u64 user_stack;
};

struct futex_start_t {
    u64 ts;
    u64 uaddr;
    u64 user_stack;
};

struct futex_key_t {
    u64 uaddr;
    u64 user_stack;
    u32 tid;
    u32 pad;
};

struct futex_val_t {
    u64 waits;
    u64 ns;
};

BPF_STACK_TRACE(stacks, STACK_STORAGE);
BPF_PERCPU_ARRAY(last_switch, u64, 1);                   // when this CPU last switched tasks
BPF_HASH(threads, u32, struct thread_t, MAX_ENTRIES);    // tid -> when and where it left the CPU
BPF_HASH(offcpu, struct off_key_t, u64, MAX_ENTRIES);    // -> ns of the sampled periods
BPF_HASH(futex_start, u32, struct futex_start_t, MAX_ENTRIES);
BPF_HASH(futex, struct futex_key_t, struct futex_val_t, MAX_ENTRIES);
BPF_PERCPU_ARRAY(health, u64, H_COUNT);

static __always_inline void add_health(int what, u64 n)
{
    int idx = what;
    u64 *v = health.lookup(&idx);
    if (v)
        *v += n;
}

// The current task's user stack (it is in the kernel: its user registers are
// the ones saved at entry), as a key in `ustacks`; 0 when there is none.
static __always_inline u64 user_stack(void)
{
    struct unw_regs regs = {};
    if (unw_user_regs(0, &regs))
        return 0;
    u64 key = unw_stack(&regs);
    if (!key)
        add_health(H_STACK_ERR, 1);
    return key;
}

static __always_inline int stack_id(void *ctx, u64 flags)
{
    int id = stacks.get_stackid(ctx, flags);
    if (id == -KV_EEXIST || id == -KV_ENOMEM)
        add_health(H_STACK_ERR, 1);
    return id;
}

// The off-CPU period of `t` that ended when it came back on a CPU at `on_since`.
static __always_inline void account(u32 tid, struct thread_t *t, u64 on_since)
{
    u64 delta = on_since - t->ts;
    t->total_ns += delta;
    if (t->preempted)
        add_health(H_PREEMPTED_NS, delta);
    if (!t->sampled)
        return;

    struct off_key_t key = {};
    key.tid = tid;
    key.user_stack = t->user_stack;
    key.kernel_stack = t->kernel_stack;
    u64 *ns = offcpu.lookup(&key);
    if (ns) {
        __sync_fetch_and_add(ns, delta);
    } else {
        int err = offcpu.insert(&key, &delta);
        if (err == -KV_EEXIST) {
            ns = offcpu.lookup(&key);
            if (ns)
                __sync_fetch_and_add(ns, delta);
        } else if (err) {
            add_health(H_MAP_FULL, 1);
        }
    }
}

// args: (bool preempt, struct task_struct *prev, struct task_struct *next, ...);
// only the plain `preempt` flag is read, never the task structs.
RAW_TRACEPOINT_PROBE(sched_switch)
{
    u64 now = bpf_ktime_get_ns();
    int zero = 0;
    u64 *last = last_switch.lookup(&zero);
    if (!last)
        return 0;
    u64 on_since = *last;  // when the task now leaving came on this CPU
    *last = now;

    u64 id = bpf_get_current_pid_tgid();
    if ((id >> 32) != TARGET_TGID || !unw_tables_ready())
        return 0;
    u32 tid = (u32)id;
    add_health(H_SWITCHES, 1);

    struct thread_t fresh = {};
    struct thread_t *t = threads.lookup_or_try_init(&tid, &fresh);
    if (!t) {
        add_health(H_START_FULL, 1);
        return 0;
    }
    if (t->ts && on_since > t->ts)  // on_since is 0 before this CPU's first switch since attach
        account(tid, t, on_since);

    t->ts = now;
    t->preempted = ctx->args[0] != 0;
    t->sampled = STACK_SAMPLE <= 1 || bpf_get_prandom_u32() % STACK_SAMPLE == 0;
    if (t->sampled) {
        t->user_stack = user_stack();
        t->kernel_stack = stack_id(ctx, 0);
    }
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_futex)
{
    u64 id = bpf_get_current_pid_tgid();
    if ((id >> 32) != TARGET_TGID || !unw_tables_ready())
        return 0;
    int cmd = args->op & FUTEX_CMD_MASK;
    if (cmd != FUTEX_WAIT && cmd != FUTEX_WAIT_BITSET && cmd != FUTEX_LOCK_PI &&
        cmd != FUTEX_LOCK_PI2 && cmd != FUTEX_WAIT_REQUEUE_PI)
        return 0;
    u32 tid = (u32)id;
    struct futex_start_t s = {};
    s.ts = bpf_ktime_get_ns();
    s.uaddr = (u64)args->uaddr;
    s.user_stack = user_stack();
    if (futex_start.update(&tid, &s))
        add_health(H_START_FULL, 1);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_futex)
{
    u64 id = bpf_get_current_pid_tgid();
    if ((id >> 32) != TARGET_TGID)
        return 0;
    u32 tid = (u32)id;
    struct futex_start_t *s = futex_start.lookup(&tid);
    if (!s)
        return 0;
    u64 delta = bpf_ktime_get_ns() - s->ts;
    struct futex_key_t key = {};
    key.uaddr = s->uaddr;
    key.tid = tid;
    key.user_stack = s->user_stack;
    futex_start.delete(&tid);
    if (args->ret == -KV_EAGAIN) {
        add_health(H_FUTEX_EAGAIN, 1);
        return 0;
    }
    add_health(H_FUTEX_WAITS, 1);

    struct futex_val_t *v = futex.lookup(&key);
    if (v) {
        __sync_fetch_and_add(&v->waits, 1);
        __sync_fetch_and_add(&v->ns, delta);
    } else {
        struct futex_val_t one = {};
        one.waits = 1;
        one.ns = delta;
        int err = futex.insert(&key, &one);
        if (err == -KV_EEXIST) {
            v = futex.lookup(&key);
            if (v) {
                __sync_fetch_and_add(&v->waits, 1);
                __sync_fetch_and_add(&v->ns, delta);
            }
        } else if (err) {
            add_health(H_MAP_FULL, 1);
        }
    }
    return 0;
}
