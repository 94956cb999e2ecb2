"""What each view of `kvprof top` shows, as plain dataclasses (no textual here).

A source hands over Samples: the session's cumulative Profile so far (None
until the first collectors are attached) and the target's own `stats`. The
Timeline keeps the last few samples and the base that `r` moves;
`build_frame` turns them into a Frame, in the refresh worker, so that the UI
thread only draws. The row functions below are pure functions of a Frame.

Three windows, all deltas of cumulative snapshots (kvprof.model.delta):

- interval: between the last two samples (the Stacks view's "now");
- recent:   the last RECENT_SAMPLES samples, a few seconds: findings, locks,
            cache lines, threads and requests rank steadily on it and still
            follow a change (flip the server's preset, and they move);
- total:    since the session started or `r` was pressed (what `s` saves).
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field, replace

from kvprof.analysis import ceilings, rows
from kvprof.analysis.findings import find, summary
from kvprof.analysis.findings.common import GAIN_KEY
from kvprof.analysis.findings.lock_cpu import ID_PREFIX as LOCK_CPU
from kvprof.analysis.hotspots import label, match_function, match_lock
from kvprof.analysis.lines import kind, line_table
from kvprof.analysis.rows import LockRow, RequestRow, SiteRow, SiteThreadRow, ThreadRow
from kvprof.analysis.tables import cpu_share, socket_matrix
from kvprof.analysis.whatif import modelled
from kvprof.collect.server_stats import ops_total
from kvprof.model.delta import delta
from kvprof.model.profile import Finding, Profile, Window

RECENT_SAMPLES = 5  # intervals the findings and rate tables look back over
OPS_HISTORY = 240  # sparkline points kept
DROP_COUNTERS = ("lost", "map_full", "stack_errors")

# view id -> the collector it needs
VIEW_COLLECTOR = {
    "stacks": "oncpu",
    "locks": "locks",
    "lines": "cachelines",
    "requests": "requests",
}
VIEW_NAMES = {"stacks": "stacks", "locks": "lock", "lines": "cache-line", "requests": "request"}
KVS_COLLECTORS = ("locks", "cachelines", "requests")


@dataclass(frozen=True)
class Sample:
    """One reading of a source."""

    at: float  # seconds since the source started
    profile: Profile | None  # cumulative since the session's window started; None before attach
    stats: dict[str, str] | None = None  # the target's `stats`, when it answers
    alive: bool = True
    states: dict[str, str] = field(default_factory=dict)  # collector -> "ok", "attaching", why not


def since(new: Profile, old: Profile | None) -> Profile:
    """`new` minus `old` with its own window (delta() keeps the cumulative one)."""
    if old is None:
        return new
    d = delta(new, old)
    d.window = Window(
        start=new.window.start + old.window.duration_s,
        duration_s=max(0.0, round(new.window.duration_s - old.window.duration_s, 3)),
    )
    return d


def _ops(stats: dict[str, str]) -> int | None:
    return ops_total(stats)


class Timeline:
    """The samples a live view needs: the last few, the base of `r`, ops/s history."""

    def __init__(self, recent: int = RECENT_SAMPLES, history: int = OPS_HISTORY) -> None:
        self.samples: deque[Sample] = deque(maxlen=recent + 1)  # those with a profile
        self.base: Sample | None = None  # `r` was pressed here; None: the session's start
        self.latest: Sample | None = None
        self.ops: deque[float] = deque(maxlen=history)
        self.ops_per_s: float | None = None
        self.first_stats: dict[str, str] | None = None
        self.last_stats: dict[str, str] | None = None  # kept once the target stops answering
        self._stats_at: tuple[float, int] | None = None
        self.ended_at: float | None = None  # when the target was seen gone

    def add(self, s: Sample) -> None:
        if s.stats is not None:
            self.last_stats = s.stats
            if self.first_stats is None:
                self.first_stats = s.stats
            ops = _ops(s.stats)
            if ops is not None:
                if self._stats_at is not None and s.at > self._stats_at[0]:
                    self.ops_per_s = max(0.0, (ops - self._stats_at[1]) / (s.at - self._stats_at[0]))
                    self.ops.append(self.ops_per_s)
                self._stats_at = (s.at, ops)
        if not s.alive and self.ended_at is None:
            self.ended_at = s.at
        self.latest = s
        if s.profile is not None:
            self.samples.append(s)

    def reset(self) -> None:
        """Count from now: the total window and the findings start again."""
        if self.samples:
            self.base = self.samples[-1]
            self.samples.clear()
            self.samples.append(self.base)
        if self.latest is not None and self.latest.stats is not None:
            self.first_stats = self.latest.stats

    def _base_profile(self) -> Profile | None:
        return self.base.profile if self.base is not None else None

    def windows(self) -> tuple[Profile, Profile, Profile] | None:
        """(interval, recent, total), or None before the first profile."""
        if not self.samples:
            return None
        last = self.samples[-1].profile
        assert last is not None
        base = self._base_profile()
        if len(self.samples) >= 2:
            prev, first = self.samples[-2].profile, self.samples[0].profile
        else:
            prev = first = base
        return since(last, prev), since(last, first), since(last, base)


# ---- the frame ------------------------------------------------------------------


@dataclass
class StatusInfo:
    hz: int = 0
    drops: int = 0
    collectors: dict[str, str] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)  # view -> one line why
    warnings: list[str] = field(default_factory=list)
    ended: str = ""  # banner text once the target is gone


@dataclass
class Frame:
    """Everything one refresh shows."""

    title: str  # "kvcached PID 1234"
    command: str
    source: str  # "live" or "replay of FILE"
    elapsed_s: float  # since the source started
    uptime_s: int | None  # the target's own uptime, when its stats answer
    ops_per_s: float | None
    ops_history: list[float]
    interval: Profile | None
    recent: Profile | None
    total: Profile | None
    findings: list[Finding]
    status: StatusInfo
    kvs_probes: bool = False
    ceiling: str = ""  # the first rungs of the ceiling ladder, one line ("" when none)
    server: str = ""  # "memcached", "redis", "none" (answered neither), "" (not asked yet)


def _server(tl: Timeline) -> str:
    if tl.last_stats is not None:
        return "redis" if tl.last_stats.get("protocol") == "redis" else "memcached"
    return "none" if tl.latest is not None and tl.latest.profile is not None else ""


def _drops(profile: Profile) -> int:
    return sum(v for k, v in profile.status.counters.items() if k.endswith(DROP_COUNTERS) and v > 0)


def _unavailable(states: dict[str, str], kvs: bool, seen: bool) -> dict[str, str]:
    out = {}
    for view, name in VIEW_COLLECTOR.items():
        state = states.get(name)
        label = VIEW_NAMES[view]
        if state == "ok":
            continue
        if view == "lines" and states.get("regsample") == "ok":
            # the lines from sampled registers stand in for the kvs probes on any target
            if name in KVS_COLLECTORS and not kvs:
                out[view] = "no kvs probes: lines from sampled registers only"
            continue
        if state is None and seen:
            out[view] = f"{name} not collected: {label} view unavailable"
        elif state is None or state == "attaching":
            out[view] = f"attaching {name} (compiling its BPF program)…"
        elif name in KVS_COLLECTORS and not kvs:
            out[view] = f"no kvs probes: {label} view unavailable"
        else:
            out[view] = f"{name} {state}: {label} view unavailable"
    return out


def build_frame(tl: Timeline, title: str, command: str, source: str) -> Frame:
    """The rows' inputs for the latest sample (runs in the refresh worker: findings cost ms)."""
    latest = tl.latest
    windows = tl.windows()
    interval, recent, total = windows if windows is not None else (None, None, None)
    states = dict(latest.states) if latest is not None else {}
    status = StatusInfo()
    kvs = False
    if total is not None:
        last = tl.samples[-1].profile
        assert last is not None
        kvs = last.target.kvs_probes
        for name, state in last.status.collectors.items():
            states.setdefault(name, state)
        status.hz = last.hz
        status.drops = _drops(last)
        status.warnings = list(last.status.warnings) + list(last.status.notes)
        if last.status.partial and last.status.reason:
            status.warnings.insert(0, last.status.reason)
    status.collectors = states
    status.unavailable = _unavailable(states, kvs, seen=latest is not None and not latest.alive)
    if tl.ended_at is not None:
        status.ended = f"{title} exited after {tl.ended_at:.0f} s: the last data stays on screen (q quits)"
    uptime = None
    if tl.last_stats is not None:
        try:
            uptime = int(tl.last_stats["uptime"])
        except (KeyError, ValueError):
            uptime = None
    findings = find(recent) if recent is not None else []
    rungs = ceilings.ladder(recent, findings, ops=tl.ops_per_s) if recent is not None else []
    return Frame(
        title=title,
        command=command,
        source=source,
        elapsed_s=latest.at if latest is not None else 0.0,
        uptime_s=uptime,
        ops_per_s=tl.ops_per_s,
        server=_server(tl),
        ops_history=list(tl.ops),
        interval=interval,
        recent=recent,
        total=total,
        ceiling=ceilings.ladder_line(rungs),
        findings=findings,
        status=status,
        kvs_probes=kvs,
    )


