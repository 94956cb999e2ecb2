"""`kvprof doctor`: can this machine profile, and what to do when it cannot.

Each check gives a status, a finding in plain words, and for a problem the
exact command that fixes it. Statuses:

    ok    works
    info  absent, and kvprof does not need it (kprobes, the PMU, BTF)
    warn  works, but something is lost (stacks stop in libc, no USDT, ...)
    FAIL  profiling cannot work at all (no BPF, no tracefs, not privileged)

Only FAIL makes the doctor exit non-zero. The roots it reads (/proc, /sys,
/lib/modules) and the kernel release are fields of `Host`, so tests can
point the checks at fake trees.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kvprof.collect import INSTALL_BCC, PROBE_FILES, PROBES_DIR
from kvprof.collect.elf import ElfFile, ProbesError, open_process
from kvprof.collect.server_stats import TargetError
from kvprof.system.debugpkg import fix_debug_info, same_root
from kvprof.system.lab import lab_binary

if TYPE_CHECKING:
    from kvprof.collect import debuginfo

OK, INFO, WARN, FAIL = "ok", "info", "warn", "FAIL"

# Capability bits (linux/capability.h).
CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39

# (bpf, perf_event_open) syscall numbers.
_SYSCALLS = {"x86_64": (321, 298), "aarch64": (280, 241)}

# Share of sampled x86-64 function prologues with `mov %rsp,%rbp` above which a
# binary counts as built with frame pointers, and below which it has none: the
# shares measured on real binaries (docs/doctor.md, "unwind info") fall well
# clear of both. Never all: gcc's shrink-wrapping and frameless leaves leave
# some functions without one.
FP_PRESENT, FP_ABSENT = 0.5, 0.1


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    finding: str
    fix: str | None = None

    @property
    def fatal(self) -> bool:
        return self.status == FAIL


@dataclass
class Host:
    """Where the checks look; defaults are the running machine."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    modules: Path = Path("/lib/modules")
    release: str = field(default_factory=lambda: os.uname().release)
    machine: str = field(default_factory=platform.machine)
    euid: int = field(default_factory=os.geteuid)


# ---- kernel -------------------------------------------------------------------


def check_kernel(host: Host) -> Check:
    m = re.match(r"(\d+)\.(\d+)", host.release)
    version = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    what = f"{host.release} ({host.machine})"
    if version >= (4, 20):
        return Check("kernel", OK, what)
    return Check(
        "kernel",
        WARN,
        f"{what}: older than 4.20, whose uprobes can raise USDT semaphores themselves",
        "use a 5.x or newer kernel (the Vagrant VM: `vagrant up`)",
    )


