// Off-CPU samples of one thread: a task iterator that kvprof/collect/offsample.py
// runs a few times a second for each sleeping thread of the target (one
// iterator link per thread: its link info names the thread). It writes the
// user sp, ip and bp saved at the thread's entry to the kernel
// (bpf_task_pt_regs; /proc gives the system call and its arguments, and sp
// and ip say whether these registers are that call's), the system call and its
// first two arguments (orig_ax, di, si: what /proc does not give for a thread
// that is runnable, not asleep) and its kernel stack (bpf_get_task_stack:
// empty while the thread runs on another CPU, as the kernel does not unwind a
// running task). Nothing runs at the target's switches: the cost is
// the reads, when kvprof makes them.
//
// The user stack is walked in userspace (kvprof/collect/unwind.py, walk()):
// an iterator is not sleepable under BCC's loader, so it cannot read another
// process's memory. The task is only handed to helpers: no kernel struct is
// dereferenced (the headers may not match the running kernel).
//
// Flags: those of common.h, and -DOFFSAMPLE_KFRAMES=<n> (kernel frames kept).

#include "common.h"

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
        bpf_probe_read_kernel(&r->si, sizeof(r->si), &regs->si))
        return 0;
    r->kbytes = bpf_get_task_stack(task, r->kstack, sizeof(r->kstack), 0);
    bpf_seq_write(ctx->meta->seq, r, sizeof(*r));
    return 0;
}
