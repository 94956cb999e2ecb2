// Off-CPU samples of one thread: a task iterator that kvprof/collect/offsample.py
// runs a few times a second for each sleeping thread of the target (one
// iterator link per thread: its link info names the thread). It writes the
// user sp, ip and bp saved at the thread's entry to the kernel
// (bpf_task_pt_regs; /proc gives the system call and its arguments, and sp
// and ip say whether these registers are that call's), the system call and its
// first three arguments (orig_ax, di, si, dx: what /proc does not give for a thread
// that is runnable, not asleep) and its kernel stack (bpf_get_task_stack:
// empty while the thread runs on another CPU, as the kernel does not unwind a
// running task). It runs when kvprof reads, not at the target's switches.
//
// The user stack is walked in userspace (kvprof/collect/unwind.py, walk()):
// an iterator is not sleepable under BCC's loader, so it cannot read another
// process's memory. The task is only handed to helpers: no kernel struct is
// dereferenced (the headers may not match the running kernel).
//
// A second program, offsample_switch, times the target's futex waits on
// sched_switch, as probes/offcpu.bpf.c does but with no stack: the loader
// attaches it for short stretches only, while a thread of the target was seen
// in a lock wait lately (being on sched_switch at all costs every switch of
// the machine), clears `offsample_threads` before each, and reads and clears
// `offsample_futex` after each. A wait runs from the switch-out of a thread
// asleep in a FUTEX_WAIT-family call (prev_state not TASK_RUNNING) to its
// next time on a CPU, accounted at its next switch-out (the CPU's previous
// switch, `offsample_last_switch`, is when it came on). A stretch counts the
// waits that begin in it, whole: one in flight when it begins is not counted
// (its thread's record is cleared), and at its end the loader sets
// `offsample_closing`, under which no wait begins, and keeps the program
// attached until the waits begun are accounted (or for a bounded time).
//
// Flags: those of common.h, and -DOFFSAMPLE_KFRAMES=<n> (kernel frames kept).

#include "common.h"
#include "futex.h"

#if !defined(OFFSAMPLE_KFRAMES)
#error "compile with -DOFFSAMPLE_KFRAMES (kvprof/collect/offsample.py)"
#endif

struct seq_file;
struct task_struct;

// The context of a task iterator program and its meta (include/linux/bpf.h's
// bpf_iter__task and bpf_iter_meta, the layout every iterator program sees).
struct offsample_meta {
    struct seq_file *seq;
    u64 session_id;
    u64 seq_num;
};
struct bpf_iter__task {
    union {
        struct offsample_meta *meta;
    };
    union {
        struct task_struct *task;
    };
};

// One record per thread and run; the layout of RECORD in offsample.py.
struct offsample_rec {
    u64 sp;
    u64 ip;
    u64 bp;
    u64 orig_ax;
    u64 di;
    u64 si;
    u64 dx;
    s64 kbytes;  // bytes of kstack filled, or a negative error
    u64 kstack[OFFSAMPLE_KFRAMES];
};

BPF_PERCPU_ARRAY(offsample_scratch, struct offsample_rec, 1);

BPF_ITER(task)
{
    struct task_struct *task = ctx->task;
    if (!task)
        return 0;
    int zero = 0;
    struct offsample_rec *r = offsample_scratch.lookup(&zero);
    if (!r)
        return 0;
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    if (bpf_probe_read_kernel(&r->sp, sizeof(r->sp), &regs->sp) ||
        bpf_probe_read_kernel(&r->ip, sizeof(r->ip), &regs->ip) ||
        bpf_probe_read_kernel(&r->bp, sizeof(r->bp), &regs->bp) ||
        bpf_probe_read_kernel(&r->orig_ax, sizeof(r->orig_ax), &regs->orig_ax) ||
        bpf_probe_read_kernel(&r->di, sizeof(r->di), &regs->di) ||
        bpf_probe_read_kernel(&r->si, sizeof(r->si), &regs->si) ||
        bpf_probe_read_kernel(&r->dx, sizeof(r->dx), &regs->dx))
        return 0;
    r->kbytes = bpf_get_task_stack(task, r->kstack, sizeof(r->kstack), 0);
    bpf_seq_write(ctx->meta->seq, r, sizeof(*r));
    return 0;
}

struct offsample_thread {
    u64 ts;     // when it last left the CPU; 0 before its first switch-out in this stretch
    u64 futex;  // the futex word it went to sleep on then; 0: none
};

struct offsample_futex_key {
    u64 uaddr;
    u32 tid;
    u32 pad;
};

struct offsample_futex_val {
    u64 waits;
    u64 ns;
};

BPF_PERCPU_ARRAY(offsample_last_switch, u64, 1);  // when this CPU last switched tasks
BPF_HASH(offsample_threads, u32, struct offsample_thread, MAX_ENTRIES);
BPF_HASH(offsample_futex, struct offsample_futex_key, struct offsample_futex_val, MAX_ENTRIES);
BPF_ARRAY(offsample_closing, u32, 1);  // 1: the stretch is ending, no wait begins
BPF_ARRAY(offsample_full, u64, 1);     // waits not timed: a thread or (thread, word) did not fit its map

// args: (bool preempt, struct task_struct *prev, struct task_struct *next,
// unsigned int prev_state); only the plain values are read. Not named
// raw_tracepoint__*: the loader attaches it when it chooses, not BCC.
int offsample_switch(struct bpf_raw_tracepoint_args *ctx)
{
    u64 now = bpf_ktime_get_ns(), id = bpf_get_current_pid_tgid(), on_since = 0;
    int zero = 0;
    u32 tid = (u32)id;
    struct offsample_thread fresh = {}, *t = 0;
    u64 *last = offsample_last_switch.lookup(&zero);  // this CPU's last switch: then
    if (last) {                                        // the task now leaving came on
        on_since = *last;
        *last = now;
        if (kv_is_target(id) && !(t = offsample_threads.lookup_or_try_init(&tid, &fresh)))
            kv_add(offsample_full.lookup(&zero), 1);
    }
    if (!t)
        return 0;
    if (t->ts && t->futex && on_since > t->ts) {
        struct offsample_futex_key k = {};
        k.uaddr = t->futex;
        k.tid = tid;
        struct offsample_futex_val none = {};
        struct offsample_futex_val *v = offsample_futex.lookup_or_try_init(&k, &none);
        if (v) {  // each key holds a tid and only that thread writes it: plain adds
            v->waits += 1;
            v->ns += on_since - t->ts;
        } else {
            kv_add(offsample_full.lookup(&zero), 1);
        }
    }
    t->ts = now;
    u32 *closing = offsample_closing.lookup(&zero);
    int begins = ctx->args[0] == 0 && (u32)ctx->args[3] != TASK_RUNNING && closing && !*closing;
    t->futex = begins ? kv_futex_word() : 0;
    return 0;
}
