/*
 * hold: how long one named pthread mutex is held, contended or not, from
 * uprobes on glibc's mutex calls (`kvprof record --hold LOCK`).
 *
 * Every call of the functions below in the target traps (a uprobe), whatever
 * mutex it is on; the programs keep the calls on the one lock (-DHOLD_LOCK)
 * and drop the rest:
 *   hold_on_take   pthread_mutex_lock / trylock entry: this thread asks for it
 *   hold_on_taken  their return (a uretprobe): it has it when they return 0;
 *                  the hold starts at the program's last step
 *   hold_on_wait   pthread_cond_wait / timedwait entry (the mutex is their
 *                  second argument): the wait releases it, a hold ends
 *   hold_on_woken  their return: it has it again, a hold starts
 *   hold_on_give   pthread_mutex_unlock entry: a hold ends, at the program's
 *                  first step
 * Between the two stamps the target runs the return half of the uretprobe's
 * trap and the entry half of the unlock's trap: about one uprobe hit, which
 * Python passes as -DHOLD_PROBE_NS and each hold has subtracted (a hold
 * shorter than that counts as 1 ns, and in `short`).
 *
 * One entry per thread: the holds it closed, their ns and the shortest one.
 * Python turns `hold_on` on once every uprobe is attached and off when its
 * time is up, before it detaches them: the seconds in between are the ones
 * measured (attaching and detaching uprobes takes a while).
 *
 * Flags: those of common.h, and
 *   -DHOLD_LOCK=<address>     the mutex, in the target's address space
 *   -DHOLD_PROBE_NS=<ns>      the probes' own time inside each hold
 */
#include "common.h"

#if !defined(HOLD_LOCK) || !defined(HOLD_PROBE_NS)
#error "compile with -DHOLD_LOCK and -DHOLD_PROBE_NS (kvprof/collect/hold.py)"
#endif

struct hold_val {
    u64 acquisitions;
    u64 hold_ns;
    u64 min_ns;
    u64 interrupted;  // of acquisitions, those of holds kv_interrupted() says were interrupted
    u64 interrupted_ns;  // and their hold ns
};

// hits: every program run (each one a trap in the target); short: holds shorter than the
// probes' own time; unmatched: a release with no start seen (taken before the probes came,
// or by a call not probed: timedlock, a recursive mutex's inner lock); map_full.
enum hold_counter { HOLD_HITS, HOLD_SHORT, HOLD_UNMATCHED, HOLD_MAP_FULL, HOLD_COUNTERS };

BPF_HASH(hold_asked, u32, u8, MAX_ENTRIES);      // thread -> in a lock call on the lock
BPF_HASH(hold_since, u32, u64, MAX_ENTRIES);     // thread -> when its hold started
BPF_HASH(hold_threads, u32, struct hold_val, MAX_ENTRIES);
BPF_PERCPU_ARRAY(hold_counters, u64, HOLD_COUNTERS);  // per CPU: no line of ours bounces
BPF_ARRAY(hold_on, u32, 1);  // 1 while measuring

static __always_inline void hold_count(int which)
{
    kv_add_percpu(hold_counters.lookup(&which), 1);
}

// Every program's first step: on the target, a trap counted; 0 when not measuring.
static __always_inline int hold_measuring(u64 pid_tgid)
{
    if (!kv_is_target(pid_tgid))
        return 0;
    hold_count(HOLD_HITS);
    u32 *on = hold_on.lookup(KV_IDX(0));
    return on && *on;
}

static __always_inline void hold_end(u64 now, u32 tid)
{
    u64 *since = hold_since.lookup(&tid);
    if (!since) {
        hold_count(HOLD_UNMATCHED);
        return;
    }
    u64 ns = now - *since;
    hold_since.delete(&tid);
    if (ns > HOLD_PROBE_NS) {
        ns -= HOLD_PROBE_NS;
    } else {
        ns = 1;
        hold_count(HOLD_SHORT);
    }
    struct hold_val zero = {};
    struct hold_val *v = hold_threads.lookup_or_try_init(&tid, &zero);
    if (!v) {
        hold_count(HOLD_MAP_FULL);
        return;
    }
    v->acquisitions += 1;  // one writer: the thread itself
    v->hold_ns += ns;
    if (kv_interrupted(ns, v->min_ns)) {
        v->interrupted += 1;
        v->interrupted_ns += ns;
    }
    if (v->min_ns == 0 || ns < v->min_ns)
        v->min_ns = ns;
}

static __always_inline void hold_start(u32 tid)
{
    u64 now = bpf_ktime_get_ns();
    if (hold_since.update(&tid, &now) != 0)
        hold_count(HOLD_MAP_FULL);
}

// A lock call on the lock (`mutex` its argument): its return is awaited.
static __always_inline int hold_ask(u64 pid_tgid, u64 mutex)
{
    if (mutex != HOLD_LOCK)
        return 0;
    u32 tid = pid_tgid;
    u8 one = 1;
    hold_asked.update(&tid, &one);
    return 1;
}

// At a lock call's return: whether the call was on the lock.
static __always_inline int hold_answered(u64 pid_tgid)
{
    u32 tid = pid_tgid;
    if (!hold_asked.lookup(&tid))
        return 0;
    hold_asked.delete(&tid);
    return 1;
}

int hold_on_take(struct pt_regs *ctx)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if (hold_measuring(pid_tgid))
        hold_ask(pid_tgid, PT_REGS_PARM1(ctx));
    return 0;
}

int hold_on_taken(struct pt_regs *ctx)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if (hold_measuring(pid_tgid) && hold_answered(pid_tgid) && PT_REGS_RC(ctx) == 0)
        hold_start(pid_tgid);
    return 0;
}

int hold_on_wait(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if (hold_measuring(pid_tgid) && hold_ask(pid_tgid, PT_REGS_PARM2(ctx)))
        hold_end(now, pid_tgid);
    return 0;
}

int hold_on_woken(struct pt_regs *ctx)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if (hold_measuring(pid_tgid) && hold_answered(pid_tgid))
        hold_start(pid_tgid);  // returned, timed out or not, the mutex is held again
    return 0;
}

int hold_on_give(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if (hold_measuring(pid_tgid) && PT_REGS_PARM1(ctx) == HOLD_LOCK)
        hold_end(now, pid_tgid);
    return 0;
}