def cap_eff(host: Host) -> int:
    try:
        for line in (host.proc / "self" / "status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def _paranoid(host: Host) -> str:
    try:
        return (host.proc / "sys" / "kernel" / "perf_event_paranoid").read_text().strip()
    except OSError:
        return "?"


def check_privileges(host: Host) -> Check:
    paranoid = f"perf_event_paranoid {_paranoid(host)}"
    if host.euid == 0:
        return Check("privileges", OK, f"root ({paranoid}, which does not limit root)")
    caps = cap_eff(host)
    has = {n for n, bit in (("CAP_BPF", CAP_BPF), ("CAP_PERFMON", CAP_PERFMON)) if caps >> bit & 1}
    if caps >> CAP_SYS_ADMIN & 1 or has == {"CAP_BPF", "CAP_PERFMON"}:
        return Check(
            "privileges",
            OK,
            f"uid {host.euid} with {' + '.join(sorted(has)) or 'CAP_SYS_ADMIN'} ({paranoid})",
        )
    return Check(
        "privileges",
        FAIL,
        f"uid {host.euid} without CAP_BPF and CAP_PERFMON ({paranoid}): cannot load BPF programs",
        "sudo kvprof ...   "
        "(or: sudo setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep $(readlink -f $(which python3)))",
    )


# ---- BPF, tracefs, probes -------------------------------------------------------


def _syscall(nr: int, *args: object) -> tuple[int, int]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ret = int(libc.syscall(ctypes.c_long(nr), *args))
    return ret, ctypes.get_errno()


def bpf_prog_load() -> tuple[bool, str]:
    """Load `r0 = 0; exit` as a tracepoint program through bpf(2); (loaded, why not)."""
    nrs = _SYSCALLS.get(platform.machine())
    if nrs is None:
        return False, f"no bpf syscall number known for {platform.machine()}"
    insns = (ctypes.c_uint64 * 2)(0xB7, 0x95)  # BPF_MOV64_IMM(R0, 0); BPF_EXIT_INSN()
    license = ctypes.create_string_buffer(b"GPL")
    attr = ctypes.create_string_buffer(128)
    # union bpf_attr for BPF_PROG_LOAD: prog_type, insn_cnt, insns, license
    BPF_PROG_TYPE_TRACEPOINT, BPF_PROG_LOAD = 5, 5
    ctypes.memmove(attr, (ctypes.c_uint32 * 2)(BPF_PROG_TYPE_TRACEPOINT, 2), 8)
    ctypes.memmove(
        ctypes.byref(attr, 8), (ctypes.c_uint64 * 2)(ctypes.addressof(insns), ctypes.addressof(license)), 16
    )
    fd, err = _syscall(nrs[0], ctypes.c_int(BPF_PROG_LOAD), attr, ctypes.c_uint(128))
    if fd >= 0:
        os.close(fd)
        return True, ""
    return False, f"{errno.errorcode.get(err, str(err))} ({os.strerror(err)})"


def check_bpf(host: Host) -> Check:
    loaded, why = bpf_prog_load()
    if loaded:
        return Check("BPF syscall", OK, "a tracepoint program loads")
    if why.startswith(("EPERM", "EACCES")):
        return Check("BPF syscall", FAIL, f"loading a program was refused: {why}", "sudo kvprof ...")
    return Check(
        "BPF syscall",
        FAIL,
        f"loading a program failed: {why}",
        "use a kernel built with CONFIG_BPF_SYSCALL=y (the Vagrant VM: `vagrant up`)",
    )


def check_bcc() -> Check:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "kvprof.collect.selftest"], capture_output=True, text=True, timeout=120
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as e:
        return Check("BCC", FAIL, f"the BCC self-test did not finish: {e}", INSTALL_BCC)
    if result.get("ok"):
        return Check("BCC", OK, f"BCC {result.get('bcc')} compiles, loads and attaches a tracepoint program")
    why = str(result.get("error"))
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    if errors:
        why += f"; {errors[0].strip()}"
    return Check("BCC", FAIL, why, bcc_fix(why))


def bcc_fix(why: str, base_prefix: str = sys.base_prefix, prefix: str = sys.prefix) -> str:
    """The fix for BCC's self-test failing with `why`, in the Python of `base_prefix`
    (the distribution's is /usr) and the venv (or not) at `prefix`."""
    if not why.startswith("BCC is not importable"):  # it imports, but cannot compile or load
        return f"{INSTALL_BCC} linux-headers-{os.uname().release}"
    if base_prefix != "/usr":  # pyenv's, conda's, a built one: the distribution's BCC is /usr's
        return (
            f"{INSTALL_BCC}, then kvprof in a venv of the distribution's Python: /usr/bin/python3 -m venv "
            f"--system-site-packages DIR ({base_prefix}'s Python does not see it)"
        )
    try:
        cfg = (Path(prefix) / "pyvenv.cfg").read_text()
    except OSError:  # not a venv: the distribution's Python sees its packages
        return INSTALL_BCC
    if re.search(r"^include-system-site-packages\s*=\s*true\s*$", cfg, re.M | re.I) is None:
        return f"{INSTALL_BCC}, then kvprof in a venv made with --system-site-packages ({prefix} is not)"
    return INSTALL_BCC