def profile_to_save(tl: Timeline) -> Profile | None:
    """The session so far (since start or `r`) as a profile file holds it, findings included."""
    windows = tl.windows()
    if windows is None:
        return None
    total = copy.deepcopy(windows[2])
    before, after = tl.first_stats, tl.last_stats
    if before is not None:
        total.server_stats["before"] = dict(before)
    if after is not None:
        total.server_stats["after"] = dict(after)
    total.findings = find(total)
    return total


# ---- rows -----------------------------------------------------------------------


def pct(x: float) -> str:
    """A share as a percentage: one decimal under 10 %."""
    return f"{x:.1%}" if x < 0.1 else f"{x:.0%}"


# (from, unit, format) for num(): the first step x reaches
NUM_STEPS = ((1e6, 1e6, "{:.2f}M"), (1e4, 1e3, "{:.0f}k"), (100, 1, "{:,.0f}"), (10, 1, "{:.1f}"))


def num(x: float) -> str:
    """A count or rate in a few characters: 0.47, 12.3, 5,020, 12k, 1.25M."""
    step = next((st for st in NUM_STEPS if x >= st[0]), None)
    if step is not None:
        return step[2].format(x / step[1])
    return f"{x:.2f}" if x else "0"


@dataclass(frozen=True)
class FindingRow:
    id: str
    severity: str
    category: str
    where: str
    title: str
    cost: str  # one line: "update_topkeys — topkeys mutex: 38% of 2 threads' wall time waiting"
    hotspot: bool
    summary: str
    explanation: str
    advice: str
    gain: str = "-"  # "if fixed": the throughput fixing it gives back, "-" when the model has no fix


