"""`kvprof bench --scenario whatif`: each fix's predicted gain against the fix itself.

kvcached `baseline` is recorded under the demo's load (kvprof's collectors,
a few seconds) and the findings' predicted gains are taken from that profile
(`predict`, the model of kvprof.analysis.whatif, handed in by the command:
the bench does no analysis of its own). Then every site's fix alone
(`baseline+SITE`, kvcached's per-site switches) and all of them (`fixed`)
run against `baseline` in the usual interleaved paired rounds, and the table
sets predicted beside measured, judged by the bench's verdict rule
(kvprof.bench.stats). `fixed` is recorded too: no finding there should
predict a gain worth having.

Rounds on separate servers seconds apart scatter by more than these gains
(the host moves the VM's CPUs between them), so each fix is also measured on
one server, toggled (`toggled_fix`): the baseline server under the same load,
its site switched to per-thread and back with kvcached's `site` command, many
short windows alternated A B / B A, the gain the median of the pairs'
ratios with its standard error. A prediction is judged against that one.

A gain measured on this VM moves from minute to minute with what the host
does with its CPUs (docs/bench-results.md), and a profile taken minutes
before the measurement can see another machine. So the toggled measurement
runs in blocks (`interleaved`): a profile of baseline, then every fix
toggled for its share of the pairs, again and again under one load; the
prediction judged is the mean of the blocks' predictions.

Each toggled window also keeps where an operation's CPU time went (Window:
the server's threads, the load generator's, the machine's idle CPUs), and
each named lock's mean hold is taken from baseline's and fixed's profiles:
what the model's parts stand for, measured beside them.

A finding belongs to the fix of the catalog entry it matched (its hotspot id,
which is kvcached's site flag); the model itself knows nothing of kvcached.
"""

from __future__ import annotations

import math
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from kvprof.bench import BenchError, published, stats, table
from kvprof.bench.loadgen import kvload_argv
from kvprof.bench.machine import process_run_ns
from kvprof.bench.runner import Bench
from kvprof.bench.scenarios import WHATIF, study_client
from kvprof.bench.variants import KVLOAD, SITES, ClientConfig, Group, Plan, Variant, parse_server
from kvprof.collect.cpustat import CpuTimes, cpu_times
from kvprof.collect.server_stats import ops_total
from kvprof.model.profile import Profile
from kvprof.system.demo import LOAD_BATCH, LOAD_CONNECTIONS, LOAD_ITEMS, LOAD_SET_PCT
from kvprof.system.servers import Server, die_with_parent

