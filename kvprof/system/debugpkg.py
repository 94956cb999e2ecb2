"""Which Debian package adds the debug info of a module (for `kvprof doctor`'s
debug-info check): glibc's is `libc6-dbg`, everything else's
`<package>-dbgsym` from the debian-debug archive, found with `dpkg -S`.
"""

from __future__ import annotations

import os
import subprocess

from kvprof.collect.procroot import DEBUG_DIR

DEBUG_ARCHIVE = "deb http://deb.debian.org/debian-debug bookworm-debug main"
DEBIAN_DEBUGINFOD = "https://debuginfod.debian.net"


def _dpkg(*args: str) -> str:
    """What dpkg-query printed (for -S, the names it found, also when it did not find all)."""
    try:
        out = subprocess.run(["dpkg-query", *args], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()


def debug_package(path: str) -> str | None:
    """The Debian package that adds debug info for the host's file at `path`
    (`libc6-dbg`, `<package>-dbgsym`), None when no package owns it."""
    real = os.path.realpath(path)
    # dpkg knows a file by the path its package shipped: /lib/... on a merged /usr
    names = dict.fromkeys(
        [path, real, *(p.removeprefix("/usr") for p in (path, real) if p.startswith("/usr/"))]
    )
    owners = [line for line in _dpkg("-S", *names).splitlines() if ": " in line]  # one read of its database
    if not owners:
        return None
    package = owners[0].split(":", 1)[0].split(",")[0].strip()
    source = _dpkg("-W", "-f=${source:Package}", package)
    return "libc6-dbg" if source == "glibc" else f"{package}-dbgsym"


def fix_debug_info(path: str, label: str, host_file: bool) -> str:
    """The command that adds debug info for the module at `path` (`label`: its name);
    `host_file`: the host has the file the target maps, so dpkg -S can name its package."""
    if not host_file:
        return f"install its debug package inside the target's container (dpkg -S {path} there names it)"
    package = debug_package(path)
    if package == "libc6-dbg":
        return "apt-get install libc6-dbg"
    if package is not None:
        return f"apt-get install {package}   (from the debian-debug archive: {DEBUG_ARCHIVE})"
    return (
        f"build {label} with -g and do not strip it, or put its debug file at "
        f"{DEBUG_DIR}/.build-id/xx/rest.debug (its build-id)"
    )


def names_for(path: str, label: str, host_file: bool) -> str:
    """What would give the module at `path` its function names: its debug package
    (fix_debug_info), or a debuginfod server that has its build-id's debug file."""
    package = " ".join(fix_debug_info(path, label, host_file).split())
    return f"{package}; or a debuginfod server in DEBUGINFOD_URLS (Debian's: {DEBIAN_DEBUGINFOD})"


def same_root(pid: int) -> bool:
    """Whether the process sees the host's root directory (not a container's)."""
    try:
        a, b = os.stat(f"/proc/{pid}/root"), os.stat("/")
    except OSError:
        return True
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