def check_bpf_sources() -> Check:
    """kvprof's own BPF programs and headers, package data found beside its modules."""
    missing = [name for name in PROBE_FILES if not (PROBES_DIR / name).is_file()]
    if not missing:
        return Check("BPF programs", OK, f"{len(PROBE_FILES)} files in {PROBES_DIR}")
    return Check(
        "BPF programs",
        FAIL,
        f"{len(missing)} of kvprof's files missing from {PROBES_DIR} ({', '.join(missing[:3])}"
        f"{', ...' if len(missing) > 3 else ''}): nothing can be recorded",
        "install kvprof again from its wheel, which carries them (docs/install.md)",
    )


def _mounts(host: Host) -> list[tuple[str, str]]:
    try:
        text = (host.proc / "mounts").read_text()
    except OSError:
        return []
    return [(p[2], p[1]) for p in (line.split() for line in text.splitlines()) if len(p) >= 3]


def tracefs_dir(host: Host) -> Path | None:
    mounted = {point for fstype, point in _mounts(host) if fstype == "tracefs"}
    for point in (str(host.sys / "kernel" / "tracing"), str(host.sys / "kernel" / "debug" / "tracing")):
        if point in mounted:
            return Path(point)
    return None


def check_tracefs(host: Host) -> Check:
    where = tracefs_dir(host)
    if where is not None:
        return Check("tracefs", OK, f"mounted on {where}")
    return Check(
        "tracefs",
        FAIL,
        f"not mounted on {host.sys / 'kernel' / 'tracing'}: tracepoints and uprobes cannot be attached",
        "mount -t tracefs tracefs /sys/kernel/tracing",
    )


def check_kprobes(host: Host) -> Check:
    tracing = tracefs_dir(host) or host.sys / "kernel" / "tracing"
    pmu = host.sys / "bus" / "event_source" / "devices" / "kprobe"
    if (tracing / "kprobe_events").exists() or pmu.exists():
        return Check("kprobes", OK, "available (kvprof does not use them: tracepoints and USDT only)")
    return Check(
        "kprobes",
        INFO,
        "not in this kernel; not needed: kvprof uses tracepoints and USDT probes only",
    )


def check_uprobes(host: Host) -> Check:
    tracing = tracefs_dir(host) or host.sys / "kernel" / "tracing"
    pmu = host.sys / "bus" / "event_source" / "devices" / "uprobe"
    ways = []
    if pmu.exists():
        ways.append("perf uprobe PMU")
    if (tracing / "uprobe_events").exists():
        ways.append(f"{tracing / 'uprobe_events'}")
    if ways:
        return Check("uprobes", OK, "available (" + ", ".join(ways) + "): USDT probes can be attached")
    return Check(
        "uprobes",
        WARN,
        "not in this kernel: the USDT collectors (locks, cachelines, requests) and `kvprof probes` "
        "cannot attach; CPU and off-CPU profiles still work",
        "use a kernel built with CONFIG_UPROBE_EVENTS=y (the Vagrant VM: `vagrant up`)",
    )


def check_btf(host: Host) -> Check:
    btf = host.sys / "kernel" / "btf" / "vmlinux"
    if btf.exists():
        return Check("BTF", OK, f"{btf} present")
    return Check("BTF", INFO, f"no {btf}; not needed: BCC compiles against kernel headers")


# ---- kernel headers -----------------------------------------------------------


