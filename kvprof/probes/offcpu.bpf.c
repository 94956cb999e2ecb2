// Off-CPU time and futex waits of one process, both from sched_switch.
//
// Loaded by kvprof/collect/offcpu.py. Flags: those of common.h, the
// -DUNWIND_* bounds of unwind.h (user stacks walked from unwind tables), and
//   -DOFFCPU_STACK_SAMPLE=<n>   take the stacks of 1 in n switch-outs (random)
//   -DOFFCPU_WALK_BUDGET=<b>    0: n stays; else n follows the switch-out rate
//                               so that each CPU walks about b stacks per pace
//                               epoch (2^OFFCPU_PACE_SHIFT ns); n is the start
//   -DOFFCPU_PACE_SHIFT=<s>     a pace epoch is 2^s ns
//
// Walking two stacks at every switch-out of a thread that blocks per batch
// (epoll_wait) was the single largest cost of an attached kvprof, and a
// fixed 1 in n still walked a busy server's stacks hundreds of times a
// second, each walk stalling the CPU's switch (the figures are in
// docs/record.md). So every off-CPU period is timed (per-thread totals are
// exact), but its stacks are taken for a random 1 in n of them only; n is
// drawn from the switch-outs this CPU saw in its last epoch, before the
// period it decides on, and the period is weighted by the n it was drawn
// with: `offcpu_periods` holds an unbiased estimate of every period's ns.
//
// Futex waits come from the same program, not from the futex syscall
// tracepoints: enabling any syscall tracepoint sends every syscall of every
// task on the machine through the kernel's slow path, and a contended mutex
// makes futex calls far more often than the thread switches. A thread that
// switches out of its own accord while in a FUTEX_WAIT-family call (its user
// registers, saved at syscall entry, say so: orig_ax, di = the futex word,
// si = the operation) starts a futex wait; the off-CPU period is the wait.
// A wait that returned without sleeping (EAGAIN, or woken first) costs the
// thread no time and is not counted; nor is a switch-out of a thread still
// runnable in the call (prev_state TASK_RUNNING: preempted in it, or
// rescheduled on its way out of the syscall, its registers still saying
// futex): that is a wait for a CPU, counted as the thread's `[runnable]` time. Each (word, thread) is counted exactly
// in `offcpu_futex`; its stacks, in `offcpu_futex_stacks`, for the sampled
// periods and for the first wait of each (word, thread), so a rare lock is
// named too: the loader spreads the exact totals over them.
//
// Only plain raw-tracepoint arguments, the user pt_regs (bpf_task_pt_regs:
// the task is in the kernel here, so its user registers are the ones saved at
// its entry) and helpers are used: no other kernel struct is ever
// dereferenced (the headers may not match the running kernel).
//
// sched_switch is taken as a raw tracepoint and runs in the task switching
// out, so only the current task is ever looked at: a thread's off-CPU period
// runs from its switch-out to when it came back on a CPU, which is that CPU's
// previous switch (`last_switch`), and is accounted at its next switch-out.
// Threads of other processes cost one per-CPU store.

#include "common.h"
#include "unwind.h"
#include "futex.h"

#ifndef OFFCPU_STACK_SAMPLE
#error "compile with -DOFFCPU_STACK_SAMPLE=<n>"
#endif
#ifndef OFFCPU_WALK_BUDGET
#error "compile with -DOFFCPU_WALK_BUDGET=<b>"
#endif
#ifndef OFFCPU_PACE_SHIFT
#error "compile with -DOFFCPU_PACE_SHIFT=<s>"
#endif

// Why a period's stacks were taken: the random 1 in OFFCPU_STACK_SAMPLE draw
// (off-CPU and futex stacks), or a futex word's first wait by the thread
// (its futex stack only: the off-CPU estimate stays unbiased).
#define OFFCPU_SAMPLED_RANDOM 1
#define OFFCPU_SAMPLED_FIRST_WAIT 2

