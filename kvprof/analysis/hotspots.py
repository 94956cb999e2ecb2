"""The catalog of known contention spots (DESIGN.md "Findings and the hotspot catalog").

Data only: each entry names the functions, lock names and kvs site names it
matches, says in plain words why the spot costs throughput, and what fixes
it. `kvprof.analysis.findings` joins the catalog with a profile's numbers.

A pattern matches a frame, lock or site name when it equals the name with
its arguments, offset and kernel marker removed, when it equals the last
`::`-separated parts of a qualified C++ name (`ObjectRegistry::onCreateItem`
matches `cb::ObjectRegistry::onCreateItem(Item const&)`), or when it is a
glob (`*stats*`) that matches the whole name. Entries are tried in order:
the first one that matches wins, so the general ones come last.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase


@dataclass(frozen=True)
class Hotspot:
    id: str
    title: str
    category: str  # cpu | lock | cacheline | offcpu: where its cost shows first
    functions: tuple[str, ...] = ()
    locks: tuple[str, ...] = ()
    sites: tuple[str, ...] = ()  # kvs atomic__sample site names
    explanation: str = ""
    fix: str = ""


CATALOG: tuple[Hotspot, ...] = (
    Hotspot(
        id="timings",
        title="shared request-timing histogram",
        category="cacheline",
        functions=("collect_timings", "mcbp_collect_timings", "Timings::collect"),
        sites=("collect_timings",),
        explanation=(
            "Every request adds its latency to one histogram that all worker threads "
            "share. Each add is an atomic write to a cache line that the other threads "
            "also write, so the line moves from core to core on almost every request and "
            "each move stalls the writer for a cache-line round trip (tens of ns on one "
            "socket, several times that across sockets). In the Couchbase study this "
            "shared histogram was one of the spots that held reads at 4-5M/s."
        ),
        fix=(
            "Give each worker thread its own histogram (padded to its own cache lines) "
            "and merge them only when `stats timings` is read; kvcached does this with "
            "--timings per-thread (or --preset fixed)."
        ),
    ),
    Hotspot(
        id="topkeys",
        title="mutex around a shared top-keys table",
        category="lock",
        functions=("update_topkeys", "TopKeys::updateKey", "TopKeys::doUpdateKey"),
        locks=("topkeys",),
        explanation=(
            "Every keyed request updates one top-keys table under one global mutex. "
            "With several worker threads they queue on that mutex: a thread that finds "
            "it held sleeps in the kernel (a futex wait) and wakes up later, so the "
            "whole server serialises on bookkeeping that no client is waiting for. "
            "Removing this mutex took the study from 4M to 5M reads/s."
        ),
        fix=(
            "Keep one top-keys table per worker thread, each with its own uncontended "
            "lock, and merge the tables when `stats topkeys` is read; or sample (count "
            "1 request in N). kvcached: --topkeys per-thread (or --preset fixed)."
        ),
    ),
    Hotspot(
        id="item-counter",
        title="global atomic item counter",
        category="cacheline",
        functions=(
            "on_create_item",
            "on_delete_item",
            "ObjectRegistry::onCreateItem",
            "ObjectRegistry::onDeleteItem",
        ),
        sites=("on_create_item", "on_delete_item"),
        explanation=(
            "Every item object created or freed (including the copy made to answer a "
            "get) adds to or subtracts from one global atomic counter. All threads "
            "write the same word, so its cache line bounces between cores on every "
            "request; a shared atomic add costs several times an uncontended one, and "
            "more again across sockets. This is `stats.numItems.fetch_add` in the "
            "study, whose removal (with the other shared atomics) took it from 5M to 7M."
        ),
        fix=(
            "Count per thread: each thread adds to its own cache-line padded slot and "
            "the slots are summed when the counter is read. kvcached: --item-counter "
            "per-thread (or --preset fixed)."
        ),
    ),
    Hotspot(
        id="memory-counter",
        title="global atomic used-memory counter",
        category="cacheline",
        functions=(
            "account_memory",
            "zmalloc",
            "zfree",
            "zrealloc",
            "zcalloc",
            "update_zmalloc_stat_alloc",
            "update_zmalloc_stat_free",
        ),
        sites=("account_memory",),
        explanation=(
            "Every allocation and free adds its size to one global used-memory counter "
            "with an atomic operation (kvcached's account_memory; Redis's zmalloc "
            "family updates `used_memory` the same way). The counter's cache line is "
            "written by every thread that allocates, so it bounces between cores on "
            "each request. For zmalloc/zfree the samples also include the allocator "
            "itself: check the cache-line numbers before blaming the counter."
        ),
        fix=(
            "Keep per-thread deltas and fold them into the global value periodically "
            "(or sum them on read); a memory limit check can use a slightly stale "
            "total. kvcached: --memory-counter per-thread (or --preset fixed)."
        ),
    ),
    Hotspot(
        id="item-lock",
        title="contended item (hash bucket) locks",
        category="lock",
        functions=("item_lock", "item_trylock"),
        locks=("item_lock",),
        explanation=(
            "Items are protected by a striped array of locks chosen by the key's hash. "
            "Waits here mean several threads touch keys in the same stripe at once: a "
            "hot key read by every thread, or too few stripes for the thread count."
        ),
        fix=(
            "Spread hot keys (more lock stripes, or replicate a very hot key), keep the "
            "critical section short (copy out, then unlock), and avoid taking the item "
            "lock for reads where a reference count or RCU-style read suffices."
        ),
    ),
    Hotspot(
        id="lru-lock",
        title="contended LRU locks",
        category="lock",
        functions=("lru_pull_tail", "do_item_bump", "do_item_update", "do_item_link_q", "do_item_unlink_q"),
        locks=("lru", "lru_lock", "lru_locks"),
        explanation=(
            "Each slab class's LRU list has one lock, and every store, eviction (and "
            "in some designs every read that bumps an item) takes it. Under a write-"
            "heavy or evicting workload the threads queue on it."
        ),
        fix=(
            "Do not move items on reads (mark them active and give them a second "
            "chance at eviction time, as memcached's segmented LRU and kvcached's "
            "CLOCK do), batch LRU maintenance in a background thread, or split the LRU."
        ),
    ),
    Hotspot(
        id="slabs-lock",
        title="contended slab allocator lock",
        category="lock",
        functions=("slabs_alloc", "slabs_free", "do_slabs_alloc", "do_slabs_free"),
        locks=("slabs", "slabs_lock"),
        explanation=(
            "The slab allocator hands out memory under one lock; every store that "
            "allocates and every free takes it."
        ),
        fix="Cache a few free chunks per thread and refill them in batches from the shared pool.",
    ),
    Hotspot(
        id="stat-mutex",
        title="mutex-protected statistic",
        category="lock",
        functions=("*stats_lock", "*_stats_lock*", "stats_*_lock*", "*STATS_LOCK*"),
        locks=("*stat*",),
        explanation=(
            "A counter or statistic is updated under a mutex that every thread takes. "
            "The statistic itself costs nothing; the lock makes every request "
            "serialise on it, and a thread that finds it held sleeps in the kernel."
        ),
        fix=(
            "Make the statistic per-thread (each thread updates its own padded copy "
            "without a lock) and sum the copies when it is read."
        ),
    ),
)

_ARGS = re.compile(r"\(.*$")
_OFFSET = re.compile(r"\+0x[0-9a-fA-F]+$")


def is_kernel(frame: str) -> bool:
    """True for a kernel frame (the folded-stack `_[k]` suffix)."""
    return frame.endswith("_[k]")


def normalize(name: str) -> str:
    """A frame, lock or site name without kernel marker, offset or arguments."""
    if name.endswith("_[k]"):
        name = name[:-4]
    name = _OFFSET.sub("", name)
    if not name.startswith("("):
        name = _ARGS.sub("", name)
    return name.strip()


# Frames that are the lock machinery itself, skipped when naming a call site.
LOCK_WRAPPERS = frozenset(
    {
        "kv_lock",
        "kv_lock_contended",
        "kv_trylock",
        "pthread_mutex_lock",
        "pthread_mutex_timedlock",
        "pthread_mutex_trylock",
        "pthread_rwlock_rdlock",
        "pthread_rwlock_wrlock",
        "pthread_cond_wait",
        "pthread_cond_timedwait",
        "pthread_spin_lock",
        "syscall",
        "futex_wait",
        "futex",
    }
)
_INTERNAL = re.compile(r"^(_+(lll|pthread|GI|futex|libc)|lll_|.*\blib(c|pthread)[.-].*\+0x)")


def is_wrapper(frame: str) -> bool:
    """True for lock/futex plumbing and unsymbolized libc frames."""
    if is_kernel(frame):
        return True
    n = normalize(frame)
    return n in LOCK_WRAPPERS or bool(_INTERNAL.match(frame)) or bool(_INTERNAL.match(n))


def call_site(frames: list[str]) -> str:
    """The leaf-most frame of a root..leaf stack that is not lock plumbing or kernel."""
    for frame in reversed(frames):
        if not is_wrapper(frame):
            return normalize(frame)
    return normalize(frames[-1]) if frames else "?"


def _matches(pattern: str, name: str) -> bool:
    if any(c in pattern for c in "*?["):
        return fnmatchcase(name, pattern)
    return name == pattern or name.endswith("::" + pattern)


def _first(names: tuple[str, ...], name: str) -> bool:
    n = normalize(name)
    return bool(n) and any(_matches(p, n) for p in names)


def match_function(frame: str) -> Hotspot | None:
    """The catalog entry whose function patterns match `frame`, if any."""
    if is_kernel(frame):
        return None
    return next((h for h in CATALOG if _first(h.functions, frame)), None)


def match_lock(name: str) -> Hotspot | None:
    """The catalog entry whose lock patterns match the lock name `name`, if any."""
    return next((h for h in CATALOG if _first(h.locks, name)), None)


def match_site(name: str) -> Hotspot | None:
    """The catalog entry whose kvs site names match `name`, if any."""
    return next((h for h in CATALOG if _first(h.sites, name)), None)


def by_id(hotspot_id: str) -> Hotspot | None:
    """The catalog entry with this id."""
    return next((h for h in CATALOG if h.id == hotspot_id), None)
