"""On which socket a process's threads run, for collectors that sample from outside
the target (py-spy does not say on which CPU a sample ran): a thread's samples are
split in proportion to the CPUs /proc shows it on, read a few times a second."""

from __future__ import annotations

import math
import os
import threading
from collections import Counter

from kvprof.model.topology import Topology


def thread_cpus(pid: int) -> dict[int, int]:
    """tid -> the CPU each thread of `pid` last ran on (/proc/PID/task/TID/stat, field 39)."""
    out: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = int(fields[36])  # fields[0] is field 3 (state)
        except (OSError, IndexError, ValueError):
            continue
    return out


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
