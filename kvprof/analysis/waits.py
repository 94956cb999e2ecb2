"""What a wait is, from the stack it was taken at: a lock's acquisition, an idle wait, or other.

A futex is the kernel's one primitive under mutexes, condition variables,
joins, semaphores and Go's scheduler, so a futex wait says nothing by itself;
the frames that entered it do. Walking a root..leaf stack from the leaf, the
first frame that belongs to one of the sets below decides:

- LOCK_PATH: a lock's acquisition (glibc's `__lll_lock_wait` under
  `pthread_mutex_lock`, its rwlocks, `std::mutex`, Go's `lock2`, Rust's
  futex mutex): the thread waits for a lock another thread holds. Only these
  futex waits are lock waits (the LOCKS table, the futex findings).
- IDLE_WAITS: the thread waits for work or for time, by design (condition
  variables, `pthread_join`, semaphores, barriers, epoll/poll/select, accept,
  sleeps, sigwait, Go's park): never a lock, never "blocked".

glibc's shared futex helpers (`__futex_abstimed_wait_common`, `futex_wait`)
belong to neither: a condition variable, a join and an rwlock all reach
them, so their callers decide. The leaf-most frame decides because a
condition wait that re-takes its mutex after the wake-up (`__lll_lock_wait`
under `__pthread_cond_wait_common`) does wait for that mutex.
"""

from __future__ import annotations

import functools
import re
from typing import Literal

from kvprof.analysis.hotspots import normalize

Kind = Literal["lock", "idle", "other"]

# Frames of a lock's acquisition path: a futex wait under one of them waits for the lock.
LOCK_PATH = frozenset(
    {
        "__lll_lock_wait",
        "__lll_lock_wait_private",
        "__lll_clocklock_wait",
        "__lll_timedlock_wait",
        "pthread_mutex_lock",
        "__pthread_mutex_lock",
        "___pthread_mutex_lock",
        "__pthread_mutex_lock_full",
        "pthread_mutex_timedlock",
        "pthread_mutex_clocklock",
        "__pthread_mutex_clocklock_common",
        "__pthread_mutex_cond_lock",
        "__pthread_mutex_cond_lock_full",
        "pthread_rwlock_rdlock",
        "pthread_rwlock_wrlock",
        "pthread_rwlock_timedrdlock",
        "pthread_rwlock_timedwrlock",
        "pthread_rwlock_clockrdlock",
        "pthread_rwlock_clockwrlock",
        "__pthread_rwlock_rdlock_full64",
        "__pthread_rwlock_wrlock_full64",
        "__pthread_rwlock_rdlock",
        "__pthread_rwlock_wrlock",
        "mtx_lock",
        "mtx_timedlock",
        "std::mutex::lock",
        "std::timed_mutex::lock",
        "std::shared_mutex::lock",
        "std::shared_mutex::lock_shared",
        "runtime.lock",
        "runtime.lock2",
        "runtime.lockWithRank",
        "sync.(*Mutex).lockSlow",
        "sync.(*RWMutex).Lock",
        "sync.(*RWMutex).RLock",
    }
)
# ... and by pattern (C++ and Rust paths, whatever their namespace or generic arguments).
_LOCK_PATTERN = re.compile(
    r"(::lock_contended$|::lock_slow$|^std::.*mutex.*::lock(_shared)?$|::RawMutex::lock)"
)

# Waits for work or for time, by design: never a lock, never "blocked".
IDLE_WAITS = frozenset(
    {
        "epoll_wait",
        "epoll_pwait",
        "epoll_pwait2",
        "do_epoll_wait",
        "ep_poll",
        "poll",
        "ppoll",
        "__poll",
        "select",
        "pselect",
        "pselect6",
        "__select",
        "accept",
        "accept4",
        "nanosleep",
        "clock_nanosleep",
        "__clock_nanosleep",
        "usleep",
        "sleep",
        "pause",
        "sigwait",
        "sigwaitinfo",
        "sigtimedwait",
        "__sigtimedwait",
        "io_getevents",
        "io_uring_enter",
        "pthread_cond_wait",
        "pthread_cond_timedwait",
        "pthread_cond_clockwait",
        "__pthread_cond_wait",
        "___pthread_cond_wait",
        "__pthread_cond_timedwait",
        "___pthread_cond_timedwait",
        "__pthread_cond_timedwait64",
        "__pthread_cond_clockwait",
        "__pthread_cond_clockwait64",
        "__pthread_cond_wait_common",
        "cnd_wait",
        "cnd_timedwait",
        "std::condition_variable::wait",
        "pthread_join",
        "__pthread_join",
        "___pthread_join",
        "__pthread_clockjoin_ex",
        "pthread_timedjoin_np",
        "pthread_clockjoin_np",
        "thrd_join",
        "sem_wait",
        "sem_timedwait",
        "sem_clockwait",
        "__new_sem_wait",
        "__new_sem_wait_slow64",
        "__new_sem_clockwait",
        "__sem_wait",
        "pthread_barrier_wait",
        "___pthread_barrier_wait",
        "std::thread::join",
        "runtime.notesleep",
        "runtime.notetsleep",
        "runtime.notetsleepg",
        "runtime.gopark",
        "runtime.park_m",
        "runtime.stopm",
        "runtime.mPark",
        "runtime.netpoll",
    }
)


@functools.lru_cache(maxsize=1 << 16)
def frame_kind(frame: str) -> Kind:
    """ "lock", "idle" or "other" for one frame."""
    # glibc's internal aliases (`__GI___lll_lock_wait`) and symbol versions name the same function
    n = normalize(frame).split("@")[0].removeprefix("__GI_")
    if n in LOCK_PATH or _LOCK_PATTERN.search(n):
        return "lock"
    if n in IDLE_WAITS:
        return "idle"
    return "other"


def wait_kind(frames: list[str]) -> Kind:
    """What a wait taken at this root..leaf stack is: its leaf-most frame of a lock's
    acquisition path or of an idle wait decides; "other" when it has neither."""
    for frame in reversed(frames):
        kind = frame_kind(frame)
        if kind != "other":
            return kind
    return "other"


def is_lock_wait(frames: list[str]) -> bool:
    """True for a futex wait entered from a lock's acquisition path."""
    return wait_kind(frames) == "lock"


def is_idle(frames: list[str]) -> bool:
    """True for a wait for work or time (condition variable, join, epoll, sleep, ...)."""
    return wait_kind(frames) == "idle"