// Index order is the loader's HEALTH tuple.
enum offcpu_health {
    OFFCPU_SWITCHES,          // target threads switched out
    OFFCPU_STACK_ERR,         // get_stackid -EEXIST or -ENOMEM, or a user stack that did not fit in `ustacks`
    OFFCPU_MAP_FULL,          // a key did not fit in an aggregation map
    OFFCPU_START_FULL,        // a thread's record did not fit
    OFFCPU_PREEMPTED_NS,      // off-CPU ns that began with the thread still runnable (preempted, rescheduled)
    OFFCPU_FUTEX_WAITS,       // futex waits that slept
    OFFCPU_DRAWN,             // switch-outs whose stacks the random draw took
    OFFCPU_HEALTH,
};

// One per target thread, only ever written by that thread (at its own
// switch-out), so its fields are updated in place without atomics.
struct offcpu_thread {
    u64 ts;        // when it last left the CPU; 0 before its first switch-out
    u64 total_ns;  // off-CPU time of every period accounted so far
    u64 runnable_ns;  // ... of the periods that began with it still runnable
    u64 user_stack;  // key in `ustacks`, 0: none
    s32 kernel_stack;
    u16 preempted;
    u16 sampled;  // stacks were taken for the period that began at ts: OFFCPU_SAMPLED_*
    u32 weight;   // OFFCPU_SAMPLED_RANDOM: the n of its draw (1 in n); else 1
    u64 futex;       // the futex word the period waits on; 0: not a futex wait
    u64 last_futex;  // the word of its last futex wait (its first wait on a word takes a stack)
};

struct offcpu_key {
    u32 tid;
    s32 kernel_stack;
    u64 user_stack;
};

struct offcpu_futex_key {
    u64 uaddr;
    u32 tid;
    u32 pad;
};