WORKERS = 2
RECORD_S = 4.0  # seconds of profile the predictions come from
SETTLE_S = 1.0  # of load before the collectors attach
ALL = "fixed"  # the preset with every site fixed, and its row
TOLERANCE = 0.30  # a prediction is close when within this share of the measured gain...
TOLERANCE_POINTS = 0.03  # ...or within these points of it, whichever is wider
FIXED_MAX = 0.02  # on the fixed preset no finding should predict more
TOGGLE_PAIRS = 70  # pairs of windows per fix on the toggled server, over all blocks
TOGGLE_BLOCKS = 5  # profiles of baseline, each followed by every fix toggled for its share of pairs
ATTACH_S = 5.0  # a profile's compile and attach, for the load's length
TOGGLE_WINDOW_S = 0.2  # the site's switch takes effect at each worker's next update
TOGGLE_SETTLE_S = 0.05  # after a switch, before its window
MEDIAN_SE = math.sqrt(math.pi / 2)  # a median's standard error over a mean's, normal spread
IQR_SIGMAS = 2 * statistics.NormalDist().inv_cdf(0.75)  # an interquartile range in standard deviations
# the demo's load (kvprof.system.demo) with its 64-256-byte values at their mean size
DEMO_VALUE_SIZE = 160
DEMO_CLIENT = ClientConfig(KVLOAD, 1, LOAD_CONNECTIONS, LOAD_BATCH, LOAD_ITEMS, DEMO_VALUE_SIZE, LOAD_SET_PCT)
# the same requests from two kvload threads: a client that is not the loop's next bottleneck
DEMO2_CLIENT = replace(DEMO_CLIENT, threads=2, connections=LOAD_CONNECTIONS // 2)
DEMO, STUDY, DEMO2 = (
    "demo",
    "study",
    "demo2",
)  # the demo's load, the study scenario's, the demo's from 2 threads
LOADS = (DEMO, STUDY)  # what the bench runs unless told (--load chooses one of CHOICES)
CHOICES = (DEMO, STUDY, DEMO2)


class Predicted(Protocol):
    """What the model says of one profile (kvprof.analysis.whatif.Prediction)."""

    gains: dict[str, float]  # fix -> predicted gain (0.12: +12 %)
    largest: float  # the largest single finding's gain
    largest_id: str
    busy_share: float
    pace: str
    parts: dict[str, dict[str, float]]  # fix -> what it removes, part by part (share of busy time)
    cpu_saved: dict[str, float]  # fix -> the server CPU per operation it saves (0.2: 20 % less)


Predict = Callable[[Profile, dict[str, tuple[str, ...]]], Predicted]


def fixes() -> dict[str, tuple[str, ...]]:
    """Each fix and the catalog entries (hotspot ids) it removes."""
    return {**{site: (site,) for site in SITES}, ALL: SITES}


def client_of(load: str, workers: int) -> ClientConfig:
    """kvload's settings for `load` (CHOICES) against `workers` worker threads."""
    return {DEMO: DEMO_CLIENT, DEMO2: DEMO2_CLIENT}.get(load) or study_client(workers)


def plan(workers: Sequence[int] | None = None, loads: Sequence[str] = LOADS) -> Plan:
    """baseline, then each site fixed alone, then fixed, at 2 workers under each load: a
    group per load and worker count, each on servers of its own (a load's sets would
    change what the other reads)."""
    groups = []
    for load in loads:
        for w in workers or (WORKERS,):
            client = client_of(load, w)
            title = f"{w} worker{'s' if w != 1 else ''}, the {load}'s load ({client.label})"
            specs = ["baseline", *(f"baseline+{site}" for site in SITES), ALL]
            variants = tuple(
                Variant(f"{s} t={w} {load}", title, replace(parse_server(s, w), load=load), client)
                for s in specs
            )
            groups.append(Group(title, variants))
    return Plan(WHATIF, tuple(groups))


def fix_of(v: Variant) -> str:
    """The fix a variant is: its flipped site, or ALL for the fixed preset."""
    return v.server.flipped[0] if v.server.flipped else ALL


def profile_of(server: Server, seconds: float) -> Profile:
    """A profile of `server` under the load that runs: the collectors attach, read, detach."""
    from kvprof.collect import CollectError, CollectOptions
    from kvprof.system.attach import open_session

    try:
        session = open_session(server.pid, (), CollectOptions())
        try:
            session.start()
            for _ in session.run(seconds, 1.0, snapshots=False):
                pass
            return session.finish()
        finally:
            session.close()
    except CollectError as e:
        raise BenchError(f"cannot record {server.address}: {e}") from None


def _load(bench: Bench, v: Variant, seconds: float) -> subprocess.Popen[bytes]:
    """kvload on `v`'s server with `v`'s client settings, for `seconds` and the settling."""
    assert bench.kvload is not None
    argv = kvload_argv(bench.kvload, bench.servers[v.server].address, v.client, SETTLE_S + seconds + 2.0)
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent
    )


def record(bench: Bench, v: Variant, seconds: float) -> Profile:
    """A profile of `v`'s server under its load, which runs for the recording only."""
    load = _load(bench, v, seconds)
    try:
        time.sleep(SETTLE_S)
        return profile_of(bench.servers[v.server], seconds)
    finally:
        load.terminate()
        load.wait(10)


PARTS = ("server", "client", "idle")  # where a window's CPU time per operation went


@dataclass(frozen=True)
class Window:
    """What one toggled window cost per operation, in ns of CPU time: the server's
    threads, the load generator's, and the machine's idle CPUs (/proc/stat, in clock
    ticks). The three and the machine's other programs add up to the CPUs' time, so
    a throughput gain is what they lost per operation together."""

    server: float
    client: float
    idle: float