def gain_cell(f: Finding) -> str:
    """A finding's gain if fixed, `+1.2%`; `-` when the model has no fix for it."""
    return f"{f.cost[GAIN_KEY]:+.1%}" if modelled(f) and GAIN_KEY in f.cost else "-"


def cost_line(f: Finding) -> str:
    """A finding's cost in one line, its function first, its ceiling last."""
    line = _cost_line(f)
    if "ceiling_ops_per_s" in f.cost:
        line += f"; ceiling {ceilings.ops_text(f.cost['ceiling_ops_per_s'])} ops/s"
    return line


def _cost_line(f: Finding) -> str:
    k = f.cost
    site = f.sites[0] if f.sites else f.where
    if f.id.startswith(LOCK_CPU):
        return (
            f"{f.where} — {f.lock}: {pct(k.get('share', 0))} of CPU samples in lock/unlock, "
            f"{pct(k.get('kernel_share', 0))} of that in the kernel"
        )
    if f.category == "lock":
        threads = int(k.get("threads", 0))
        who = "1 thread's" if threads == 1 else f"{threads} threads'"
        return (
            f"{site} — {f.where} mutex: {pct(k.get('wait_share', 0))} of {who} wall time waiting, "
            f"{num(k.get('waits_per_s', 0))} waits/s"
        )
    if f.id.startswith("sampled-line:"):
        what = "false sharing" if k.get("false_sharing") else "shared atomic"
        return (
            f"{site} — {what}: ~{pct(k.get('share', 0))} of {int(k.get('writers', 0))} threads' CPU "
            f"stalled on it ({int(k.get('samples', 0))} samples)"
        )
    if f.category == "cacheline":
        if k.get("writers", 2.0) == 1.0:
            return f"{f.where} — per-thread counter, not shared"
        line = (
            f"{f.where} — shared counter: {num(k.get('transfers_per_s', 0))} line transfers/s, "
            f"{num(k.get('cycles_mean', 0))} cycles per update"
        )
        if k.get("cross_socket_per_s", 0):
            line += f", {pct(k.get('cross_socket_share', 0))} cross-socket"
        return line
    if f.category == "cpu":
        return (
            f"{f.where} — on the stack in {pct(k.get('share', 0))} of CPU samples, "
            f"{pct(k.get('self_share', 0))} itself"
        )
    if f.id.startswith("futex:"):
        on = f"{f.lock} in {f.where}" if f.lock and f.lock != f.where else f.where
        return (
            f"{on} — {pct(k.get('wait_share', 0))} of the waiting threads' time, "
            f"{num(k.get('waits_per_s', 0))} waits/s"
        )
    return f"{f.where} — threads blocked {num(k.get('offcpu_ms_per_s', 0))} ms/s"


