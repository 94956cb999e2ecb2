// Off-CPU time and futex waits of one process.
//
// Loaded by kvprof/collect/offcpu.py with:
//   -DTARGET_TGID=<pid>       the process to keep; everything else is dropped here
//   -DSTACK_STORAGE=<n>       stack ids per stack map
//   -DMAX_ENTRIES=<n>         entries per aggregation map
//
// Only tracepoint format fields and helpers are used: no kernel struct is
// ever dereferenced (the headers may not match the running kernel).
//
// sched_switch's prev_pid/next_pid are thread ids. The tgid filter uses
// bpf_get_current_pid_tgid(), which at this tracepoint is the task switching
// out; the task switching in is recognised by its tid being in `left`, where
// only the target's threads are ever put.

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
    H_STACK_ERR,         // get_stackid -EEXIST or -ENOMEM
    H_MAP_FULL,          // a key did not fit in an aggregation map
    H_START_FULL,        // a thread's start record did not fit
    H_PREEMPTED_NS,      // off-CPU ns that began with the thread still runnable (preempted)
    H_FUTEX_WAITS,
    H_FUTEX_EAGAIN,      // wait calls that returned at once (the word had changed): not counted as waits
    H_COUNT,
};

struct left_t {
    u64 ts;
    s32 user_stack;
    s32 kernel_stack;
    u32 preempted;
};

struct off_key_t {
    u32 tid;
    s32 user_stack;
    s32 kernel_stack;
};

struct futex_start_t {
    u64 ts;
    u64 uaddr;
    s32 user_stack;
};

struct futex_key_t {
    u64 uaddr;
    u32 tid;
    s32 user_stack;
};

struct futex_val_t {
    u64 waits;
    u64 ns;
};

BPF_STACK_TRACE(stacks, STACK_STORAGE);
BPF_HASH(left, u32, struct left_t, MAX_ENTRIES);         // tid -> when and where it left the CPU
BPF_HASH(offcpu, struct off_key_t, u64, MAX_ENTRIES);    // -> ns
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

static __always_inline int stack_id(void *ctx, u64 flags)
{
    int id = stacks.get_stackid(ctx, flags);
    if (id == -KV_EEXIST || id == -KV_ENOMEM)
        add_health(H_STACK_ERR, 1);
    return id;
}

TRACEPOINT_PROBE(sched, sched_switch)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();

    if ((id >> 32) == TARGET_TGID) {
        u32 tid = (u32)id;
        struct left_t l = {};
        l.ts = now;
        l.user_stack = stack_id(args, BPF_F_USER_STACK);
        l.kernel_stack = stack_id(args, 0);
        l.preempted = args->prev_state == 0;  // TASK_RUNNING: it did not block
        add_health(H_SWITCHES, 1);
        if (left.update(&tid, &l))
            add_health(H_START_FULL, 1);
    }

    u32 next = args->next_pid;
    struct left_t *l = left.lookup(&next);
    if (!l)
        return 0;
    u64 delta = now - l->ts;
    struct off_key_t key = {};
    key.tid = next;
    key.user_stack = l->user_stack;
    key.kernel_stack = l->kernel_stack;
    if (l->preempted)
        add_health(H_PREEMPTED_NS, delta);
    left.delete(&next);

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
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_futex)
{
    u64 id = bpf_get_current_pid_tgid();
    if ((id >> 32) != TARGET_TGID)
        return 0;
    int cmd = args->op & FUTEX_CMD_MASK;
    if (cmd != FUTEX_WAIT && cmd != FUTEX_WAIT_BITSET && cmd != FUTEX_LOCK_PI &&
        cmd != FUTEX_LOCK_PI2 && cmd != FUTEX_WAIT_REQUEUE_PI)
        return 0;
    u32 tid = (u32)id;
    struct futex_start_t s = {};
    s.ts = bpf_ktime_get_ns();
    s.uaddr = (u64)args->uaddr;
    s.user_stack = stack_id(args, BPF_F_USER_STACK);
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
