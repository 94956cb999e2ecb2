// On-CPU stacks of one process, sampled by per-CPU cpu-clock perf events.
//
// Loaded by kvprof/collect/oncpu.py, which attaches on_sample to one
// cpu-clock event per CPU (per-task events cost far more on a server that
// context-switches per request, see DESIGN.md) and passes:
//   -DTARGET_TGID=<pid>       the process to keep; every other sample is dropped here
//   -DSTACK_STORAGE=<n>       stack ids per stack map
//   -DMAX_ENTRIES=<n>         entries of the count map
//   -I probes                 for unwind.h (user stacks unwound from unwind tables)
//
// Only perf-event context, the user pt_regs and helpers are used: no kernel
// struct is ever dereferenced, because the headers BCC compiles against may
// not match the running kernel.

#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>

#ifndef TARGET_TGID
#error "compile with -DTARGET_TGID=<pid>"
#endif
#ifndef STACK_STORAGE
#define STACK_STORAGE 16384
#endif
#ifndef MAX_ENTRIES
#define MAX_ENTRIES 10240
#endif

#include "unwind.h"

#define KV_EEXIST 17
#define KV_ENOMEM 12

// Health counters (per CPU, summed by the loader). Index order is the
// loader's HEALTH tuple.
enum health {
    H_SAMPLES,           // samples of the target
    H_USER_STACK_ERR,    // the user stack did not fit in `ustacks`
    H_KERNEL_STACK_ERR,
    H_MAP_FULL,          // a new (tid, cpu, stacks) key did not fit in `counts`
    H_COMM_FULL,         // a thread name did not fit in `comms`
    H_COUNT,
};

struct key_t {
    u32 tid;
    u32 cpu;
    s32 kernel_stack;  // < 0: no kernel stack (-EFAULT when sampled in user mode)
    u64 user_stack;    // key in `ustacks`; 0: no user stack
};

struct comm_t {
    char name[16];
};

BPF_HASH(counts, struct key_t, u64, MAX_ENTRIES);
BPF_STACK_TRACE(stacks, STACK_STORAGE);
// Last name seen per thread, so a thread that exits before the loader reads
// /proc still has one.
BPF_HASH(comms, u32, struct comm_t, MAX_ENTRIES);
BPF_PERCPU_ARRAY(health, u64, H_COUNT);

static __always_inline void count(int what)
{
    int idx = what;
    u64 *v = health.lookup(&idx);
    if (v)
        (*v)++;
}

static __always_inline int stack_failed(int id)
{
    return id == -KV_EEXIST || id == -KV_ENOMEM;
}

int on_sample(struct bpf_perf_event_data *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if ((id >> 32) != TARGET_TGID || !unw_tables_ready())
        return 0;

    struct key_t key = {};
    key.tid = (u32)id;
    key.cpu = bpf_get_smp_processor_id();
    struct unw_regs regs = {};
    if (unw_user_regs(&ctx->regs, &regs) == 0)
        key.user_stack = unw_stack(&regs);
    key.kernel_stack = stacks.get_stackid(ctx, 0);
    count(H_SAMPLES);
    if (!key.user_stack)
        count(H_USER_STACK_ERR);
    if (stack_failed(key.kernel_stack))
        count(H_KERNEL_STACK_ERR);

    u64 *n = counts.lookup(&key);
    if (n) {
        __sync_fetch_and_add(n, 1);
    } else {
        u64 one = 1;
        int err = counts.insert(&key, &one);
        if (err == -KV_EEXIST) {
            // Another CPU added the key between our lookup and insert.
            n = counts.lookup(&key);
            if (n)
                __sync_fetch_and_add(n, 1);
        } else if (err) {
            count(H_MAP_FULL);
        }
    }

    struct comm_t comm = {};
    bpf_get_current_comm(&comm.name, sizeof(comm.name));
    if (comms.update(&key.tid, &comm))
        count(H_COMM_FULL);
    return 0;
}