def finding_rows(frame: Frame) -> list[FindingRow]:
    """The findings of the recent window, in rank order, with their cost in one line."""
    out = []
    for f in frame.findings:
        named = (f.id, f.severity, f.category, f.where, f.title)
        words = (summary(f), f.explanation, f.advice)
        out.append(FindingRow(*named, cost_line(f), bool(f.hotspot), *words, gain_cell(f)))
    return out


@dataclass(frozen=True)
class CpuBar:
    tid: str
    name: str
    cpu: float  # share of one CPU


def cpu_bars(frame: Frame) -> list[CpuBar]:
    """CPU per thread over the recent window, busiest first."""
    p = frame.recent
    if p is None:
        return []
    bars = [CpuBar(tid, th.name, cpu_share(p, th.cpu_samples)) for tid, th in p.threads.items()]
    return sorted((b for b in bars if b.cpu > 0), key=lambda b: (-b.cpu, b.tid))


@dataclass(frozen=True)
class StackRow:
    function: str
    self_now: float  # shares of the window's samples
    total_now: float
    self_all: float
    total_all: float
    hotspot: str  # catalog id, "" when none


def stack_rows(frame: Frame, tid: str | None = None, limit: int = 200) -> list[StackRow]:
    """Functions by self share over the last interval, then since start; one thread or all."""
    now = {r.function: r for r in rows.function_rows(frame.interval, tid)}
    out = []
    for r in rows.function_rows(frame.total, tid):
        n = now.get(r.function)
        self_now, total_now = (n.self_share, n.total_share) if n is not None else (0.0, 0.0)
        out.append(StackRow(r.function, self_now, total_now, r.self_share, r.total_share, r.hotspot))
    out.sort(key=lambda r: (-r.self_now, -r.self_all, -r.total_all, r.function))
    return out[:limit]


def thread_choices(frame: Frame) -> list[tuple[str, str]]:
    """(tid, name) of the threads with on-CPU samples since start, busiest first."""
    p = frame.total
    if p is None:
        return []
    busy = sorted(p.threads.items(), key=lambda kv: (-kv[1].cpu_samples, kv[0]))
    return [(tid, th.name) for tid, th in busy if th.cpu_samples > 0]


