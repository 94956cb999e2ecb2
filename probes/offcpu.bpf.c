// Off-CPU time and futex waits of one process.
//
// Loaded by kvprof/collect/offcpu.py. Flags: those of common.h, the
// -DUNWIND_* bounds of unwind.h (user stacks walked from unwind tables), and
//   -DOFFCPU_STACK_SAMPLE=<n>   take the stacks of 1 in n switch-outs (random)
//
// Walking two stacks at every switch-out of a thread that blocks per batch
// (epoll_wait) was the single largest cost of an attached kvprof (the
// figures are in docs/record.md). So every off-CPU period is timed
// (per-thread totals are exact), but its stacks are taken for a random
// 1 in OFFCPU_STACK_SAMPLE of them only, and `offcpu_periods` holds the
// sampled periods' ns: the loader scales them by that factor (an unbiased
// estimate).
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

#include "common.h"
#include "unwind.h"

#ifndef OFFCPU_STACK_SAMPLE
#error "compile with -DOFFCPU_STACK_SAMPLE=<n>"
#endif

// futex(2) commands that put the caller to sleep (op & FUTEX_CMD_MASK).
#define FUTEX_WAIT 0
#define FUTEX_LOCK_PI 6
#define FUTEX_WAIT_BITSET 9
#define FUTEX_WAIT_REQUEUE_PI 11
#define FUTEX_LOCK_PI2 13
#define FUTEX_CMD_MASK 127  // without FUTEX_PRIVATE_FLAG (128) and FUTEX_CLOCK_REALTIME (256)

// Index order is the loader's HEALTH tuple.
enum offcpu_health {
    OFFCPU_SWITCHES,          // target threads switched out
    OFFCPU_STACK_ERR,         // get_stackid -EEXIST or -ENOMEM, or a user stack that did not fit in `ustacks`
    OFFCPU_MAP_FULL,          // a key did not fit in an aggregation map
    OFFCPU_START_FULL,        // a thread's record did not fit
    OFFCPU_PREEMPTED_NS,      // off-CPU ns that began with the thread still runnable (preempted)
    OFFCPU_FUTEX_WAITS,
    OFFCPU_FUTEX_EAGAIN,      // wait calls that returned at once (the word had changed): not counted as waits
    OFFCPU_HEALTH,
};

// One per target thread, only ever written by that thread (at its own
// switch-out), so its fields are updated in place without atomics.
struct offcpu_thread {
    u64 ts;        // when it last left the CPU; 0 before its first switch-out
    u64 total_ns;  // off-CPU time of every period accounted so far
    u64 user_stack;  // key in `ustacks`, 0: none
    s32 kernel_stack;
    u16 preempted;
    u16 sampled;  // stacks were taken for the period that began at ts
};

struct offcpu_key {
    u32 tid;
    s32 kernel_stack;
    u64 user_stack;
};

struct offcpu_futex_start {
    u64 ts;
    u64 uaddr;
    u64 user_stack;
};

struct offcpu_futex_key {
    u64 uaddr;
    u64 user_stack;
    u32 tid;
    u32 pad;
};

struct offcpu_futex_val {
    u64 waits;
    u64 ns;
};

BPF_STACK_TRACE(offcpu_stacks, STACK_STORAGE);
BPF_PERCPU_ARRAY(offcpu_last_switch, u64, 1);                   // when this CPU last switched tasks
BPF_HASH(offcpu_threads, u32, struct offcpu_thread, MAX_ENTRIES);    // tid -> when and where it left the CPU
BPF_HASH(offcpu_periods, struct offcpu_key, u64, MAX_ENTRIES);  // -> ns of the sampled periods
BPF_HASH(offcpu_futex_start, u32, struct offcpu_futex_start, MAX_ENTRIES);
BPF_HASH(offcpu_futex, struct offcpu_futex_key, struct offcpu_futex_val, MAX_ENTRIES);
BPF_PERCPU_ARRAY(offcpu_health, u64, OFFCPU_HEALTH);

static __always_inline void offcpu_count(int what, u64 n)
{
    kv_add_percpu(offcpu_health.lookup(&what), n);
}

// The current task's user stack (it is in the kernel: its user registers are
// the ones saved at entry), as a key in `ustacks`; 0 when there is none.
static __always_inline u64 offcpu_user_stack(void)
{
    struct unw_regs regs = {};
    if (unw_user_regs(0, &regs))
        return 0;
    u64 key = unw_stack(&regs);
    if (!key)
        offcpu_count(OFFCPU_STACK_ERR, 1);
    return key;
}

static __always_inline int offcpu_stack_id(void *ctx, u64 flags)
{
    int id = offcpu_stacks.get_stackid(ctx, flags);
    if (kv_stack_lost(id))
        offcpu_count(OFFCPU_STACK_ERR, 1);
    return id;
}

