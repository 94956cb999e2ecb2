// What the target's processes do while a session watches: the processes it
// forks, the programs it execs, the threads it starts and ends. Pasted in front
// of the programs of every module of a session (kvprof/collect/follow.py), like
// unwind.h, so that BCC rewrites its map calls.
//
// With -DFOLLOW_FORKS, kv_is_target() (common.h) also keeps the processes in
// follow_tgids: the target's children and theirs, from their fork on, until
// they exec another program or exit.
//
// task:task_newtask runs in the parent, with the clone flags: a new thread
// (CLONE_THREAD) is counted, a new process is added to follow_tgids.

#include "common.h"

#ifndef KVPROF_FOLLOW_H
#define KVPROF_FOLLOW_H

#define FOLLOW_CLONE_THREAD 0x00010000
#define FOLLOW_MAX 4096

enum follow_count {
    FOLLOW_FORKS_SEEN,  // processes forked by a followed process
    FOLLOW_EXECS,       // execs by a followed process other than the target
    FOLLOW_THREADS_STARTED,
    FOLLOW_THREADS_EXITED,
    FOLLOW_TARGET_EXECS,  // execs by the target itself
    FOLLOW_COUNTS,
};

BPF_HASH(follow_tgids, u32, u32, FOLLOW_MAX);  // child tgid -> its parent's tgid
BPF_ARRAY(follow_counts, u64, FOLLOW_COUNTS);
BPF_ARRAY(follow_exec_ns, u64, 1);  // when the target exec'd (the last time)

#ifdef FOLLOW_FORKS
static __always_inline int kv_followed(u32 tgid)
{
    return follow_tgids.lookup(&tgid) != 0;
}
#endif

static __always_inline int follow_watched(u32 tgid)
{
    return tgid == TARGET_TGID || follow_tgids.lookup(&tgid) != 0;
}

TRACEPOINT_PROBE(task, task_newtask)
{
    u32 parent = bpf_get_current_pid_tgid() >> 32;
    if (!follow_watched(parent))
        return 0;
    if (args->clone_flags & FOLLOW_CLONE_THREAD) {
        kv_add(follow_counts.lookup(KV_IDX(FOLLOW_THREADS_STARTED)), 1);
        return 0;
    }
    u32 child = args->pid;
    follow_tgids.update(&child, &parent);
    kv_add(follow_counts.lookup(KV_IDX(FOLLOW_FORKS_SEEN)), 1);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (tgid == TARGET_TGID) {
        u64 now = bpf_ktime_get_ns();
        follow_exec_ns.update(KV_IDX(0), &now);
        kv_add(follow_counts.lookup(KV_IDX(FOLLOW_TARGET_EXECS)), 1);
    } else if (follow_tgids.lookup(&tgid)) {
        // another program: the target's symbols and tables do not describe it
        follow_tgids.delete(&tgid);
        kv_add(follow_counts.lookup(KV_IDX(FOLLOW_EXECS)), 1);
    }
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!follow_watched(tgid))
        return 0;
    if ((u32)id != tgid)
        kv_add(follow_counts.lookup(KV_IDX(FOLLOW_THREADS_EXITED)), 1);
    else if (tgid != TARGET_TGID)
        follow_tgids.delete(&tgid);  // its PID may be reused by anyone
    return 0;
}

#endif