@dataclass(frozen=True)
class Toggled:
    """One fix measured on one server: windows with its site(s) shared and per-thread, alternated."""

    fix: str
    ratios: tuple[float, ...]  # per-thread / shared ops/s, pair by pair
    windows: tuple[tuple[Window, Window], ...] = ()  # (shared, per-thread), pair by pair

    @property
    def cpu_ratios(self) -> tuple[float, ...]:
        """Shared over per-thread server CPU per operation, pair by pair."""
        return tuple(shared.server / fixed.server for shared, fixed in self.windows if fixed.server > 0)

    def per_op(self) -> dict[str, tuple[float, float]]:
        """Each part's ns per operation, the median of the shared windows' and of the
        per-thread windows' ({} when the windows were not kept)."""
        if not self.windows:
            return {}
        return {
            part: (
                stats.median([getattr(w[0], part) for w in self.windows]),
                stats.median([getattr(w[1], part) for w in self.windows]),
            )
            for part in PARTS
        }

    @property
    def gain(self) -> float:
        return stats.median(self.ratios) - 1

    @property
    def cpu_saved(self) -> float | None:
        """The server CPU per operation the fix saved in the same windows (shared over
        per-thread - 1), when measured."""
        return stats.median(self.cpu_ratios) - 1 if self.cpu_ratios else None

    @property
    def error(self) -> float:
        """The standard error of `gain`, from the ratios' interquartile range: a window
        that something else on the machine took does not inflate it, as it does a
        standard deviation."""
        if len(self.ratios) < 2:
            return math.inf
        q = statistics.quantiles(self.ratios, n=4)
        return MEDIAN_SE * (q[2] - q[0]) / IQR_SIGMAS / math.sqrt(len(self.ratios))


def ops_done(server: Server) -> int:
    done = ops_total(server.stats())
    if done is None:
        raise BenchError(f"{server.address}: its `stats` has no operation counts")
    return done


def _switch(conn: socket.socket, site: str, mode: str) -> None:
    conn.sendall(f"site {site} {mode}\r\n".encode())
    reply = conn.recv(4096).decode(errors="replace").strip()
    if reply != "OK":
        raise BenchError(
            f"kvcached refused `site {site} {mode}`: {reply} (a kvcached without it: make build)"
        )


def _window(server: Server, client: int | None, seconds: float) -> tuple[float, Window]:
    """`seconds` of the load: the server's ops/s, and what each operation cost (Window)."""

    def now() -> tuple[int, int, int, CpuTimes, float]:
        try:
            ran = process_run_ns(client) if client else 0
        except OSError:
            raise BenchError(f"the load generator (PID {client}) ended: the load stopped") from None
        return ops_done(server), process_run_ns(server.pid), ran, cpu_times(), time.monotonic()

    ops0, server0, client0, cpu0, t0 = now()
    time.sleep(seconds)
    ops1, server1, client1, cpu1, t1 = now()
    ops = ops1 - ops0
    if ops <= 0:
        raise BenchError(f"{server.address} served nothing in a window: the load stopped")
    idle = (cpu1.idle - cpu0.idle) * 1e9
    return ops / (t1 - t0), Window((server1 - server0) / ops, (client1 - client0) / ops, idle / ops)


def toggled_fix(
    server: Server,
    fix: str,
    pairs: int,
    window: float = TOGGLE_WINDOW_S,
    settle: float = TOGGLE_SETTLE_S,
    client: int | None = None,
) -> Toggled:
    """`fix` (a site's flag, or ALL) on a server that runs under load: `pairs` pairs of
    `window`-second windows, A B / B A, per-thread against shared; shared again after.
    `client`: the load generator's PID, whose CPU time per operation each window keeps."""
    site = "all" if fix == ALL else fix
    ratios, windows = [], []
    with socket.create_connection((server.host, server.port), timeout=5) as conn:
        _switch(conn, site, "shared")  # a kvcached that cannot switch it says so here
        try:
            for i in range(pairs):
                rate, cost = {}, {}
                for fixed in (False, True) if i % 2 == 0 else (True, False):
                    _switch(conn, site, "per-thread" if fixed else "shared")
                    time.sleep(settle)
                    rate[fixed], cost[fixed] = _window(server, client, window)
                ratios.append(rate[True] / rate[False])
                windows.append((cost[False], cost[True]))
        finally:
            _switch(conn, site, "shared")
    return Toggled(fix, tuple(ratios), tuple(windows))


