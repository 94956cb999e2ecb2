// On-CPU stacks of one process, sampled by per-CPU cpu-clock perf events.
//
// Loaded by kvprof/collect/oncpu.py. oncpu_sample runs at every sample of the
// target taken by the module's cpu-clock events, one per CPU (clock.bpf.c;
// per-task events cost far more on a server that context-switches per
// request, see docs/design.md). Flags: those of
// common.h, and the -DUNWIND_* bounds of unwind.h (user stacks unwound from
// unwind tables).

#include "common.h"
#include "unwind.h"

// Health counters (per CPU, summed by the loader). Index order is the
// loader's HEALTH tuple.
enum oncpu_health {
    ONCPU_SAMPLES,           // samples of the target
    ONCPU_USER_STACK_ERR,    // the user stack did not fit in `ustacks`
    ONCPU_KERNEL_STACK_ERR,
    ONCPU_MAP_FULL,          // a new (tid, cpu, stacks) key did not fit in `counts`
    ONCPU_COMM_FULL,         // a thread name did not fit in `comms`
    ONCPU_HEALTH,
};

struct oncpu_key {
    u32 tid;
    u32 cpu;
    s32 kernel_stack;  // < 0: no kernel stack (-EFAULT when sampled in user mode)
    u64 user_stack;    // key in `ustacks`; 0: no user stack
};

struct oncpu_comm {
    char name[16];
};

BPF_HASH(oncpu_counts, struct oncpu_key, u64, MAX_ENTRIES);
BPF_STACK_TRACE(oncpu_stacks, STACK_STORAGE);
// Last name seen per thread, so a thread that exits before the loader reads
// /proc still has one.
BPF_HASH(oncpu_comms, u32, struct oncpu_comm, MAX_ENTRIES);
BPF_PERCPU_ARRAY(oncpu_health, u64, ONCPU_HEALTH);

// Returns the sample's user stack key (0: none), for regsample (clock.bpf.c).
static __always_inline u64 oncpu_sample(struct kv_perf_event_data *ctx, u64 id)
{
    if (!unw_tables_ready())
        return 0;

    struct oncpu_key key = {};
    key.tid = (u32)id;
    key.cpu = bpf_get_smp_processor_id();
    struct unw_regs regs = {};
    if (unw_user_regs(&ctx->regs, &regs) == 0)
        key.user_stack = unw_stack(&regs);
    key.kernel_stack = oncpu_stacks.get_stackid(ctx, 0);
    kv_add_percpu(oncpu_health.lookup(KV_IDX(ONCPU_SAMPLES)), 1);
    if (!key.user_stack)
        kv_add_percpu(oncpu_health.lookup(KV_IDX(ONCPU_USER_STACK_ERR)), 1);
    if (kv_stack_lost(key.kernel_stack))
        kv_add_percpu(oncpu_health.lookup(KV_IDX(ONCPU_KERNEL_STACK_ERR)), 1);

    u64 *n = oncpu_counts.lookup(&key);
    if (n) {
        __sync_fetch_and_add(n, 1);
    } else {
        u64 one = 1;
        int err = oncpu_counts.insert(&key, &one);
        if (err == -KV_EEXIST) {
            // Another CPU added the key between our lookup and insert.
            kv_add(oncpu_counts.lookup(&key), 1);
        } else if (err) {
            kv_add_percpu(oncpu_health.lookup(KV_IDX(ONCPU_MAP_FULL)), 1);
        }
    }

    struct oncpu_comm comm = {};
    bpf_get_current_comm(&comm.name, sizeof(comm.name));
    if (oncpu_comms.update(&key.tid, &comm))
        kv_add_percpu(oncpu_health.lookup(KV_IDX(ONCPU_COMM_FULL)), 1);
    return key.user_stack;
}
