"""On-CPU stacks from `perf` instead of BPF (`kvprof record --backend perf`): the
on-CPU collector the session picks under that backend.

For machines where BPF programs cannot load, and the way to get stacks
through code without frame pointers (Debian's libc): `--call-graph dwarf`
copies a slice of each sampled thread's stack and unwinds it afterwards.

It samples system-wide (`-a`) and keeps the target's samples when reading
them back: per-task cpu-clock events (`perf record -p PID`) deliver no samples
on the 6.18 guest with perf 6.1, and they cost the target more than per-CPU
events anyway (docs/record.md, on `--backend perf`, has both measurements).
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from kvprof.collect import CollectError, CollectOptions, programs
from kvprof.model.profile import CpuStack, Profile, Target, ThreadInfo
from kvprof.model.topology import Topology

_HEADER = re.compile(r"^\s*(?P<comm>.*?)\s+(?P<pid>\d+)/(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]")
_FRAME = re.compile(r"^\s+(?P<ip>[0-9a-f]+)\s+(?P<sym>.*?)\s+\((?P<dso>.*)\)\s*$")


class PerfError(CollectError):
    """perf is missing or failed; the message says what to do."""


Namer = Callable[[int, str], str | None]  # (ip, dso) -> a name


def _frame(ip: str, sym: str, dso: str, unnamed: Namer | None = None) -> str:
    kernel = dso.startswith("[kernel") or dso.endswith(".ko")
    name = re.sub(r"\+0x[0-9a-f]+$", "", sym)
    if name in ("[unknown]", ""):
        # user code without a symbol: its function's start, as the BPF collectors name it
        known = unnamed(int(ip, 16), dso) if unnamed is not None and not kernel else None
        name = known or f"{os.path.basename(dso) if dso and dso != '[unknown]' else '0x' + ip}+0x{ip}"
    return name + ("_[k]" if kernel else "")


def user_names(pid: int) -> Namer | None:
    """What names the target's user addresses without a symbol (kvprof.collect.debuginfo:
    `module+0xSTART`), None once it is gone or without pyelftools."""
    try:
        from kvprof.collect.debuginfo import ProcessSymbols
    except ImportError:
        return None
    names = ProcessSymbols(pid)
    if not names.refresh():
        return None

    def name(ip: int, dso: str) -> str | None:
        # perf gives the address in the target, or in the module when it had no symbol there
        return names.function_name(ip) or names.module_function_name(dso, ip)

    return name


def parse_script(
    text: str, pid: int, topology: Topology, unnamed: Namer | None = None
) -> tuple[list[CpuStack], dict[str, ThreadInfo]]:
    """`perf script -F comm,pid,tid,cpu,ip,sym,dso` output -> the target's stacks and
    threads; `unnamed` names a user address perf has no symbol for."""
    stacks: Counter[tuple[int, tuple[str, ...]]] = Counter()
    threads: dict[str, ThreadInfo] = {}
    current: tuple[int, str, int] | None = None  # tid, comm, cpu
    frames: list[str] = []

    def flush() -> None:
        if current is not None:
            tid, comm, cpu = current
            stacks[(tid, tuple(reversed(frames)))] += 1
            info = threads.setdefault(str(tid), ThreadInfo(name=comm))
            info.cpu_samples += 1
            socket = str(topology.socket_of(cpu))
            info.sockets[socket] = info.sockets.get(socket, 0) + 1

    for line in text.splitlines():
        if not line.strip():
            flush()
            current, frames = None, []
            continue
        frame = _FRAME.match(line)
        if frame and current is not None:
            frames.append(_frame(frame["ip"], frame["sym"], frame["dso"], unnamed))
            continue
        header = _HEADER.match(line)
        if header:
            flush()
            frames = []
            current = (
                (int(header["tid"]), header["comm"], int(header["cpu"]))
                if int(header["pid"]) == pid
                else None
            )
    flush()
    return [CpuStack(tid=t, frames=list(f), count=n) for (t, f), n in stacks.most_common()], threads


class PerfCollector:
    """The on-CPU collector under `--backend perf` (the session picks it): `perf record
    -a --call-graph dwarf` over the recording window, stopped with SIGINT at the end and
    read back then (reads_once: perf writes its samples as it goes, but unwinding them
    takes `perf script` seconds, done once)."""

    name = "oncpu"
    reads_once = True

    def __init__(self, pid: int, opts: CollectOptions) -> None:
        self.pid, self.opts = pid, opts
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._result: tuple[list[CpuStack], dict[str, ThreadInfo]] | None = None

    def applies(self) -> str | None:
        return None

    def start(self, timeout: float = 30.0) -> None:
        """Returns once perf samples. Its events start disabled (-D -1) and are enabled
        through its control fifo, acknowledged on the other one: with -a perf first reads
        every process's maps, a second or more on a busy machine, sampling nothing yet."""
        perf = _perf()
        self._dir = tempfile.TemporaryDirectory(prefix="kvprof-perf-")
        data, log = self._files()
        ctl, ack = Path(self._dir.name) / "ctl", Path(self._dir.name) / "ack"
        os.mkfifo(ctl)
        os.mkfifo(ack)
        self._proc = programs.start(
            [perf, "record", "-q", "-e", "cpu-clock", "-F", str(self.opts.hz), "-a", "--call-graph", "dwarf",
             "-D", "-1", "--control", f"fifo:{ctl},{ack}", "-o", str(data)],
            log,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        acks = os.open(ack, os.O_RDONLY | os.O_NONBLOCK)  # perf's open of it waits for a reader
        try:
            control = None
            while control is None:
                try:
                    control = os.open(ctl, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until perf has it open
                except OSError:
                    self._waiting(deadline, log)
            os.write(control, b"enable\n")
            os.close(control)
            reply = b""
            while b"ack" not in reply:
                ready, _, _ = select.select([acks], [], [], 0.05)
                got = os.read(acks, 64) if ready else b""
                reply += got
                if not got:
                    self._waiting(deadline, log)
        finally:
            os.close(acks)

    def _waiting(self, deadline: float, log: Path) -> None:
        """A pause while perf starts; PerfError once it has exited or the deadline passed."""
        assert self._proc is not None
        if self._proc.poll() is not None or time.monotonic() > deadline:
            programs.stop(self._proc, 5)
            first = (log.read_text(errors="replace").strip().splitlines() or ["no output"])[0]
            raise PerfError(f"perf record failed: {first}")
        time.sleep(0.02)

    def _files(self) -> tuple[Path, Path]:
        assert self._dir is not None
        return Path(self._dir.name) / "perf.data", Path(self._dir.name) / "perf.log"

    def contribute(self, profile: Profile) -> None:
        """Stops perf (once) and puts the target's stacks in `profile.oncpu`."""
        if self._result is None and self._proc is not None:
            programs.stop(self._proc, 60)
            data, _ = self._files()
            script = subprocess.run(
                [_perf(), "script", "-i", str(data), "-F", "comm,pid,tid,cpu,ip,sym,dso"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if script.returncode != 0:
                first = (script.stderr.strip().splitlines() or ["no output"])[0]
                raise PerfError(f"perf script failed: {first}")
            self._result = parse_script(script.stdout, self.pid, self.opts.topology, user_names(self.pid))
        if self._result is None:
            return
        stacks, threads = self._result
        profile.oncpu = list(stacks)
        profile.threads.update(threads)
        profile.status.collectors["oncpu"] = "ok (perf backend)"

    def close(self) -> None:
        if self._proc is not None:
            programs.stop(self._proc, 10)
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def _perf() -> str:
    perf = shutil.which("perf")
    if perf is None:
        raise PerfError("perf not found: install linux-perf (Debian) or linux-tools-$(uname -r) (Ubuntu)")
    return perf


def record(
    pid: int, duration: float, hz: int, topology: Topology
) -> tuple[list[CpuStack], dict[str, ThreadInfo]]:
    """The target's stacks and threads over the next `duration` seconds (PerfCollector on its own)."""
    collector = PerfCollector(pid, CollectOptions(hz=hz, topology=topology))
    profile = Profile(target=Target(pid=pid))
    try:
        collector.start()
        time.sleep(duration)
        collector.contribute(profile)
    finally:
        collector.close()
    return profile.oncpu, profile.threads
