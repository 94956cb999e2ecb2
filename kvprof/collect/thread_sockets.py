"""Per-thread facts from /proc/PID/task: each thread's run delay (for offcpu), and on
which socket a process's threads run, for collectors that sample from outside the
target (py-spy does not say on which CPU a sample ran): a thread's samples are split
in proportion to the CPUs /proc shows it on, read a few times a second."""

from __future__ import annotations

import math
import os
import threading
from collections import Counter
from collections.abc import Callable

from kvprof.model.topology import Topology


def per_thread(pid: int, name: str, value: Callable[[str], int]) -> dict[int, int]:
    """tid -> `value` of each thread's /proc/PID/task/TID/`name` (a thread gone
    meanwhile, or a file that does not parse, is left out)."""
    out: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/{name}") as f:
                out[int(tid)] = value(f.read())
        except (OSError, IndexError, ValueError):
            continue
    return out


def thread_cpus(pid: int) -> dict[int, int]:
    """tid -> the CPU each thread of `pid` last ran on (stat's field 39; after the
    command's closing parenthesis the fields start at 3, the state)."""
    return per_thread(pid, "stat", lambda text: int(text.rsplit(")", 1)[1].split()[36]))


def run_delays(pid: int) -> dict[int, int]:
    """tid -> the ns each thread of `pid` has been runnable but waiting for a CPU since
    it started (schedstat's second field, the kernel's run delay)."""
    return per_thread(pid, "schedstat", lambda text: int(text.split()[1]))


class SocketTally:
    """Counts, a few times a second, on which socket each thread of `pid` is."""

    def __init__(self, pid: int, topology: Topology, interval: float = 0.2) -> None:
        self.pid, self.topology, self.interval = pid, topology, interval
        self.seen: dict[int, Counter[int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        for tid, cpu in thread_cpus(self.pid).items():
            try:
                socket = self.topology.socket_of(cpu)
            except (KeyError, IndexError, ValueError):
                continue
            self.seen.setdefault(tid, Counter())[socket] += 1

    def start(self) -> None:
        self.tick()
        self._thread = threading.Thread(target=self._run, name="kvprof-sockets", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def split(self, tid: int, samples: int) -> dict[str, int]:
        """`samples` of thread `tid` by socket, in proportion to where it was seen."""
        seen = self.seen.get(tid)
        if not seen or samples <= 0:
            return {}
        total = sum(seen.values())
        shares = {s: samples * n / total for s, n in seen.items()}
        out = {s: math.floor(v) for s, v in shares.items()}
        # largest remainders get the samples the floors left over
        for s in sorted(shares, key=lambda s: (out[s] - shares[s], s))[: samples - sum(out.values())]:
            out[s] += 1
        return {str(s): n for s, n in sorted(out.items()) if n}
