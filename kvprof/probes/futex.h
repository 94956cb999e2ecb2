// The futex word a thread switching out of its own accord sleeps on, from its
// user registers saved at its syscall entry: shared by probes/offcpu.bpf.c
// (every switch timed) and probes/offsample.bpf.c (its switch timer).
//
// Only the registers (bpf_task_pt_regs of the current task: it is in the
// kernel here, so its user registers are the ones saved at its entry) are
// read: no other kernel struct is dereferenced.

#ifndef KV_FUTEX_H
#define KV_FUTEX_H

// futex(2) commands that put the caller to sleep (op & FUTEX_CMD_MASK).
#define FUTEX_WAIT 0
#define FUTEX_LOCK_PI 6
#define FUTEX_WAIT_BITSET 9
#define FUTEX_WAIT_REQUEUE_PI 11
#define FUTEX_LOCK_PI2 13
#define FUTEX_CMD_MASK 127  // without FUTEX_PRIVATE_FLAG (128) and FUTEX_CLOCK_REALTIME (256)
#define SYS_FUTEX 202        // x86-64

// A task that leaves the CPU in TASK_RUNNING (0) did not go to sleep: it waits
// for a CPU, whatever sched_switch's `preempt` says (a reschedule at a
// syscall's exit is not a preemption).
#define TASK_RUNNING 0

// The futex word the current task, about to sleep, waits on (its user
// registers say it is in a FUTEX_WAIT-family call), else 0. Only the words
// needed are read, the syscall number first: most switch-outs are not futex
// waits.
static __always_inline u64 kv_futex_word(void)
{
    struct pt_regs *user = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
    u64 nr = 0, op = 0, word = 0;
    if (bpf_probe_read_kernel(&nr, sizeof(nr), &user->orig_ax) || nr != SYS_FUTEX)
        return 0;
    if (bpf_probe_read_kernel(&op, sizeof(op), &user->si) ||
        bpf_probe_read_kernel(&word, sizeof(word), &user->di))
        return 0;
    int cmd = op & FUTEX_CMD_MASK;
    if (cmd != FUTEX_WAIT && cmd != FUTEX_WAIT_BITSET && cmd != FUTEX_LOCK_PI &&
        cmd != FUTEX_LOCK_PI2 && cmd != FUTEX_WAIT_REQUEUE_PI)
        return 0;
    return word;
}

#endif
