// What every probes/*.bpf.c program shares. kvprof compiles the programs of
// one session as one BCC module (kvprof/collect/bpf.py), so each program
// prefixes its maps, types and functions with its collector's name; this
// header holds the parts they have in common.
//
// Every size and default comes from Python as a -D flag
// (CollectOptions.cflags() in kvprof/collect/__init__.py, see docs/design.md):
//   -DTARGET_TGID=<pid>    the process to keep; every other event is dropped
//   -DSTACK_STORAGE=<n>    stack ids per stack map
//   -DMAX_ENTRIES=<n>      entries per aggregation map
//   -DHIST_SLOTS=<n>       buckets of a log2 histogram
//
// No kernel struct is ever dereferenced: the headers BCC compiles against may
// not match the running kernel. Only program contexts, the user pt_regs,
// tracepoint format fields and helpers are used.

#ifndef KVPROF_COMMON_H
#define KVPROF_COMMON_H

#include <uapi/linux/ptrace.h>

#if !defined(TARGET_TGID) || !defined(STACK_STORAGE) || !defined(MAX_ENTRIES) || !defined(HIST_SLOTS) || \
    !defined(INTERRUPTED) || !defined(INTERRUPTED_MIN_NS)
#error "compile with the -D flags of CollectOptions.cflags() (kvprof/collect/__init__.py)"
#endif

#define KV_EAGAIN 11
#define KV_ENOMEM 12
#define KV_EEXIST 17

// The context of a perf-event program: the layout of the UAPI's
// struct bpf_perf_event_data on x86-64 (bpf_user_pt_regs_t is struct pt_regs),
// declared here because <uapi/linux/bpf_perf_event.h> pulls in the kernel's
// arch headers, which made a compile several times slower (docs/record.md).
struct kv_perf_event_data {
    struct pt_regs regs;
    u64 sample_period;
    u64 addr;
};

// Whether the current task belongs to the target (with -DFOLLOW_FORKS: or to a
// process it forked, follow.h).
#ifdef FOLLOW_FORKS
static __always_inline int kv_followed(u32 tgid);
#define KV_FOLLOWED(tgid) kv_followed(tgid)
#else
#define KV_FOLLOWED(tgid) 0
#endif
static __always_inline int kv_is_target(u64 pid_tgid)
{
    u32 tgid = pid_tgid >> 32;
    return tgid == TARGET_TGID || KV_FOLLOWED(tgid);
}

// Add n to a counter a map lookup returned; 0 when there was none (NULL: a
// full map, for a lookup_or_try_init). BCC cannot rewrite a map call inside a
// macro, so a program calls kv_add(its_map.lookup(KV_IDX(i)), n) itself.
static __always_inline int kv_add(u64 *counter, u64 n)
{
    if (!counter)
        return 0;
    __sync_fetch_and_add(counter, n);
    return 1;
}

// The same for a counter with one writer: a BPF_PERCPU_ARRAY's (only this CPU
// writes it) or a map value keyed by thread. A plain add does, and no cache
// line of kvprof's moves between the target's CPUs.
static __always_inline int kv_add_percpu(u64 *counter, u64 n)
{
    if (!counter)
        return 0;
    *counter += n;
    return 1;
}

/* A hold over INTERRUPTED times its thread's shortest one, or than INTERRUPTED_MIN_NS
 * when that is shorter (-D, kvprof.collect), was interrupted (its holder preempted, a
 * page fault): no lines were moving in meanwhile. The hold probes count it apart too
 * (kvprof.analysis.critical leaves it out of what moved in). */
static __always_inline int kv_interrupted(u64 ns, u64 shortest)
{
    u64 base = shortest > INTERRUPTED_MIN_NS ? shortest : INTERRUPTED_MIN_NS;
    return shortest != 0 && shortest != ~0ULL && ns > INTERRUPTED * base;
}

#define KV_IDX(i) (&(int){(i)})

// A get_stackid() result that means the stack was lost (the map is full).
static __always_inline int kv_stack_lost(int id)
{
    return id == -KV_EEXIST || id == -KV_ENOMEM;
}

// The log2 histogram bucket of v: bucket i holds [2^i, 2^(i+1)), bucket 0
// also holds 0 (kvcached's `stats timings` convention; usdt.log2_slot).
static __always_inline u32 kv_log2_slot(u64 v)
{
    u32 s = v ? bpf_log2l(v) - 1 : 0;
    return s < HIST_SLOTS ? s : HIST_SLOTS - 1;
}

#endif