def check_headers(host: Host) -> Check:
    build = host.modules / host.release / "build"
    fix = f"apt-get install linux-headers-{host.release}"
    if not build.exists():
        kheaders = host.sys / "kernel" / "kheaders.tar.xz"
        dangling = f" ({build} is a dangling link to {os.readlink(build)})" if build.is_symlink() else ""
        if kheaders.exists():
            return Check(
                "kernel headers",
                WARN,
                f"none in {build}{dangling}; BCC falls back to the kernel's own {kheaders}",
                fix,
            )
        return Check("kernel headers", FAIL, f"none in {build}{dangling}: BCC cannot compile programs", fix)
    target = build.resolve()
    package = target.name if target.name.startswith("linux-headers-") else None
    if package == f"linux-headers-{host.release}":
        return Check("kernel headers", OK, f"matching: {package}")
    try:
        built_for = (target / "include" / "config" / "kernel.release").read_text().strip()
    except OSError:
        built_for = ""
    if package is None and built_for == host.release:
        return Check("kernel headers", OK, f"matching: the kernel's build tree {target}")
    what = package or str(target)
    return Check(
        "kernel headers",
        OK,
        f"no package for {host.release}: {build} is linked to {what}"
        f"{f' (headers of {built_for})' if built_for else ''}. Safe: kvprof's BPF code never "
        "dereferences kernel structs (tracepoint fields and USDT arguments only)",
    )


# ---- hardware PMU ---------------------------------------------------------------


def pmu_available() -> tuple[bool, str]:
    """Open a user-space `instructions` counter on this thread; (opened, why not)."""
    nrs = _SYSCALLS.get(platform.machine())
    if nrs is None:
        return False, f"no perf_event_open number known for {platform.machine()}"
    attr = ctypes.create_string_buffer(64)  # PERF_ATTR_SIZE_VER0
    PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS = 0, 1
    ctypes.memmove(attr, (ctypes.c_uint32 * 2)(PERF_TYPE_HARDWARE, 64), 8)
    ctypes.memmove(ctypes.byref(attr, 8), (ctypes.c_uint64 * 1)(PERF_COUNT_HW_INSTRUCTIONS), 8)
    # flags at offset 40: disabled (bit 0), exclude_kernel (bit 5), exclude_hv (bit 6)
    ctypes.memmove(ctypes.byref(attr, 40), (ctypes.c_uint64 * 1)(1 | 1 << 5 | 1 << 6), 8)
    fd, err = _syscall(nrs[1], attr, ctypes.c_int(0), ctypes.c_int(-1), ctypes.c_int(-1), ctypes.c_ulong(0))
    if fd >= 0:
        os.close(fd)
        return True, ""
    return False, errno.errorcode.get(err, str(err))


def check_pmu() -> Check:
    ok, why = pmu_available()
    if ok:
        return Check("hardware PMU", OK, "instructions can be counted: `perf c2c` can run as an extra")
    return Check(
        "hardware PMU",
        INFO,
        f"none ({why} for `instructions`, as in most VMs): on-CPU sampling uses the cpu-clock "
        "software event, and cache-line bouncing is measured through the kvs probes "
        "(perf c2c cannot run)",
    )


# ---- frame pointers ---------------------------------------------------------------


