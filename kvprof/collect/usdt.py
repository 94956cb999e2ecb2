"""kvcached's own `kvs` USDT probes: find them in a target, attach BPF to them,
and detach so that nothing stays raised.

Used by the three kvs collectors (locks, cachelines, requests), by `kvprof
probes`, and by the session to decide `Target.kvs_probes`.

The kernel, not kvprof, owns the probes' is-enabled semaphores. Each probe
site is attached through `perf_event_open` on the `uprobe` PMU with the
semaphore's file offset as `ref_ctr_offset` (kernel >= 4.20): the kernel
raises the semaphore when it inserts the breakpoint and lowers it when the
event's fd is closed, by us or by the kernel when kvprof dies, SIGKILL
included. So the target is left with every semaphore at 0 however kvprof ends.

BCC still writes the code that reads the probe arguments (`bpf_usdt_readarg`,
which it rewrites per probe from the name of the C function given to
`enable_probe`, so the program calls it only inside that function, never in a
shared helper). A BCC 0.26 USDT context raises the semaphores itself through
/proc/PID/mem when it is made for a PID, and refuses probes with a semaphore
when it is made for a file, so it is made for a private copy of the
executable whose notes name no semaphore: it generates the same code and
never touches the target.

bcc is imported only when a program is attached, so `kvs_probes()` and
`not_applicable()` work without it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from kvprof.collect import PROBES_DIR, CollectError
from kvprof.collect.elf import ElfFile, ProbesError, UsdtProbe, read_probes

PROVIDER = "kvs"

_NOTE = re.compile(r"Provider: (\S+)\s+Name: (\S+)")


def exe_of(pid: int) -> str:
    """The target's executable path ('' when the process is gone or not ours)."""
    try:
        return str(Path(f"/proc/{pid}/exe").readlink()).removesuffix(" (deleted)")
    except OSError:
        return ""


_KVS_PROBES: dict[tuple[int, int, int, int], list[str]] = {}  # (pid, dev, inode, mtime) -> names


def kvs_probes(pid: int) -> list[str]:
    """Names of the `kvs` provider's probes in the target's executable (from
    `readelf -n`, which reads the stapsdt notes BCC itself uses); read once per
    process and executable (a session asks for every kvs collector)."""
    try:
        st = os.stat(f"/proc/{pid}/exe")
    except OSError:
        return []
    key = (pid, st.st_dev, st.st_ino, st.st_mtime_ns)
    if key not in _KVS_PROBES:
        try:
            out = subprocess.run(
                ["readelf", "-n", f"/proc/{pid}/exe"], capture_output=True, text=True, timeout=30
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return []
        _KVS_PROBES[key] = sorted({name for provider, name in _NOTE.findall(out) if provider == PROVIDER})
    return list(_KVS_PROBES[key])


def has_kvs_probes(pid: int) -> bool:
    """Whether the target's executable carries any `kvs` probe (Target.kvs_probes)."""
    return bool(kvs_probes(pid))


def not_applicable(pid: int, probes: list[str], instead: str) -> str | None:
    """None when the target carries every one of `probes`, else a one-line reason
    naming the executable and what covers for it (`instead`)."""
    exe = exe_of(pid) or f"PID {pid}"
    if not os.path.exists(f"/proc/{pid}"):
        return f"no process {pid}"
    found = set(kvs_probes(pid))
    if not found:
        return f"no kvs probes in {exe}: {instead}"
    missing = [p for p in probes if p not in found]
    if missing:
        return f"{exe} lacks the kvs probes {', '.join(missing)}: {instead}"
    return None


def program_text(name: str) -> str:
    """The BPF C source probes/<name>.bpf.c."""
    return (PROBES_DIR / f"{name}.bpf.c").read_text()


UPROBE_PMU = Path("/sys/bus/event_source/devices/uprobe")
PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}  # syscall numbers
PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_EVENT_IOC_ENABLE = 0x2400  # _IO('$', 0)
PERF_EVENT_IOC_SET_BPF = 0x40042408  # _IOW('$', 8, u32)
ATTR_DISABLED = 1  # bit 0 of perf_event_attr's flags word