struct offcpu_futex_stack_key {
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
BPF_HASH(offcpu_futex, struct offcpu_futex_key, struct offcpu_futex_val, MAX_ENTRIES);  // exact
BPF_HASH(offcpu_futex_stacks, struct offcpu_futex_stack_key, struct offcpu_futex_val, MAX_ENTRIES);
BPF_PERCPU_ARRAY(offcpu_health, u64, OFFCPU_HEALTH);

// Per CPU: the target's switch-outs in the current pace epoch, and the n the
// last epoch's count gave (0: none yet, OFFCPU_STACK_SAMPLE applies).
struct offcpu_pace {
    u64 epoch;
    u32 count;
    u32 n;
};
BPF_PERCPU_ARRAY(offcpu_pace, struct offcpu_pace, 1);

static __always_inline void offcpu_count(int what, u64 n)
{
    kv_add_percpu(offcpu_health.lookup(&what), n);
}

// The current task's user stack, from the user registers saved at its entry
// to the kernel, as a key in `ustacks`; 0 when there is none.
static __always_inline u64 offcpu_user_stack(void)
{
    struct unw_regs regs = {};
    if (unw_user_regs(0, &regs) || !regs.ip)
        return 0;
    u64 key = unw_stack(&regs);
    if (!key)
        offcpu_count(OFFCPU_STACK_ERR, 1);
    return key;
}

// The n of this switch-out's 1-in-n draw: the last epoch's, or more once this
// epoch has had more switch-outs than that one (a target busy all at once
// after a quiet epoch would otherwise have every switch-out walked for an
// epoch). Both are known before the period they decide on, so weighing the
// period by n stays unbiased. An epoch with no switch-out of the target
// leaves the n of the last one that had some.
static __always_inline u32 offcpu_one_in(u64 now)
{
    if (!OFFCPU_WALK_BUDGET)
        return OFFCPU_STACK_SAMPLE;
    int zero = 0;
    struct offcpu_pace *p = offcpu_pace.lookup(&zero);
    if (!p)
        return OFFCPU_STACK_SAMPLE;
    u32 budget = OFFCPU_WALK_BUDGET;
    u64 epoch = now >> OFFCPU_PACE_SHIFT;
    if (p->epoch != epoch) {
        if (p->count) {
            u32 n = p->count / budget;
            p->n = n ? n : 1;
        }
        p->epoch = epoch;
        p->count = 0;
    }
    p->count += 1;
    u32 n = p->n ? p->n : OFFCPU_STACK_SAMPLE;
    u32 so_far = p->count / budget;
    return n > so_far ? n : so_far;
}

static __always_inline int offcpu_stack_id(void *ctx, u64 flags)
{
    int id = offcpu_stacks.get_stackid(ctx, flags);
    if (kv_stack_lost(id))
        offcpu_count(OFFCPU_STACK_ERR, 1);
    return id;
}

// Add one wait of `ns` to a futex map's value, as lookup_or_try_init gave it
// (BCC cannot pass a map to a function); NULL: the map is full. Every key of
// the maps below holds a tid and only that thread's switch-outs write it, so
// plain adds suffice.
static __always_inline void offcpu_add_wait(struct offcpu_futex_val *v, u64 ns)
{
    if (!v) {
        offcpu_count(OFFCPU_MAP_FULL, 1);
        return;
    }
    v->waits += 1;
    v->ns += ns;
}

// The off-CPU period of `t` that ended when it came back on a CPU at `on_since`.
static __always_inline void offcpu_account(u32 tid, struct offcpu_thread *t, u64 on_since)
{
    u64 delta = on_since - t->ts;
    t->total_ns += delta;
    if (t->preempted) {
        t->runnable_ns += delta;
        offcpu_count(OFFCPU_PREEMPTED_NS, delta);
    }
    struct offcpu_futex_val zero = {};
    if (t->futex) {
        offcpu_count(OFFCPU_FUTEX_WAITS, 1);
        struct offcpu_futex_key fk = {};
        fk.uaddr = t->futex;
        fk.tid = tid;
        offcpu_add_wait(offcpu_futex.lookup_or_try_init(&fk, &zero), delta);
    }
    if (!t->sampled)
        return;
    u64 weighted = delta * t->weight;
    if (t->futex) {
        struct offcpu_futex_stack_key sk = {};
        sk.uaddr = t->futex;
        sk.user_stack = t->user_stack;
        sk.tid = tid;
        offcpu_add_wait(offcpu_futex_stacks.lookup_or_try_init(&sk, &zero), weighted);
    }
    if (t->sampled != OFFCPU_SAMPLED_RANDOM)
        return;

    struct offcpu_key key = {};
    key.tid = tid;
    key.user_stack = t->user_stack;
    key.kernel_stack = t->kernel_stack;
    u64 *ns = offcpu_periods.lookup(&key);
    if (ns)
        *ns += weighted;
    else if (offcpu_periods.insert(&key, &weighted))
        offcpu_count(OFFCPU_MAP_FULL, 1);
}

// args: (bool preempt, struct task_struct *prev, struct task_struct *next,
// unsigned int prev_state); only the plain `preempt` flag and `prev_state` are
// read, never the task structs (TASK_RUNNING: futex.h).
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
    t->preempted = ctx->args[0] != 0 || (u32)ctx->args[3] == TASK_RUNNING;
    t->futex = t->preempted ? 0 : kv_futex_word();
    // a wait for a CPU has no place to wait at: its time is the thread's [runnable], no stack taken
    u32 n = t->preempted ? 0 : offcpu_one_in(now);
    int drawn = !t->preempted && (n <= 1 || bpf_get_prandom_u32() % n == 0);
    t->sampled = drawn ? OFFCPU_SAMPLED_RANDOM : 0;
    t->weight = drawn ? n : 1;
    if (drawn)
        offcpu_count(OFFCPU_DRAWN, 1);
    if (!t->sampled && t->futex && t->futex != t->last_futex) {
        struct offcpu_futex_key fk = {};
        fk.uaddr = t->futex;
        fk.tid = tid;
        if (!offcpu_futex.lookup(&fk))
            t->sampled = OFFCPU_SAMPLED_FIRST_WAIT;
    }
    if (t->futex)
        t->last_futex = t->futex;
    if (t->sampled) {
        t->user_stack = offcpu_user_stack();
        t->kernel_stack = offcpu_stack_id(ctx, 0);
    }
    return 0;
}