@dataclass
class Mean:
    """What the model said of several profiles of one server (Predicted): each gain the
    mean of the profiles' gains."""

    gains: dict[str, float]
    largest: float
    largest_id: str
    busy_share: float
    pace: str
    parts: dict[str, dict[str, float]]
    cpu_saved: dict[str, float]

    @classmethod
    def of(cls, said: Sequence[Predicted]) -> Mean:
        top = max(said, key=lambda p: p.largest)
        return cls(
            gains={fix: statistics.fmean(p.gains.get(fix, 0.0) for p in said) for fix in said[0].gains},
            largest=statistics.fmean(p.largest for p in said),
            largest_id=top.largest_id,
            busy_share=statistics.fmean(p.busy_share for p in said),
            pace=statistics.mode(p.pace for p in said),
            parts={
                fix: {
                    part: statistics.fmean(p.parts.get(fix, {}).get(part, 0.0) for p in said)
                    for part in dict.fromkeys(k for p in said for k in p.parts.get(fix, {}))
                }
                for fix in said[0].parts
            },
            cpu_saved={
                fix: statistics.fmean(p.cpu_saved.get(fix, 0.0) for p in said) for fix in said[0].cpu_saved
            },
        )


def interleaved(
    bench: Bench, v: Variant, blocks: int, pairs: int, seconds: float, predict: Predict
) -> tuple[Mean, dict[str, Toggled], list[Profile]]:
    """`v`'s (baseline) server under one load: `blocks` times, a profile of `seconds`, then
    every fix toggled for `pairs` pairs. The predictions and the gains they are judged
    against come from the same minutes, whatever the host did with the CPUs meanwhile.
    Returns the mean prediction, each fix's pairs together, and the blocks' profiles."""
    server = bench.servers[v.server]
    names = list(fixes())
    per_block = seconds + ATTACH_S + len(names) * pairs * 2 * (TOGGLE_WINDOW_S + TOGGLE_SETTLE_S + 0.01)
    load = _load(bench, v, blocks * per_block * 1.5)
    said: list[Predicted] = []
    ratios: dict[str, list[float]] = {fix: [] for fix in names}
    windows: dict[str, list[tuple[Window, Window]]] = {fix: [] for fix in names}
    profiles: list[Profile] = []
    try:
        time.sleep(SETTLE_S)
        for b in range(blocks):
            profiles.append(profile_of(server, seconds))
            said.append(predict(profiles[-1], fixes()))
            now = {fix: toggled_fix(server, fix, pairs, client=load.pid) for fix in names}
            for fix in names:
                ratios[fix] += now[fix].ratios
                windows[fix] += now[fix].windows
            bench.say(
                f"[toggle] {v.name}, block {b + 1}/{blocks}, this block's pairs: "
                + ", ".join(
                    f"{fix} {now[fix].gain * 100:+.1f} % (said {said[-1].gains.get(fix, 0) * 100:+.1f})"
                    for fix in names
                )
            )
    finally:
        load.terminate()
        load.wait(10)
    toggled = {fix: Toggled(fix, tuple(r), tuple(windows[fix])) for fix, r in ratios.items()}
    return Mean.of(said), toggled, profiles


def mean_holds(profiles: Sequence[Profile]) -> dict[str, float]:
    """Each named lock's mean hold in ns over `profiles`, the holds taken for interrupted
    aside: what a critical section took with the lines it touched where they were. A
    shared design's section that pulls lines another core dirtied holds longer than the
    same section per thread."""
    ns: dict[str, float] = {}
    count: dict[str, int] = {}
    for p in profiles:
        for h in p.holds:
            n = h.acquisitions - h.interrupted
            if n > 0:
                ns[h.name] = ns.get(h.name, 0.0) + h.hold_ns - h.interrupted_ns
                count[h.name] = count.get(h.name, 0) + n
    return {name: ns[name] / count[name] for name in sorted(ns)}