class _PerfEventAttr(ctypes.Structure):
    """struct perf_event_attr up to config2 (PERF_ATTR_SIZE_VER1, 72 bytes)."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),  # uprobe: the path
        ("config2", ctypes.c_uint64),  # uprobe: the probe's file offset
    ]


def _ref_ctr_shift() -> int:
    """Where `ref_ctr_offset` goes in the uprobe PMU's config ("config:32-63")."""
    try:
        spec = (UPROBE_PMU / "format" / "ref_ctr_offset").read_text().strip()
    except OSError:
        raise CollectError(
            "this kernel's uprobes cannot own USDT semaphores (no uprobe PMU with ref_ctr_offset; "
            "needs Linux >= 4.20): see `kvprof doctor`"
        ) from None
    return int(spec.split(":", 1)[1].split("-", 1)[0])


def _retprobe_bit() -> int:
    """The uprobe PMU's config bit that makes a uretprobe ("config:0")."""
    try:
        spec = (UPROBE_PMU / "format" / "retprobe").read_text().strip()
    except OSError:
        raise CollectError("this kernel's uprobe PMU has no retprobe (needs Linux >= 4.17)") from None
    return 1 << int(spec.split(":", 1)[1])


def attach_uprobe(
    prog_fd: int, path: str, offset: int, ref_ctr_offset: int, pid: int, retprobe: bool = False
) -> int:
    """A uprobe at file `offset` of `path`, for process `pid` only, running BPF
    program `prog_fd`; the kernel keeps the 16-bit counter at file offset
    `ref_ctr_offset` raised while the returned fd is open (0: no counter).
    `retprobe`: at the return of the function that starts there (a uretprobe)."""
    nr = PERF_EVENT_OPEN.get(platform.machine())
    if nr is None:
        raise CollectError(f"attaching uprobes is not written for {platform.machine()} yet")
    try:
        pmu_type = int((UPROBE_PMU / "type").read_text())
    except OSError:
        raise CollectError(
            "no uprobe PMU in this kernel (needs Linux >= 4.17): see `kvprof doctor`"
        ) from None
    shift = _ref_ctr_shift() if ref_ctr_offset else 0
    ret = _retprobe_bit() if retprobe else 0
    c_path = ctypes.create_string_buffer(os.fsencode(path))
    attr = _PerfEventAttr(
        type=pmu_type,
        size=ctypes.sizeof(_PerfEventAttr),
        config=(ref_ctr_offset << shift) | ret,
        sample_period=1,
        wakeup_events=1,
        flags=ATTR_DISABLED,
        config1=ctypes.addressof(c_path),
        config2=offset,
    )
    libc = ctypes.CDLL(None, use_errno=True)
    fd = int(libc.syscall(nr, ctypes.byref(attr), pid, -1, -1, PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        why = os.strerror(err)
        if err == errno.EINVAL and ref_ctr_offset:
            # The kernel keeps one semaphore offset per probe site and file: a tracer
            # that raises semaphores itself (BCC's USDT tools) attached it with another.
            why += (
                " (another tracer has a uprobe on this probe site with another semaphore offset, "
                "e.g. a BCC USDT tool: detach it first)"
            )
        raise CollectError(f"cannot attach a uprobe to {path} at 0x{offset:x} in PID {pid}: {why}")
    try:
        fcntl.ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog_fd)
        fcntl.ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)
    except OSError as e:
        os.close(fd)
        raise CollectError(f"cannot run BPF on the uprobe at 0x{offset:x} of {path}: {e.strerror}") from None
    return fd


def attach_site(prog_fd: int, elf: ElfFile, site: UsdtProbe, pid: int) -> int:
    """attach_uprobe() for one USDT site of PID's executable `elf` (read from /proc/PID/exe),
    its semaphore owned by the kernel."""
    offset = elf.file_offset(site.location)
    counter = elf.file_offset(site.semaphore) if site.semaphore else 0
    if offset is None or counter is None:
        raise CollectError(f"{site.full_name} lies outside the file's loadable segments")
    return attach_uprobe(prog_fd, str(elf.path), offset, counter, pid)


