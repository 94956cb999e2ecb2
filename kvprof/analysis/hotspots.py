"""The catalog of known contention spots (docs/design.md, "Analysis"),
and the names of frames: normalized, kernel or not, lock plumbing or a call site.

The catalog is data, in hotspots.toml next to this file: each entry names
the functions, lock names and kvs site names it matches, says in plain words
why the spot costs throughput, and what fixes it. `kvprof.analysis.findings`
joins the catalog with a profile's numbers.

A pattern matches a frame, lock or site name when it equals the name with
its arguments, offset, kernel and inline markers removed, when it equals the last
`::`-separated parts of a qualified C++ name (`ObjectRegistry::onCreateItem`
matches `cb::ObjectRegistry::onCreateItem(Item const&)`), or when it is a
glob (`*stats*`) that matches the whole name. Entries are tried in order:
the first one that matches wins, so the general ones come last.
"""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from importlib import resources
from pathlib import Path
from typing import Any

from kvprof.model.profile import INLINED


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


CATALOG_FILE = Path(str(resources.files("kvprof.analysis") / "hotspots.toml"))  # package data


def load_catalog(path: Path = CATALOG_FILE) -> tuple[Hotspot, ...]:
    """The catalog's entries, in the file's order."""
    with path.open("rb") as f:
        entries = tomllib.load(f)["hotspot"]
    return tuple(Hotspot(**_tuples(e)) for e in entries)


def _tuples(entry: dict[str, Any]) -> dict[str, Any]:
    """TOML arrays are lists; a Hotspot's patterns are tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()}


CATALOG = load_catalog()

# the parameter list: not a Go method's receiver (sync.(*Mutex).Lock), nor C++'s (anonymous namespace)
_ARGS = re.compile(r"(?<!\.)\((?!anonymous namespace\)).*$")
_OFFSET = re.compile(r"\+0x[0-9a-fA-F]+$")
_CLONE_NOTE = re.compile(r"( \[clone \.[^\]]+\])+$")  # demangled C++: `f(int) [clone .isra.0]`
_CLONE_SUFFIX = re.compile(r"(\.(isra|constprop|part|cold|lto_priv)(\.\d+)?)+$")  # a C name: `f.isra.0`


def is_kernel(frame: str) -> bool:
    """True for a kernel frame (the folded-stack `_[k]` suffix)."""
    return frame.endswith("_[k]")


@functools.lru_cache(maxsize=1 << 16)  # top asks again for the same frames every interval
def normalize(name: str) -> str:
    """A frame, lock or site name without kernel or inline marker or arguments. A C++
    clone keeps its note (`Table::fingerprint [clone .isra.0]`: other code than the
    function's own) and code without a symbol its function start (`memcached+0x187a0`)."""
    if name.endswith("_[k]"):
        name = name[:-4]
    name = name.removesuffix(INLINED)
    clone = _CLONE_NOTE.search(name)
    note = clone.group(0) if clone else ""
    name = name[: clone.start()] if clone else name
    if not name.startswith("(") or name.startswith("(anonymous namespace)"):
        name = _ARGS.sub("", name)
    return name.strip() + note


@functools.lru_cache(maxsize=1 << 16)
def bare(name: str) -> str:
    """A name as the catalog's patterns are written: normalized, without a clone's
    note or suffix, a PLT stub's `@plt` or an offset (`stats_lock+0x8` is in `stats_lock`)."""
    n = _CLONE_NOTE.sub("", normalize(name)).removesuffix("@plt")
    return _CLONE_SUFFIX.sub("", _OFFSET.sub("", n))


def label(frame: str) -> str:
    """A frame as a table shows it: normalized, ` [k]` after a kernel function and
    ` [inlined]` after an inlined one."""
    return (
        normalize(frame) + (" [k]" if is_kernel(frame) else "") + (INLINED if frame.endswith(INLINED) else "")
    )


# Frames that are the lock machinery itself, skipped when naming a call site.
LOCK_WRAPPERS = frozenset(
    {
        "kv_lock",
        "kv_lock_contended",
        "kv_lock_report",
        "kv_unlock",
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


@functools.lru_cache(maxsize=1 << 16)
def is_wrapper(frame: str) -> bool:
    """True for lock/futex plumbing and unsymbolized libc frames."""
    if is_kernel(frame):
        return True
    n = bare(frame)
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
    n = bare(name)
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