@dataclass
class Recorder:
    """Before the rounds: records `fixed` and keeps what the model said; measures each fix
    toggled on the baseline server in blocks, a profile of baseline before each, and
    judges the mean of those predictions (`toggle_pairs` 0: baseline recorded once, not
    toggled)."""

    predict: Predict
    seconds: float = RECORD_S
    keep: Path | None = None  # where the profiles go (for `kvprof report`)
    toggle_pairs: int = TOGGLE_PAIRS
    blocks: int = TOGGLE_BLOCKS
    predicted: dict[str, Predicted] = field(default_factory=dict)  # variant name -> prediction
    toggled: dict[str, dict[str, Toggled]] = field(default_factory=dict)  # baseline's name -> fix -> gain
    holds: dict[str, dict[str, float]] = field(default_factory=dict)  # variant name -> lock -> mean hold ns

    def _keep(self, v: Variant, p: Profile, suffix: str = "") -> None:
        if self.keep is not None:
            p.save(self.keep.with_name(f"{self.keep.stem}-{v.name.replace(' ', '-')}{suffix}.json.gz"))

    def __call__(self, bench: Bench) -> None:
        for g in bench.plan.groups:
            base, fixed = g.variants[0], g.variants[-1]
            if self.toggle_pairs:
                bench.say(
                    f"[toggle] {base.name}: {self.blocks} blocks of a {self.seconds:g} s profile, then each "
                    f"fix toggled for {self.toggle_pairs // self.blocks} pairs of {TOGGLE_WINDOW_S:g} s "
                    "windows"
                )
                said, toggled, profiles = interleaved(
                    bench,
                    base,
                    self.blocks,
                    max(1, self.toggle_pairs // self.blocks),
                    self.seconds,
                    self.predict,
                )
                self.predicted[base.name], self.toggled[base.name] = said, toggled
                self.holds[base.name] = mean_holds(profiles)
                for i, p in enumerate(profiles):
                    self._keep(base, p, f"-block{i + 1}")
            for v in (fixed,) if self.toggle_pairs else (base, fixed):
                bench.say(f"[record] {v.name}: {self.seconds:g} s under load")
                p = record(bench, v, self.seconds)
                self._keep(v, p)
                self.predicted[v.name] = self.predict(p, fixes())
                self.holds[v.name] = mean_holds([p])
            busy = self.predicted[base.name]
            bench.say(f"[record] {base.name}: busy {busy.busy_share:.0%} ({busy.pace})")


@dataclass(frozen=True)
class Check:
    """One fix: predicted against measured, toggled on one server when it was."""

    fix: str
    predicted: float
    rounds: float  # the paired rounds' median per-round ratio - 1
    rounds_spread: float  # the CV of the per-round ratios
    verdict: str  # the rounds'
    toggled: Toggled | None = None
    cpu: float | None = None  # the rounds' server CPU per operation, the reference's over the fix's, - 1

    @property
    def measured(self) -> float:
        """What the prediction is judged against: the toggled gain, else the rounds'."""
        return self.toggled.gain if self.toggled is not None else self.rounds

    @property
    def spread(self) -> float:
        """How far `measured` may be off: twice the toggled gain's standard error (95 %),
        else the rounds' CV."""
        return 2 * self.toggled.error if self.toggled is not None else self.rounds_spread

    @property
    def allowed(self) -> float:
        return max(TOLERANCE * abs(self.measured), TOLERANCE_POINTS)

    @property
    def close(self) -> bool:
        return abs(self.predicted - self.measured) <= self.allowed


def checks(
    group: Sequence[Variant],
    ops: Mapping[str, Sequence[float]],
    said: Predicted,
    toggled: Mapping[str, Toggled] | None = None,
    cpu: Mapping[str, Sequence[float]] | None = None,
) -> list[Check]:
    """Each fix of a group against its reference (the group's first variant); `cpu`: each
    variant's server CPU ns per operation in the rounds, when known."""
    base = ops[group[0].name]
    cpu = cpu or {}
    out = []
    for v in group[1:]:
        c = stats.compare(base, ops[v.name])
        fix = fix_of(v)
        before, after = cpu.get(group[0].name), cpu.get(v.name)
        less = stats.median(before) / stats.median(after) - 1 if before and after else None
        out.append(
            Check(
                fix, said.gains.get(fix, 0.0), c.change, c.spread, c.verdict, (toggled or {}).get(fix), less
            )
        )
    return out


def order_misses(rows: Sequence[Check]) -> list[str]:
    """Pairs of single fixes whose measured gains differ by more than their spreads
    together (the spread of a difference of two independent measurements: the root of
    the sum of their squares) and whose predicted order is the other way round."""
    single = [r for r in rows if r.fix != ALL]
    out = []
    for i, a in enumerate(single):
        for b in single[i + 1 :]:
            hi, lo = (a, b) if a.measured > b.measured else (b, a)
            if hi.measured - lo.measured > math.hypot(a.spread, b.spread) and hi.predicted < lo.predicted:
                out.append(f"{hi.fix} > {lo.fix}")
    return out


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def figures(
    group: Sequence[Variant],
    ops: Mapping[str, Sequence[float]],
    rec: Recorder,
    cpu: Mapping[str, Sequence[float]] | None = None,
) -> list[published.Figure]:
    """Each fix's predicted gain, the gain it measured (toggled, or the paired rounds') and
    the server CPU per operation it saved in the rounds, in percent, for the result file."""
    said = rec.predicted.get(group[0].name)
    if said is None:
        return []
    out = []
    for r in checks(group, ops, said, rec.toggled.get(group[0].name), cpu):
        how = "toggled, ±2 standard errors" if r.toggled is not None else "paired rounds, ±their CV"
        n = len(r.toggled.ratios) if r.toggled is not None else len(ops[group[0].name])
        out += [
            published.Figure(f"{group[0].group}: {r.fix} predicted", round(100 * r.predicted, 2), "%"),
            published.Figure(
                f"{group[0].group}: {r.fix} measured",
                round(100 * r.measured, 2),
                "%",
                round(100 * (r.measured - r.spread), 2),
                round(100 * (r.measured + r.spread), 2),
                how,
                n,
            ),
        ]
        if r.cpu is not None:
            out.append(
                published.Figure(
                    f"{group[0].group}: {r.fix} server CPU per op saved (rounds' medians, "
                    "reference / fixed - 1)",
                    round(100 * r.cpu, 2),
                    "%",
                    n=len(ops[group[0].name]),
                )
            )
        out += _part_figures(group[0].group, r, said)
    for v in (group[0], group[-1]):
        out += [
            published.Figure(f"{v.group}: {v.name}: mean hold of {lock} (interrupted holds aside)",
                             round(ns, 1), "ns")
            for lock, ns in rec.holds.get(v.name, {}).items()
        ]  # fmt: skip
    return out


def _part_figures(group: str, r: Check, said: Predicted) -> list[published.Figure]:
    """What the prediction of `r` removes, part by part, and the server CPU per operation
    it saves against the toggled windows' (the same server, the same minutes)."""
    out = [
        published.Figure(f"{group}: {r.fix} predicted removes {part} (share of busy threads' time)",
                         round(100 * v, 2), "%")
        for part, v in said.parts.get(r.fix, {}).items()
    ]  # fmt: skip
    if r.fix in said.cpu_saved:
        out.append(published.Figure(f"{group}: {r.fix} server CPU per op saved, predicted",
                                    round(100 * said.cpu_saved[r.fix], 2), "%"))  # fmt: skip
    t = r.toggled
    if t is not None and t.cpu_saved is not None:
        name = (
            f"{group}: {r.fix} server CPU per op saved, toggled (the pairs' median, shared / per-thread - 1)"
        )
        out.append(published.Figure(name, round(100 * t.cpu_saved, 2), "%", n=len(t.cpu_ratios)))
    if t is None:
        return out
    for part, (shared, fixed) in t.per_op().items():
        for mode, ns in (("shared", shared), ("per-thread", fixed)):
            name = f"{group}: {r.fix} toggled, {mode} windows: {part} ns per op (median)"
            out.append(published.Figure(name, round(ns, 1), "ns", n=len(t.windows)))
    return out


def _part_lines(rows: Sequence[Check], said: Predicted) -> list[str]:
    """What each prediction removes, part by part (the busy threads' share of the wall
    time), and the server CPU per operation it saves, predicted against toggled."""
    out = []
    for r in rows:
        parts = {k: v for k, v in said.parts.get(r.fix, {}).items() if v}
        if not parts:
            continue
        saved = r.toggled.cpu_saved if r.toggled is not None else None
        per_op = r.toggled.per_op() if r.toggled is not None else {}
        out += table.wrap(
            f"{r.fix} removes: "
            + ", ".join(f"{k} {v * 100:.1f} %" for k, v in parts.items())
            + f"; server CPU per op saved: predicted {_pct(said.cpu_saved.get(r.fix, 0.0))}"
            + (f", toggled {_pct(saved)}" if saved is not None else "")
            + (
                "; ns per op toggled, shared -> per-thread: "
                + ", ".join(f"{part} {a:.0f} -> {b:.0f}" for part, (a, b) in per_op.items())
                if per_op
                else ""
            )
        )
    return out


def render(
    group: Sequence[Variant],
    ops: Mapping[str, Sequence[float]],
    rec: Recorder,
    cpu: Mapping[str, Sequence[float]] | None = None,
) -> list[str]:
    """The predicted-vs-measured table of one group, and what it says."""
    base, fixed = group[0].name, group[-1].name
    said = rec.predicted.get(base)
    if said is None:
        return []
    toggled = rec.toggled.get(base)
    rows = checks(group, ops, said, toggled, cpu)
    lines = [
        *table.wrap(
            f"what each fix is worth, {group[0].group}: "
            + (
                f"predicted from {rec.blocks} profiles of {base} ({rec.seconds:g} s each, the mean of their "
                f"predictions), each followed on the same server under the same load by every fix toggled "
                f"({rec.toggle_pairs} pairs of {TOGGLE_WINDOW_S:g} s windows per fix in all, the site "
                "switched by kvcached's `site` command; median gain ± its standard error): the prediction "
                "is judged against the toggled gain, measured in the same minutes; the paired rounds "
                "above beside it, and `cpu/op`, the server CPU per operation they saved (the "
                "reference's over the fix's - 1: what the fix gave the server, whether or not the "
                "load used it)"
                if toggled
                else f"predicted from a {rec.seconds:g} s profile of {base}, measured in the paired rounds "
                "above"
            )
        ),
        f"{'fix':<16}{'predicted':>10}{'rounds':>9}{'rCV %':>7}  {'verdict':<12}{'cpu/op':>8}{'toggled':>9}"
        f" {'±SE':>5}  close (allowed)",
    ]
    for r in rows:
        ok = "yes" if r.close else "NO"
        t = r.toggled
        lines.append(
            f"{r.fix:<16}{_pct(r.predicted):>10}{_pct(r.rounds):>9}{r.rounds_spread * 100:7.1f}  "
            f"{r.verdict:<12}{_pct(r.cpu) if r.cpu is not None else '-':>8}"
            f"{_pct(t.gain) if t else '-':>9} {f'{t.error * 100:.1f}' if t else '-':>5}"
            f"  {ok} (±{r.allowed * 100:.1f})"
        )
    lines += _part_lines(rows, said)
    misses = order_misses(rows)
    lines.append(
        "order of the single fixes, where the measured gains differ by more than their spreads together: "
        + ("as measured" if not misses else "NOT as measured: " + ", ".join(misses))
    )
    lines.append(f"{base}: its busy threads were busy {said.busy_share:.0%} of the time ({said.pace})")
    held = [f"{v} {lock} {ns:.0f} ns" for v in (base, fixed) for lock, ns in rec.holds.get(v, {}).items()]
    if held:
        lines += table.wrap("mean hold of each lock, interrupted holds aside: " + "; ".join(held))
    other = rec.predicted.get(fixed)
    if other is not None:
        verdict = "below" if other.largest <= FIXED_MAX else "NOT below"
        lines.append(
            f"{fixed}: the largest gain a finding predicts is {_pct(other.largest)}"
            + (f" ({other.largest_id})" if other.largest_id else "")
            + f", {verdict} {FIXED_MAX:.0%}"
        )
    return lines
