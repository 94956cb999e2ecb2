"""`kvprof doctor`'s debug-info check: per module of the target, where its
function names come from (kvprof.collect.debuginfo), and for a module with
only its exported symbols (`.dynsym`), the package that adds the rest: Debian
ships glibc's as `libc6-dbg`, everything else as `<package>-dbgsym` (from the
debian-debug archive), found with `dpkg -S`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kvprof.collect.debuginfo import DEBUG_DIR, ProcessSymbols, Symbols, module_symbols
from kvprof.system.doctor import KVCACHED, OK, WARN, Check, libc_of

NAME = "debug info"
DEBUG_ARCHIVE = "deb http://deb.debian.org/debian-debug bookworm-debug main"


def _dpkg(*args: str) -> str:
    try:
        out = subprocess.run(["dpkg-query", *args], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def debug_package(path: str) -> str | None:
    """The Debian package that adds debug info for the host's file at `path`
    (`libc6-dbg`, `<package>-dbgsym`), None when no package owns it."""
    real = os.path.realpath(path)
    # dpkg knows a file by the path its package shipped: /lib/... on a merged /usr
    names = dict.fromkeys(
        [path, real, *(p.removeprefix("/usr") for p in (path, real) if p.startswith("/usr/"))]
    )
    for name in names:
        owner = _dpkg("-S", name)
        if owner and ":" in owner:
            package = owner.split(":", 1)[0].split(",")[0].strip()
            source = _dpkg("-W", "-f=${source:Package}", package)
            return "libc6-dbg" if source == "glibc" else f"{package}-dbgsym"
    return None


def _fix(path: str, label: str, host_file: bool) -> str:
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


def check_module(label: str, path: str, syms: Symbols, host_file: bool) -> Check:
    """The debug-info check of one module whose symbols are `syms`; `host_file`: the
    host has the file the target maps (its own root), so dpkg -S can name its package."""
    if syms.full:
        where = f" ({syms.debug_file})" if syms.debug_file else ""
        return Check(NAME, OK, f"{label}: function names from {syms.source}{where}")
    what = f"only its exported functions (.dynsym, {len(syms.funcs):,})" if syms.funcs else "no symbols"
    return Check(
        NAME,
        WARN,
        f"{label}: no debug file and no .symtab: {what}; its internal functions show as "
        f"the exported ones around them or as {label}+0x...",
        _fix(path, label, host_file),
    )


def _same_root(pid: int) -> bool:
    try:
        a, b = os.stat(f"/proc/{pid}/root"), os.stat("/")
    except OSError:
        return True
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def check_debug_info(pid: int | None) -> list[Check]:
    """Per module of the target (-p), else of kvcached and the doctor's own libc."""
    if pid is None:
        files = [p for p in (KVCACHED, libc_of(None)) if p is not None and Path(p).is_file()]
        return [check_module(Path(p).name, str(p), module_symbols(str(p)), True) for p in files]
    process = ProcessSymbols(pid)
    if not process.refresh():
        return [
            Check(NAME, WARN, f"cannot read PID {pid}'s mappings", "kvprof doctor -p PID   (a live process)")
        ]
    host_file = _same_root(pid)
    checks: list[Check] = []
    seen: set[str] = set()
    for m in process.maps:
        if m.path.startswith("/") and "x" in m.perms and m.path not in seen:
            seen.add(m.path)
            path = m.path.removesuffix(" (deleted)")
            checks.append(check_module(m.name, path, process.module(m)[0], host_file))
    return checks
