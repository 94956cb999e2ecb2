"""A target's files as the target sees them, from the host: a process in a
container (another mount namespace) maps `/app/server` and `/lib/.../libc.so.6`
from its own root, which the host reaches through /proc/PID/root. A file that
is not reachable there (deleted, replaced on disk, or in a mount the host
cannot enter) is read through /proc/PID/map_files, the very file mapped.

And the target's ids in its own PID namespace (`NSpid` in /proc/PID/status):
kvprof is given and shows the host's PID, and says the target's own beside it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")

DEBUG_DIR = "/usr/lib/debug"  # where debug files are, in the host's root and a container's


class PerFile(Generic[T]):
    """What `read(path)` gives for a module's file, read once per file (device, inode,
    size, mtime: one build, wherever it is reached from) for the life of the process."""

    def __init__(self, read: Callable[[str], T]) -> None:
        self.read = read
        self._by_file: dict[tuple[int, int, int, int], T] = {}

    def __call__(self, path: str) -> T | None:
        """What the file at `path` gives; None when it cannot be reached."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key not in self._by_file:
            self._by_file[key] = self.read(path)
        return self._by_file[key]


def in_root(pid: int, path: str) -> str:
    """`path` (absolute, as the target names it) under the target's root directory."""
    return f"/proc/{pid}/root{path}"


def _holds(file: str, inode: int) -> bool:
    try:
        return not inode or os.stat(file).st_ino == inode
    except OSError:
        return False


def mapped_file(pid: int, path: str, start: int, end: int, inode: int = 0) -> str:
    """Where to read the file the target maps at [start, end) under `path`: through
    its root when that holds the same file (by inode, when known), else map_files;
    once the target is gone, the host's file of that path and inode."""
    if path.startswith("/") and not path.endswith(" (deleted)") and _holds(in_root(pid, path), inode):
        return in_root(pid, path)
    mapped = f"/proc/{pid}/map_files/{start:x}-{end:x}"
    if os.path.exists(mapped) or not path.startswith("/") or not inode or not _holds(path, inode):
        return mapped
    return path


def ns_pids(pid: int, proc: str | Path = "/proc") -> list[int]:
    """The process's PID in each PID namespace, the host's first and its own last
    ([pid] when it shares kvprof's namespace or /proc/PID/status says nothing)."""
    try:
        for line in (Path(proc) / str(pid) / "status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]] or [pid]
    except (OSError, ValueError):
        pass
    return [pid]


def ns_pid(pid: int, proc: str | Path = "/proc") -> int | None:
    """The target's PID in its own namespace, None when that is the host's."""
    ids = ns_pids(pid, proc)
    return ids[-1] if len(ids) > 1 else None
