"""The whole machine's CPU time, from /proc/stat's first line: what a recording
and a benchmark read to know how busy the machine was besides the target."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class CpuTimes:
    """The whole machine's CPU seconds since boot, over all its CPUs."""

    busy: float  # user, nice, system, irq, softirq
    idle: float  # idle and iowait
    steal: float  # taken by the hypervisor for other guests while we wanted to run

    @property
    def total(self) -> float:
        return self.busy + self.idle + self.steal


def cpu_times() -> CpuTimes:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    tick = os.sysconf("SC_CLK_TCK")
    return CpuTimes((user + nice + system + irq + softirq) / tick, (idle + iowait) / tick, steal / tick)
