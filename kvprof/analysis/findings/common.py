"""What every findings rule shares: the thresholds, the window's context, severity and words."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kvprof.analysis.hotspots import Hotspot
from kvprof.analysis.tables import seconds
from kvprof.model.profile import Finding, Profile

SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Thresholds:
    """Where a measurement becomes info, warning or critical (docs/report.md)."""

    # kvs locks: waiting as a share of the waiting threads' wall time, or ms per s of recording
    lock_critical_share: float = 0.05
    lock_critical_ms_per_s: float = 100.0
    lock_warning_share: float = 0.005
    lock_warning_ms_per_s: float = 5.0
    # cache lines written by two or more threads: transfers per second, scaled by the
    # sample rate, cross-socket ones counted `cross_socket_weight` times
    line_critical_per_s: float = 100_000.0
    line_warning_per_s: float = 10_000.0
    line_info_per_s: float = 100.0
    cross_socket_weight: float = 3.5
    transfer_ns: float = (
        57.0  # one same-socket cache-line round trip, measured (docs/design.md, "Measured numbers")
    )
    # a pthread mutex handed to a thread asleep in the futex wait, measured by
    # `atomics --mode handoff --hold-ns 10000` (docs/findings.md, "Ceilings"): from the
    # unlock to the sleeper holding it, and the unlocker's own time in that waking unlock
    handoff_ns: float = 25_000.0
    wake_ns: float = 9_600.0
    # a catalog function: share of all CPU samples with it anywhere on the stack
    hotspot_cpu_critical: float = 0.25
    hotspot_cpu_warning: float = 0.10
    hotspot_cpu_info: float = 0.01
    # any other function: share of all CPU samples with it as the leaf (never critical)
    hot_function_warning: float = 0.25
    hot_function_info: float = 0.05
    hot_functions_max: int = 3
    # the lock machinery's CPU (pthread_mutex_lock, unlock, the futex calls) of the locks one
    # function takes: share of all CPU samples
    lock_cpu_critical: float = 0.20
    lock_cpu_warning: float = 0.05
    lock_cpu_info: float = 0.01
    # futexes that are not a kvs lock: share of the waiting threads' wall time
    futex_critical_share: float = 0.20
    futex_warning_share: float = 0.02
    futex_info_ms_per_s: float = 1.0
    # off-CPU blocking (idle waits such as epoll_wait excluded): share of one thread's wall time
    offcpu_warning_share: float = 0.5
    offcpu_info_share: float = 0.2


THRESHOLDS = Thresholds()


class Context:
    """What every rule needs: the window, thread names and sockets."""

    def __init__(self, profile: Profile, t: Thresholds) -> None:
        self.p = profile
        self.t = t
        self.dur = seconds(profile)
        self.names = {tid: th.name for tid, th in profile.threads.items()}

    def socket_of(self, tid: str) -> str:
        th = self.p.threads.get(tid)
        if th is None or not th.sockets:
            return "0"
        return max(th.sockets.items(), key=lambda kv: kv[1])[0]

    def named(self, tids: Iterable[str]) -> dict[str, str]:
        return {t: self.names.get(t, "") for t in tids}

    def finding(
        self, per_thread: dict[str, dict[str, float]], category: str, where: str, **fields: Any
    ) -> Finding:
        """A finding whose per-thread rows carry the threads' names; its id is
        `category:where` unless given."""
        fields.setdefault("id", f"{category}:{where}")
        names = self.named(per_thread)
        return Finding(category=category, where=where, per_thread=per_thread, thread_names=names, **fields)


def severity_of(value: float, critical: float, warning: float) -> str:
    if value >= critical:
        return "critical"
    if value >= warning:
        return "warning"
    return "info"


def worst(*sevs: str) -> str:
    return min(sevs, key=lambda s: SEVERITY_RANK[s])


def explain(hot: Hotspot | None, explanation: str, advice: str, note: str = "") -> dict[str, str]:
    """A finding's explanation, advice and hotspot: the catalog's for a known spot, else
    the generic words given; `note` ends the explanation."""
    if hot is None:
        return {"explanation": explanation + note, "advice": advice, "hotspot": ""}
    return {"explanation": hot.explanation + note, "advice": hot.fix, "hotspot": hot.id}


def wait_cost(c: Context, waits: int, wait_s_per_s: float, share: float) -> dict[str, float]:
    """The cost of waiting on a lock or futex: how often, how long, what share of the waiters' time."""
    return {
        "waits": float(waits),
        "waits_per_s": waits / c.dur,
        "wait_ms_per_s": wait_s_per_s * 1e3,
        "wait_share": share,
    }


# The one rule for order and severity (docs/report.md): a finding is worth the larger of
# what fixing it gives back now and CEILING_WEIGHT times the share of its resource's
# ceiling that today's throughput already uses.
GAIN_KEY = "gain_if_fixed"
CEILING_SHARE_KEY = "ceiling_share"  # today's throughput / the resource's ceiling
CEILING_WEIGHT = 0.2  # a resource at its ceiling counts as a fix worth +20 %
WORTH_CRITICAL = 0.10  # +10 % now, or a ceiling within 2x of today's throughput
WORTH_WARNING = 0.02  # +2 % now, or a ceiling within 10x


def worth(f: Finding) -> float:
    """What a finding is worth under the one rule."""
    return max(f.cost.get(GAIN_KEY, 0.0), CEILING_WEIGHT * f.cost.get(CEILING_SHARE_KEY, 0.0))


def rank(findings: list[Finding]) -> list[Finding]:
    """`findings` with the rule's severity, most worth first (ties: estimated cost, id)."""
    for f in findings:
        f.severity = severity_of(worth(f), WORTH_CRITICAL, WORTH_WARNING)
    return sorted(findings, key=rank_key)


def rank_key(f: Finding) -> tuple[float, float, str]:
    """Sort key: worth (descending), then estimated cost (descending), then id."""
    return (-worth(f), -f.cost.get("est_s_per_s", 0.0), f.id)