def _sites(elf: ElfFile, probes: dict[str, str], pid: int) -> list[UsdtProbe]:
    """The `kvs` sites of `probes` in the executable; CollectError for a missing one."""
    sites = [s for s in read_probes(elf) if s.provider == PROVIDER and s.name in probes]
    missing = sorted(set(probes) - {s.name for s in sites})
    if missing:
        raise CollectError(f"PID {pid} has no kvs probe {', '.join(missing)}")
    return sites


def readarg_code(elf: ElfFile, sites: list[UsdtProbe], probes: dict[str, str]) -> str:
    """BCC's `bpf_usdt_readarg` functions for `probes` (probe -> C function),
    generated from a copy of the executable whose notes name no semaphore."""
    from bcc import USDT, libbcc

    if elf.pie:
        # With several sites BCC tells them apart by address modulo the page
        # size when that is unique, else by absolute address, which a copy
        # made for a file gives unrelocated.
        page = os.sysconf("SC_PAGE_SIZE")
        for name in probes:
            pcs = [s.location for s in sites if s.name == name]
            if len(pcs) > 1 and len({pc % page for pc in pcs}) < len(pcs):
                raise CollectError(
                    f"kvs:{name} has sites that share a page offset: its arguments cannot be told apart"
                )
    data = bytearray(elf.data)
    width = 8 if elf.is64 else 4
    for site in read_probes(elf):
        if site.semaphore:
            data[site.semaphore_field : site.semaphore_field + width] = bytes(width)
    with tempfile.TemporaryDirectory(prefix="kvprof-usdt-") as tmp:
        copy = Path(tmp) / "exe"
        copy.write_bytes(bytes(data))
        usdt = USDT(path=str(copy))
        try:
            for probe, fn in probes.items():
                usdt.enable_probe(probe=f"{PROVIDER}:{probe}", fn_name=fn)
            text = usdt.get_text()
        finally:
            ctx, usdt.context = usdt.context, None  # USDT.__del__ would close it again
            if ctx is not None:
                libbcc.lib.bcc_usdt_close(ctx)
    if text is None:
        raise CollectError("BCC could not generate the code that reads the kvs probe arguments")
    return str(text.decode() if isinstance(text, bytes) else text)


class KvsProgram:
    """One collector's program on `kvs` probes of one process.

    `probes` maps probe name -> C function. `text` is the program (the code that
    reads the probe arguments, then probes/<name>.bpf.c) for a module
    (kvprof.collect.bpf); attach(bpf) attaches its functions to every site once
    the module is compiled; close() closes the uprobes (the kernel lowers the
    semaphores) and is idempotent, also for a target that died.
    """

    def __init__(self, pid: int, name: str, probes: dict[str, str]) -> None:
        self.pid = pid
        self.name = name
        self.probes = probes
        self._fds: list[int] = []
        try:
            self._elf = ElfFile(f"/proc/{pid}/exe")  # the image that runs, even if its file was replaced
            self._sites = _sites(self._elf, probes, pid)
            self.text = readarg_code(self._elf, self._sites, probes) + program_text(name)
        except (CollectError, ProbesError) as e:
            raise CollectError(f"cannot attach {name} to the kvs probes of PID {pid}: {e}") from None

    def attach(self, bpf: Any) -> None:
        from bcc import BPF

        try:
            for site in self._sites:
                prog = bpf.load_func(self.probes[site.name].encode(), BPF.KPROBE)
                self._fds.append(attach_site(prog.fd, self._elf, site, self.pid))
        except Exception as e:  # CollectError, ProbesError, BCC's load failure
            self.close()
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CollectError(
                f"cannot attach {self.name} to the kvs probes of PID {self.pid}: {why}"
            ) from None

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)  # the kernel removes the uprobe and lowers its semaphore
