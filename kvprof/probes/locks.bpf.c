/*
 * locks: contended lock waits of kvcached, from kvs:lock__wait__done.
 *
 * The server fires lock__wait__done for its long contended waits and a
 * sample of the short ones (paced, or 1 in its --lock-sample), once the thread released the lock
 * again, from kv_lock_report(), which kv_unlock() calls with frame pointers
 * kept: the user stack taken here names the site (update_topkeys, ...). Each
 * event counts as the `weight` waits it stands for, so the maps hold
 * estimates of every wait. One entry per (lock name, lock address, thread,
 * call-site stack); one log2 histogram of wait ns per lock name.
 *
 * Hold times come from kvs:lock__hold, a paced sample of every acquisition
 * (contended or not) fired after the release, each standing for `weight`
 * acquisitions: one entry per (lock name, lock address, thread) with the
 * acquisitions and the hold ns they stand for, the samples behind them and
 * the shortest sampled hold.
 *
 * Flags: those of common.h.
 */
#include "common.h"

#define LOCKS_NAME_LEN 16

struct locks_key {
    char name[LOCKS_NAME_LEN];
    u64 lock;
    u32 tid;
    s32 stack_id;
};

struct locks_val {
    u64 waits;
    u64 wait_ns;
    u64 max_ns;
};

struct locks_hist_key {
    char name[LOCKS_NAME_LEN];
    u32 slot;
};

enum locks_counter { LOCKS_EVENTS, LOCKS_MAP_FULL, LOCKS_STACK_ERRORS, LOCKS_COUNTERS };

struct locks_hold_key {
    char name[LOCKS_NAME_LEN];
    u64 lock;
    u32 tid;
};

struct locks_hold_val {
    u64 acquisitions;
    u64 hold_ns;
    u64 samples;
    u64 min_ns;
    u64 interrupted;  // of acquisitions, those of holds kv_interrupted() says were interrupted
    u64 interrupted_ns;  // and their hold ns
};

BPF_HASH(locks_waits, struct locks_key, struct locks_val, MAX_ENTRIES);
BPF_HASH(locks_holds, struct locks_hold_key, struct locks_hold_val, 4096);
BPF_HASH(locks_hist, struct locks_hist_key, u64, 4096);
BPF_STACK_TRACE(locks_stacks, STACK_STORAGE);
BPF_PERCPU_ARRAY(locks_counters, u64, LOCKS_COUNTERS);  // per CPU: no line of ours bounces

static __always_inline void locks_count(int which)
{
    kv_add_percpu(locks_counters.lookup(&which), 1);
}

int locks_on_wait_done(struct pt_regs *ctx)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if (!kv_is_target(pid_tgid))
        return 0;
    u64 lock = 0, name = 0, ns = 0;
    int sampled = 1;  // an int: BCC reads an argument only into a variable of its size
    bpf_usdt_readarg(1, ctx, &lock);
    bpf_usdt_readarg(2, ctx, &name);
    bpf_usdt_readarg(3, ctx, &ns);
    bpf_usdt_readarg(4, ctx, &sampled);
    u64 weight = sampled > 0 ? sampled : 1;
    locks_count(LOCKS_EVENTS);

    struct locks_key k = {};
    bpf_probe_read_user_str(k.name, sizeof(k.name), (void *)name);
    k.lock = lock;
    k.tid = (u32)pid_tgid;
    k.stack_id = locks_stacks.get_stackid(ctx, BPF_F_USER_STACK);
    if (k.stack_id < 0)
        locks_count(LOCKS_STACK_ERRORS);

    struct locks_val zero = {};
    struct locks_val *v = locks_waits.lookup_or_try_init(&k, &zero);
    if (!v) {
        locks_count(LOCKS_MAP_FULL);
        return 0;
    }
    __sync_fetch_and_add(&v->waits, weight);
    __sync_fetch_and_add(&v->wait_ns, ns * weight);
    /* racy max: two threads on one key may both store; the larger wins
     * almost always, and one key is one thread, so it never races. */
    if (ns > v->max_ns)
        v->max_ns = ns;

    struct locks_hist_key hk = {};
    __builtin_memcpy(hk.name, k.name, sizeof(hk.name));
    hk.slot = kv_log2_slot(ns);
    u64 one = 0;
    if (!kv_add(locks_hist.lookup_or_try_init(&hk, &one), weight))
        locks_count(LOCKS_MAP_FULL);
    return 0;
}

int locks_on_hold(struct pt_regs *ctx)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if (!kv_is_target(pid_tgid))
        return 0;
    /* read here, not in a helper shared with locks_on_wait_done: BCC turns each
     * bpf_usdt_readarg into the reader of the probe enabled on the calling function */
    u64 lock = 0, name = 0, ns = 0;
    int sampled = 1;
    bpf_usdt_readarg(1, ctx, &lock);
    bpf_usdt_readarg(2, ctx, &name);
    bpf_usdt_readarg(3, ctx, &ns);
    bpf_usdt_readarg(4, ctx, &sampled);
    u64 weight = sampled > 0 ? sampled : 1;
    locks_count(LOCKS_EVENTS);

    struct locks_hold_key k = {};
    bpf_probe_read_user_str(k.name, sizeof(k.name), (void *)name);
    k.lock = lock;
    k.tid = (u32)pid_tgid;
    struct locks_hold_val zero = {};
    zero.min_ns = ~0ULL;
    struct locks_hold_val *v = locks_holds.lookup_or_try_init(&k, &zero);
    if (!v) {
        locks_count(LOCKS_MAP_FULL);
        return 0;
    }
    __sync_fetch_and_add(&v->acquisitions, weight);
    __sync_fetch_and_add(&v->hold_ns, ns * weight);
    __sync_fetch_and_add(&v->samples, 1);
    if (kv_interrupted(ns, v->min_ns)) {  /* one key is one thread: its own shortest */
        __sync_fetch_and_add(&v->interrupted, weight);
        __sync_fetch_and_add(&v->interrupted_ns, ns * weight);
    }
    if (ns < v->min_ns)  /* one key is one thread: no race */
        v->min_ns = ns;
    return 0;
}
