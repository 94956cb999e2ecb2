"""On-CPU stacks from `perf` instead of BPF (`kvprof record --backend perf`).

For machines where BPF programs cannot load, and the way to get stacks
through code without frame pointers (Debian's libc): `--call-graph dwarf`
copies a slice of each sampled thread's stack and unwinds it afterwards.

It samples system-wide (`-a`) and keeps the target's samples when reading
them back: per-task cpu-clock events (`perf record -p PID`) deliver no samples
on this kernel (6.18 guest, perf 6.1; measured), and they cost more than
per-CPU events anyway (DESIGN.md: 18 % of throughput at 999 Hz).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from kvprof.model.profile import CpuStack, ThreadInfo
from kvprof.model.topology import Topology

_HEADER = re.compile(r"^\s*(?P<comm>.*?)\s+(?P<pid>\d+)/(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]")
_FRAME = re.compile(r"^\s+(?P<ip>[0-9a-f]+)\s+(?P<sym>.*?)\s+\((?P<dso>.*)\)\s*$")


class PerfError(Exception):
    """perf is missing or failed; the message says what to do."""


def _frame(ip: str, sym: str, dso: str) -> str:
    kernel = dso.startswith("[kernel") or dso.endswith(".ko")
    name = re.sub(r"\+0x[0-9a-f]+$", "", sym)
    if name in ("[unknown]", ""):
        name = f"{os.path.basename(dso) if dso and dso != '[unknown]' else '0x' + ip}+0x{ip}"
    return name + ("_[k]" if kernel else "")


def parse_script(text: str, pid: int, topology: Topology) -> tuple[list[CpuStack], dict[str, ThreadInfo]]:
    """`perf script -F comm,pid,tid,cpu,ip,sym,dso` output -> the target's stacks and threads."""
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
            frames.append(_frame(frame["ip"], frame["sym"], frame["dso"]))
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


def record(
    pid: int, duration: float, hz: int, topology: Topology
) -> tuple[list[CpuStack], dict[str, ThreadInfo]]:
    perf = shutil.which("perf")
    if perf is None:
        raise PerfError("perf not found: install linux-perf (Debian) or linux-tools-$(uname -r) (Ubuntu)")
    with tempfile.TemporaryDirectory(prefix="kvprof-perf-") as tmp:
        data = Path(tmp) / "perf.data"
        rec = subprocess.run(
            [perf, "record", "-q", "-e", "cpu-clock", "-F", str(hz), "-a", "--call-graph", "dwarf",
             "-o", str(data), "--", "sleep", f"{duration:g}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if rec.returncode != 0 or not data.exists():
            first = (rec.stderr.strip().splitlines() or ["no output"])[0]
            raise PerfError(f"perf record failed: {first}")
        script = subprocess.run(
            [perf, "script", "-i", str(data), "-F", "comm,pid,tid,cpu,ip,sym,dso"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if script.returncode != 0:
            first = (script.stderr.strip().splitlines() or ["no output"])[0]
            raise PerfError(f"perf script failed: {first}")
    return parse_script(script.stdout, pid, topology)