// The off-CPU period of `t` that ended when it came back on a CPU at `on_since`.
static __always_inline void offcpu_account(u32 tid, struct offcpu_thread *t, u64 on_since)
{
    u64 delta = on_since - t->ts;
    t->total_ns += delta;
    if (t->preempted)
        offcpu_count(OFFCPU_PREEMPTED_NS, delta);
    if (!t->sampled)
        return;

    struct offcpu_key key = {};
    key.tid = tid;
    key.user_stack = t->user_stack;
    key.kernel_stack = t->kernel_stack;
    u64 *ns = offcpu_periods.lookup(&key);
    if (ns) {
        __sync_fetch_and_add(ns, delta);
    } else {
        int err = offcpu_periods.insert(&key, &delta);
        if (err == -KV_EEXIST) {
            ns = offcpu_periods.lookup(&key);
            if (ns)
                __sync_fetch_and_add(ns, delta);
        } else if (err) {
            offcpu_count(OFFCPU_MAP_FULL, 1);
        }
    }
}

// args: (bool preempt, struct task_struct *prev, struct task_struct *next, ...);
// only the plain `preempt` flag is read, never the task structs.
RAW_TRACEPOINT_PROBE(sched_switch)
{
    u64 now = bpf_ktime_get_ns();
    int zero = 0;
    u64 *last = offcpu_last_switch.lookup(&zero);
    if (!last)
        return 0;
    u64 on_since = *last;  // when the task now leaving came on this CPU
    *last = now;

    u64 id = bpf_get_current_pid_tgid();
    if (!kv_is_target(id) || !unw_tables_ready())
        return 0;
    u32 tid = (u32)id;
    offcpu_count(OFFCPU_SWITCHES, 1);

    struct offcpu_thread fresh = {};
    struct offcpu_thread *t = offcpu_threads.lookup_or_try_init(&tid, &fresh);
    if (!t) {
        offcpu_count(OFFCPU_START_FULL, 1);
        return 0;
    }
    if (t->ts && on_since > t->ts)  // on_since is 0 before this CPU's first switch since attach
        offcpu_account(tid, t, on_since);

    t->ts = now;
    t->preempted = ctx->args[0] != 0;
    t->sampled = OFFCPU_STACK_SAMPLE <= 1 || bpf_get_prandom_u32() % OFFCPU_STACK_SAMPLE == 0;
    if (t->sampled) {
        t->user_stack = offcpu_user_stack();
        t->kernel_stack = offcpu_stack_id(ctx, 0);
    }
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_futex)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!kv_is_target(id) || !unw_tables_ready())
        return 0;
    int cmd = args->op & FUTEX_CMD_MASK;
    if (cmd != FUTEX_WAIT && cmd != FUTEX_WAIT_BITSET && cmd != FUTEX_LOCK_PI &&
        cmd != FUTEX_LOCK_PI2 && cmd != FUTEX_WAIT_REQUEUE_PI)
        return 0;
    u32 tid = (u32)id;
    struct offcpu_futex_start s = {};
    s.ts = bpf_ktime_get_ns();
    s.uaddr = (u64)args->uaddr;
    s.user_stack = offcpu_user_stack();
    if (offcpu_futex_start.update(&tid, &s))
        offcpu_count(OFFCPU_START_FULL, 1);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_futex)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!kv_is_target(id))
        return 0;
    u32 tid = (u32)id;
    struct offcpu_futex_start *s = offcpu_futex_start.lookup(&tid);
    if (!s)
        return 0;
    u64 delta = bpf_ktime_get_ns() - s->ts;
    struct offcpu_futex_key key = {};
    key.uaddr = s->uaddr;
    key.tid = tid;
    key.user_stack = s->user_stack;
    offcpu_futex_start.delete(&tid);
    if (args->ret == -KV_EAGAIN) {
        offcpu_count(OFFCPU_FUTEX_EAGAIN, 1);
        return 0;
    }
    offcpu_count(OFFCPU_FUTEX_WAITS, 1);

    struct offcpu_futex_val *v = offcpu_futex.lookup(&key);
    if (v) {
        __sync_fetch_and_add(&v->waits, 1);
        __sync_fetch_and_add(&v->ns, delta);
    } else {
        struct offcpu_futex_val one = {};
        one.waits = 1;
        one.ns = delta;
        int err = offcpu_futex.insert(&key, &one);
        if (err == -KV_EEXIST) {
            v = offcpu_futex.lookup(&key);
            if (v) {
                __sync_fetch_and_add(&v->waits, 1);
                __sync_fetch_and_add(&v->ns, delta);
            }
        } else if (err) {
            offcpu_count(OFFCPU_MAP_FULL, 1);
        }
    }
    return 0;
}