def _producers(path: Path) -> list[str]:
    """DW_AT_producer of each compile unit (gcc records its flags there), [] without DWARF."""
    try:
        out = subprocess.run(
            ["readelf", "--debug-dump=info", "--dwarf-depth=1", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = re.finditer(r"DW_AT_producer\s*:\s*(?:\(indirect[^)]*\):\s*)?(.*)", out)
    return [m.group(1).strip() for m in found]


def _unit_keeps_frame_pointer(producer: str) -> bool:
    """gcc keeps frame pointers when told to, and at -O0 (the dtrace -G unit, for one)."""
    flags = producer.split()
    keep = omit = -1
    for i, flag in enumerate(flags):
        if flag == "-fno-omit-frame-pointer":
            keep = i
        elif flag == "-fomit-frame-pointer":
            omit = i
    if keep >= 0 or omit >= 0:
        return keep > omit
    return not any(re.fullmatch(r"-O(?!0$).*", flag) for flag in flags)


@dataclass(frozen=True)
class FramePointers:
    """How a binary was built, as far as stack walking is concerned."""

    verdict: str  # "yes", "no", "partial", "unknown"
    evidence: str


def frame_pointers(path: Path) -> FramePointers:
    """From gcc's recorded flags when there is DWARF, else from sampled prologues (x86-64)."""
    try:
        elf = ElfFile(path)
    except ProbesError as e:
        return FramePointers("unknown", str(e))
    if elf.section(".debug_info") is not None:
        units = [p for p in _producers(path) if p.startswith("GNU ") and not p.startswith("GNU AS")]
        if units:
            with_fp = sum(_unit_keeps_frame_pointer(p) for p in units)
            verdict = "yes" if with_fp == len(units) else "no" if with_fp == 0 else "partial"
            return FramePointers(verdict, f"gcc kept them in {with_fp} of {len(units)} compile units")
    if elf.machine != 62:  # EM_X86_64
        return FramePointers("unknown", "no DWARF producer flags, and prologues are only read on x86-64")
    funcs = [f for f in elf.functions() if f.size >= 16]
    if not funcs:
        return FramePointers("unknown", "no function symbols to sample")
    step = max(1, len(funcs) // 400)
    sample = funcs[::step]
    # `mov %rsp,%rbp` (48 89 e5) near the entry sets up a frame pointer.
    framed = sum(b"\x48\x89\xe5" in elf.read_vaddr(f.value, min(f.size, 32)) for f in sample)
    share = framed / len(sample)
    verdict = "yes" if share >= FP_PRESENT else "no" if share <= FP_ABSENT else "partial"
    return FramePointers(verdict, f"{share:.0%} of {len(sample)} function prologues set up %rbp")


def _kvcached() -> Path | None:
    """kvcached, when there is one to look at without -p."""
    try:
        return lab_binary("kvcached")
    except TargetError:
        return None


def libc_of(pid: int | None) -> Path | None:
    maps = Path(f"/proc/{pid}/maps") if pid else Path("/proc/self/maps")
    try:
        text = maps.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        path = line.split(maxsplit=5)[-1]
        if re.search(r"/libc(\.so\.6|-[\d.]+\.so)$", path):
            return Path(path)
    return None


def _modules(pid: int | None) -> list[tuple[str, Path]]:
    """(label, file) of the target's executable modules: mapped ones with -p, else kvcached and libc."""
    if pid is None:
        kvcached = _kvcached()
        found = [("kvcached", kvcached)] if kvcached is not None else []
        libc = libc_of(None)
        return found + ([(libc.name, libc)] if libc is not None else [])
    out: dict[str, tuple[str, Path]] = {}
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(None, 5)
        if len(parts) > 5 and "x" in parts[1] and parts[5].startswith("/") and parts[5] not in out:
            lo, hi = parts[0].split("-")
            out[parts[5]] = (Path(parts[5]).name, Path(f"/proc/{pid}/map_files/{lo}-{hi}"))
    return list(out.values())


def check_unwind_info(pid: int | None) -> list[Check]:
    """Per module of the target: whether kvprof's BPF stack walker has unwind
    tables for it (.eh_frame / .debug_frame), else whether frame pointers cover it."""
    from kvprof.collect.unwind import build_rows  # readelf and pyelftools, no BCC

    if pid is not None:
        try:
            open_process(pid)
            modules = _modules(pid)
        except (ProbesError, OSError) as e:
            why = str(e) if isinstance(e, ProbesError) else f"cannot read PID {pid}'s mappings ({e})"
            return [Check("unwind info", WARN, why, "kvprof doctor -p PID   (a process you may trace)")]
    else:
        modules = _modules(None)
    if not modules:
        return [Check("unwind info", INFO, "no target: give -p PID (kvcached is not built yet)")]
    checks: list[Check] = []
    for label, path in modules:
        try:
            rows = len(build_rows(str(path)))
        except Exception as e:  # not an ELF file, unreadable: say so, no traceback
            checks.append(Check("unwind info", WARN, f"{label}: cannot read it ({e.__class__.__name__})"))
            continue
        if rows:
            checks.append(
                Check("unwind info", OK, f"{label}: present ({rows:,} rows from .eh_frame/.debug_frame)")
            )
            continue
        fp = frame_pointers(path)
        if fp.verdict == "yes":
            checks.append(
                Check(
                    "unwind info", OK, f"{label}: no .eh_frame, frame pointers walked instead ({fp.evidence})"
                )
            )
        else:
            checks.append(
                Check(
                    "unwind info",
                    WARN,
                    f"{label}: neither .eh_frame/.debug_frame nor frame pointers ({fp.evidence}): "
                    "stacks through it stop there, marked [unknown]",
                    "rebuild it with unwind tables (gcc's default) or -fno-omit-frame-pointer; "
                    "kvprof record --backend perf -p PID is the fallback",
                )
            )
    return checks


# ---- debug info ---------------------------------------------------------------------


def check_module(label: str, path: str, syms: debuginfo.Symbols, host_file: bool) -> Check:
    """The debug-info check of one module whose symbols are `syms`; `host_file`: the
    host has the file the target maps (its own root), so dpkg -S can name its package."""
    if syms.full:
        where = f" ({syms.debug_file})" if syms.debug_file else ""
        return Check("debug info", OK, f"{label}: function names from {syms.source}{where}")
    what = f"only its exported functions (.dynsym, {len(syms.funcs):,})" if syms.funcs else "no symbols"
    return Check(
        "debug info",
        WARN,
        f"{label}: no debug file and no .symtab: {what}; its internal functions show as "
        f"the exported ones around them or as {label}+0xSTART (their start in its unwind table)",
        fix_debug_info(path, label, host_file),
    )


def check_debug_info(pid: int | None) -> list[Check]:
    """Per module of the target (-p), else of kvcached and the doctor's own libc: where
    its function names come from (kvprof.collect.debuginfo), and for one with only
    `.dynsym`, the package that adds the rest (kvprof.system.debugpkg)."""
    from kvprof.collect.debuginfo import ProcessSymbols, module_symbols  # pyelftools, no BCC

    if pid is None:
        files = [p for p in (_kvcached(), libc_of(None)) if p is not None and Path(p).is_file()]
        return [check_module(Path(p).name, str(p), module_symbols(str(p)), True) for p in files]
    process = ProcessSymbols(pid)
    if not process.refresh():
        why = f"cannot read PID {pid}'s mappings"
        return [Check("debug info", WARN, why, "kvprof doctor -p PID   (a live process)")]
    host_file = same_root(pid)
    checks: list[Check] = []
    seen: set[str] = set()
    for m in process.maps:
        if m.path.startswith("/") and "x" in m.perms and m.path not in seen:
            seen.add(m.path)
            path = m.path.removesuffix(" (deleted)")
            checks.append(check_module(m.name, path, process.module(m)[0], host_file))
    return checks


def check_debuginfod() -> Check:
    """Which debuginfod servers kvprof asks for the debug files of modules without names."""
    from kvprof.collect import debuginfod  # pyelftools, no BCC

    return Check("debuginfod", INFO, debuginfod.describe())


# ---- all of it ----------------------------------------------------------------------


def run_checks(pid: int | None = None, host: Host | None = None, bcc: bool = True) -> list[Check]:
    host = host or Host()
    checks = [
        check_kernel(host),
        check_privileges(host),
        check_bpf(host),
        check_tracefs(host),
        check_kprobes(host),
        check_uprobes(host),
        check_btf(host),
        check_headers(host),
        check_bpf_sources(),
    ]
    if bcc:
        checks.append(check_bcc())
    checks.append(check_pmu())
    checks.extend(check_unwind_info(pid))
    checks.extend(check_debug_info(pid))
    checks.append(check_debuginfod())
    return checks


def exit_status(checks: list[Check]) -> int:
    return 1 if any(c.fatal for c in checks) else 0


def to_json(checks: list[Check]) -> str:
    return json.dumps(
        {
            "checks": [asdict(c) for c in checks],
            "fatal": [c.name for c in checks if c.fatal],
            "exit_status": exit_status(checks),
        },
        indent=2,
    )
