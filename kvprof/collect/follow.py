"""What the target's processes did while a session watched (probes/follow.h):
processes forked, programs exec'd, threads started and ended; and, with
--follow-forks, the forked processes kept in every collector's filter.

follow.h is pasted in front of the programs of every module a session compiles
(kvprof.collect.bpf.Module); the session reads the first module's maps. A fork
is followed from the moment it happens until the child execs another program
(whose symbols and unwind tables are not the target's) or exits; the probes
attached to the target's own executable (the kvs USDT probes) stay the
target's. When the target itself execs, the session ends the recording there
(kvprof.collect.session): the new program's symbols and probes are not loaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kvprof.collect import PROBES_DIR, CollectOptions

FOLLOW_H = PROBES_DIR / "follow.h"
COUNTS = ("forks", "execs", "threads_started", "threads_exited", "target_execs")  # enum follow_count


def text() -> str:
    return FOLLOW_H.read_text()


def cflags(opts: CollectOptions) -> list[str]:
    return ["-DFOLLOW_FORKS"] if opts.follow_forks else []


@dataclass
class Events:
    """Counts since the module was loaded (COUNTS), the target's exec time (ns,
    CLOCK_MONOTONIC; 0: it did not exec) and the followed processes alive now."""

    counts: dict[str, int]
    exec_ns: int = 0
    children: tuple[int, ...] = ()


def read(module: Any) -> Events:
    """What `module`'s follow.h maps hold now."""
    counts = module.table("follow_counts")
    values = {name: int(counts[counts.Key(i)].value) for i, name in enumerate(COUNTS)}
    exec_ns = int(module.table("follow_exec_ns")[module.table("follow_exec_ns").Key(0)].value)
    children = tuple(sorted(int(k.value) for k in module.table("follow_tgids")))
    return Events(values, exec_ns, children)


def target_execd(module: Any) -> bool:
    """Whether the target exec'd since the module was loaded (one map lookup)."""
    table = module.table("follow_exec_ns")
    return bool(table[table.Key(0)].value)


def exec_reason(pid: int, elapsed: float) -> str:
    """The line that ends a recording whose target exec'd."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = "another program"
    return (
        f"the target (PID {pid}) exec'd {exe} after {elapsed:.1f} s: the recording ends there "
        "(the new program's symbols and probes are not loaded; record it again to profile it)"
    )


def notes(events: Events, base: Events | None, follow: bool) -> list[str]:
    """What happened in the window, one line each: forks (and whether they were
    followed), children's execs, threads started and ended."""
    n = {k: v - (base.counts[k] if base else 0) for k, v in events.counts.items()}
    out = []
    if n["forks"]:
        out.append(
            f"the target forked {n['forks']:,} process(es) during the recording: "
            + (
                "followed, their samples are in the profile under their own thread ids"
                if follow
                else "not followed (record with --follow-forks to include them)"
            )
        )
    if follow and n["execs"]:
        out.append(f"{n['execs']:,} forked process(es) exec'd another program: not followed after their exec")
    if n["threads_started"] or n["threads_exited"]:
        out.append(
            f"threads came and went: {n['threads_started']:,} started, {n['threads_exited']:,} exited "
            "during the recording (an exited thread keeps its samples; its name may be missing)"
        )
    return out
