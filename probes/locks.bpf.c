/*
 * locks: contended lock waits of kvcached, from kvs:lock__wait__done.
 *
 * The server fires lock__wait__done only on the contended path (the trylock
 * failed), inside kv_lock_contended(), which its call site calls with frame
 * pointers kept: the user stack taken here names the site (update_topkeys,
 * ...). One entry per (lock name, lock address, thread, call-site stack);
 * one log2 histogram of wait ns per lock name.
 *
 * cflags: -DTARGET_PID=<tgid>, -DSTACK_STORAGE=<stack ids>,
 *         -DMAX_ENTRIES=<entries per map>
 */
#include <uapi/linux/ptrace.h>

#define NAME_LEN 16
#define HIST_SLOTS 64

struct lock_key {
    char name[NAME_LEN];
    u64 lock;
    u32 tid;
    s32 stack_id;
};

struct lock_val {
    u64 waits;
    u64 wait_ns;
    u64 max_ns;
};

struct hist_key {
    char name[NAME_LEN];
    u32 slot;
};

enum counter { C_EVENTS, C_MAP_FULL, C_STACK_ERRORS, C_COUNTERS };

BPF_HASH(waits, struct lock_key, struct lock_val, MAX_ENTRIES);
BPF_HASH(hist, struct hist_key, u64, 4096);
BPF_STACK_TRACE(stacks, STACK_STORAGE);
BPF_ARRAY(counters, u64, C_COUNTERS);

static __always_inline void count(int which)
{
    u64 *c = counters.lookup(&which);
    if (c)
        __sync_fetch_and_add(c, 1);
}

/* bucket i holds [2^i, 2^(i+1)); bucket 0 also holds 0 */
static __always_inline u32 slot_of(u64 v)
{
    u32 s = v ? bpf_log2l(v) - 1 : 0;
    return s < HIST_SLOTS ? s : HIST_SLOTS - 1;
}

int on_wait_done(struct pt_regs *ctx)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if ((pid_tgid >> 32) != TARGET_PID)
        return 0;
    u64 lock = 0, name = 0, ns = 0;
    bpf_usdt_readarg(1, ctx, &lock);
    bpf_usdt_readarg(2, ctx, &name);
    bpf_usdt_readarg(3, ctx, &ns);
    count(C_EVENTS);

    struct lock_key k = {};
    bpf_probe_read_user_str(k.name, sizeof(k.name), (void *)name);
    k.lock = lock;
    k.tid = (u32)pid_tgid;
    k.stack_id = stacks.get_stackid(ctx, BPF_F_USER_STACK);
    if (k.stack_id < 0)
        count(C_STACK_ERRORS);

    struct lock_val zero = {};
    struct lock_val *v = waits.lookup_or_try_init(&k, &zero);
    if (!v) {
        count(C_MAP_FULL);
        return 0;
    }
    __sync_fetch_and_add(&v->waits, 1);
    __sync_fetch_and_add(&v->wait_ns, ns);
    /* racy max: two threads on one key may both store; the larger wins
     * almost always, and one key is one thread, so it never races. */
    if (ns > v->max_ns)
        v->max_ns = ns;

    struct hist_key hk = {};
    __builtin_memcpy(hk.name, k.name, sizeof(hk.name));
    hk.slot = slot_of(ns);
    u64 one = 0;
    u64 *h = hist.lookup_or_try_init(&hk, &one);
    if (h)
        __sync_fetch_and_add(h, 1);
    else
        count(C_MAP_FULL);
    return 0;
}
