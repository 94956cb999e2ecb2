"""What a frame is, for its colour: the target's own code, a library, the
kernel, a spot the hotspot catalog names, or a frame kvprof made up (`all`,
a thread or socket prefix, a `[lock NAME]` leaf).

Frames are bare symbol names, so which binary a function lives in is read
from the target's executable when it is still there (`nm`, its defined
functions). Without it the name decides: a leading underscore or a
well-known libc/pthread entry point means a library, anything else is taken
for the target's code.
"""

from __future__ import annotations

import os
import subprocess
from functools import lru_cache

from kvprof.analysis.hotspots import LOCK_WRAPPERS, is_wrapper, match_function, match_lock, normalize
from kvprof.model.profile import Profile

APP, LIB, KERNEL, HOTSPOT, SYNTHETIC = "app", "lib", "kernel", "hotspot", "synthetic"

# libc/pthread entry points without an underscore that show up in servers' stacks
_LIBC = frozenset(
    {
        "start_thread",
        "clone",
        "clone3",
        "epoll_wait",
        "epoll_pwait",
        "poll",
        "select",
        "read",
        "write",
        "readv",
        "writev",
        "send",
        "recv",
        "sendto",
        "recvfrom",
        "sendmsg",
        "recvmsg",
        "accept",
        "accept4",
        "malloc",
        "calloc",
        "realloc",
        "free",
        "memcpy",
        "memmove",
        "memset",
        "memcmp",
        "strlen",
        "syscall",
        "nanosleep",
        "usleep",
        "abort",
    }
)


@lru_cache(maxsize=8)
def _symbols(exe: str, mtime: float) -> frozenset[str] | None:
    try:
        out = subprocess.run(
            ["nm", "--defined-only", "-C", "-P", exe],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    names = set()
    for line in out.stdout.splitlines():
        # POSIX format: `name type value size`, size empty when unknown; a
        # demangled C++ name has spaces of its own, so split from the right
        parts = line.rsplit(" ", 3)
        if len(parts) == 4 and parts[1] in ("T", "t", "W", "w"):
            names.add(normalize(parts[0]))
    return frozenset(names) if names else None


def app_symbols(profile: Profile) -> frozenset[str] | None:
    """The functions the target's executable defines, or None when it cannot be read."""
    exe = profile.target.exe
    if not exe:
        return None
    try:
        mtime = os.stat(exe).st_mtime
    except OSError:
        return None
    return _symbols(exe, mtime)


class Classifier:
    """frame name -> kind of frame, cached per name."""

    def __init__(self, profile: Profile, synthetic_depth: int = 0) -> None:
        self.symbols = app_symbols(profile)
        self.exe_name = os.path.basename(profile.target.exe) if profile.target.exe else profile.target.comm
        self.synthetic_depth = synthetic_depth  # depths 0..N are made up (all, thread/socket prefix)
        self._cache: dict[str, str] = {}

    def __call__(self, name: str, depth: int) -> str:
        if depth <= self.synthetic_depth:
            return SYNTHETIC
        kind = self._cache.get(name)
        if kind is None:
            kind = self._cache[name] = self._classify(name)
        return kind

    def _classify(self, name: str) -> str:
        if name.endswith("_[k]"):
            return KERNEL
        if name.startswith("[lock "):
            return HOTSPOT if match_lock(name[6:-1]) else SYNTHETIC
        if name.startswith("[") and name.endswith("]"):
            return SYNTHETIC
        if match_function(name):
            return HOTSPOT
        module, plus, _ = name.partition("+0x")
        if plus:
            return APP if module == self.exe_name else LIB
        bare = normalize(name)
        if self.symbols is not None:
            return APP if bare in self.symbols else LIB
        if bare in _LIBC or bare.startswith("_") or (is_wrapper(name) and bare not in LOCK_WRAPPERS):
            return LIB
        return APP