def lock_hotspot(lock: str, site: str) -> bool:
    """Whether a lock name (or a call site waiting on a lock) is in the hotspot catalog."""
    return (bool(lock) and match_lock(lock) is not None) or (bool(site) and match_function(site) is not None)


def wait_split(frame: Frame, row: LockRow) -> str:
    """Each thread's share of a lock's wait time, most first: "kv-worker-0 60%  kv-worker-1 40%"."""
    total = sum(row.wait_ns_by_thread.values())
    if total <= 0 or frame.recent is None:
        return ""
    names = {t: th.name for t, th in frame.recent.threads.items()}
    top = sorted(row.wait_ns_by_thread.items(), key=lambda kv: -kv[1])
    return "  ".join(f"{names.get(t) or t} {v / total:.0%}" for t, v in top)


def lock_rows(frame: Frame) -> list[LockRow]:
    """Per lock name (its call sites in `sites`), over the recent window."""
    return rows.lock_rows(frame.recent) if frame.recent is not None else []


def line_rows(frame: Frame) -> list[SiteRow]:
    """Per kvs site over the recent window, most transfers first."""
    return rows.site_rows(frame.recent) if frame.recent is not None else []


def line_threads(frame: Frame, site: str) -> list[SiteThreadRow]:
    """Who updates `site`'s lines, over the recent window, most updates first."""
    row = next((r for r in line_rows(frame) if r.site == site), None)
    return list(row.threads) if row is not None else []


@dataclass(frozen=True)
class SampledRow:
    key: str  # the line's address, "0x..."
    symbol: str
    samples: int
    share: float  # of the writing threads' CPU samples
    writers: int
    kind: str
    functions: str


def sampled_rows(frame: Frame) -> list[SampledRow]:
    """Cache lines from sampled registers (kvprof.analysis.lines), over the whole window:
    a few samples a second land on atomics, so the recent window is too thin."""
    p = frame.total
    if p is None:
        return []
    return [
        SampledRow(
            f"0x{sl.line:x}",
            sl.symbol,
            sl.samples,
            sl.share,
            sl.writers,
            kind(sl),
            ", ".join(sl.ranked_functions),
        )
        for sl in line_table(p)
    ]


def transfer_matrix(frame: Frame) -> list[list[float]]:
    """Transfers per second [from socket][to socket] over the recent window."""
    if frame.recent is None:
        return []
    return socket_matrix(frame.recent)


def socket_count(frame: Frame) -> int:
    p = frame.total
    if p is None:
        return 1
    return len({place.get("socket", 0) for place in p.host.topology.values()}) or 1


def stack_quality(q: float | None) -> str:
    """A thread's stack quality in a word: "good", "30% short", "-" when unknown."""
    if q is None:
        return "-"
    return "good" if q < 0.1 else f"{q:.0%} short"


def top_function(row: ThreadRow) -> str:
    """A thread's hottest leaf, its module offset folded, `[k]` for the kernel's."""
    top = row.top_function
    return label(top) if top else ""


def thread_rows(frame: Frame) -> list[ThreadRow]:
    """Every thread over the recent window, busiest first (the idle most off the CPU first)."""
    if frame.recent is None:
        return []
    return sorted(rows.thread_rows(frame.recent), key=lambda r: (-r.cpu_share, -r.offcpu_share, r.tid))


def request_rows(frame: Frame) -> list[RequestRow]:
    """Latency percentiles per opcode since start (more samples), with `per_s` over the recent
    window."""
    recent, total = frame.recent, frame.total
    if recent is None or total is None:
        return []
    now = {r.opcode: r.per_s for r in rows.request_rows(recent)}
    return [replace(r, per_s=now.get(r.opcode, 0.0)) for r in rows.request_rows(total)]
