"""What the machine is doing: CPU time of a process, of the whole machine,
time stolen by the hypervisor, and waiting for an idle machine.

A benchmark on a shared machine needs to know how much of the CPU it got;
these readings go with every run.
"""

from __future__ import annotations

import os
import platform
import resource
import time
from collections.abc import Callable

from kvprof.collect.cpustat import cpu_times

# --wait-idle: a run starts when the machine was IDLE_THRESHOLD idle for
# IDLE_WINDOW_S, or after IDLE_TIMEOUT_S anyway.
IDLE_THRESHOLD = 0.9
IDLE_WINDOW_S = 0.5
IDLE_TIMEOUT_S = 120.0


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # after the command name: state is field 3, utime 14 and stime 15 (1-based)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_run_ns(pid: int) -> int:
    """ns its threads ran on a CPU, from each /proc/PID/task/TID/schedstat (finer than
    process_cpu_s's clock ticks, for windows of a fraction of a second); threads that
    end meanwhile drop out."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended
    return total


def idle_share(seconds: float) -> float:
    """The share of the machine's CPU time that was idle over the next `seconds`
    (time stolen by the hypervisor counts as busy: it was not ours to use)."""
    a = cpu_times()
    time.sleep(seconds)
    b = cpu_times()
    return (b.idle - a.idle) / max(b.total - a.total, 1e-9)


def wait_idle(
    say: Callable[[str], None], threshold: float = IDLE_THRESHOLD, timeout: float = IDLE_TIMEOUT_S
) -> float:
    """Wait until the machine was `threshold` idle for IDLE_WINDOW_S; returns that idle share."""
    deadline = time.monotonic() + timeout
    idle = idle_share(IDLE_WINDOW_S)
    if idle < threshold:
        say(f"waiting for the machine to be {threshold:.0%} idle (now {idle:.0%})...")
    while idle < threshold and time.monotonic() < deadline:
        idle = idle_share(IDLE_WINDOW_S)
    if idle < threshold:
        say(f"still only {idle:.0%} idle after {timeout:.0f} s: running anyway")
    return idle


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's reaped children (load generators)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def host_metadata() -> dict[str, str | int | float]:
    """What describes the machine, in pyperf's metadata names where it has them."""
    meta: dict[str, str | int | float] = {"cpu_count": os.cpu_count() or 1, "platform": platform.platform()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    meta["cpu_model_name"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return meta
