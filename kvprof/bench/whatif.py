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

A finding belongs to the fix of the catalog entry it matched (its hotspot id,
which is kvcached's site flag); the model itself knows nothing of kvcached.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kvprof.bench import BenchError, stats
from kvprof.bench.loadgen import kvload_argv
from kvprof.bench.runner import Bench
from kvprof.bench.scenarios import WHATIF
from kvprof.bench.variants import KVLOAD, SITES, ClientConfig, Group, Plan, Variant, parse_server
from kvprof.model.profile import Profile
from kvprof.system.demo import LOAD_BATCH, LOAD_CONNECTIONS, LOAD_ITEMS, LOAD_SET_PCT
from kvprof.system.servers import die_with_parent

WORKERS = 2
RECORD_S = 5.0  # seconds of profile the predictions come from
SETTLE_S = 1.0  # of load before the collectors attach
ALL = "fixed"  # the preset with every site fixed, and its row
TOLERANCE = 0.30  # a prediction is close when within this share of the measured gain...
TOLERANCE_POINTS = 0.03  # ...or within these points of it, whichever is wider
FIXED_MAX = 0.02  # on the fixed preset no finding should predict more
# the demo's load (kvprof.system.demo) with its 64-256-byte values at their mean size
DEMO_VALUE_SIZE = 160
DEMO_CLIENT = ClientConfig(KVLOAD, 1, LOAD_CONNECTIONS, LOAD_BATCH, LOAD_ITEMS, DEMO_VALUE_SIZE, LOAD_SET_PCT)


class Predicted(Protocol):
    """What the model says of one profile (kvprof.analysis.whatif.Prediction)."""

    gains: dict[str, float]  # fix -> predicted gain (0.12: +12 %)
    largest: float  # the largest single finding's gain
    largest_id: str
    busy_share: float
    pace: str


Predict = Callable[[Profile, dict[str, tuple[str, ...]]], Predicted]


def fixes() -> dict[str, tuple[str, ...]]:
    """Each fix and the catalog entries (hotspot ids) it removes."""
    return {**{site: (site,) for site in SITES}, ALL: SITES}


def plan(workers: Sequence[int] | None = None) -> Plan:
    """baseline, then each site fixed alone, then fixed, at 2 workers under the demo's load."""
    groups = []
    for w in workers or (WORKERS,):
        title = f"{w} worker{'s' if w != 1 else ''}, the demo's load ({DEMO_CLIENT.label})"
        specs = ["baseline", *(f"baseline+{site}" for site in SITES), ALL]
        variants = tuple(Variant(f"{s} t={w}", title, parse_server(s, w), DEMO_CLIENT) for s in specs)
        groups.append(Group(title, variants))
    return Plan(WHATIF, tuple(groups))


def fix_of(v: Variant) -> str:
    """The fix a variant is: its flipped site, or ALL for the fixed preset."""
    return v.server.flipped[0] if v.server.flipped else ALL


def record(bench: Bench, v: Variant, seconds: float) -> Profile:
    """A profile of `v`'s server under its load: kvload runs, the collectors attach, read, detach."""
    from kvprof.collect import CollectError, CollectOptions
    from kvprof.system.attach import open_session

    server = bench.servers[v.server]
    assert bench.kvload is not None
    argv = kvload_argv(bench.kvload, server.address, v.client, SETTLE_S + seconds + 2.0)
    load = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent
    )
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
        raise BenchError(f"cannot record {v.name}: {e}") from None
    finally:
        load.terminate()
        load.wait(10)


@dataclass
class Recorder:
    """Records baseline and fixed before the rounds and keeps what the model said."""

    predict: Predict
    seconds: float = RECORD_S
    keep: Path | None = None  # where the profiles go (for `kvprof report`)
    predicted: dict[str, Predicted] = field(default_factory=dict)  # variant name -> prediction

    def __call__(self, bench: Bench) -> None:
        for g in bench.plan.groups:
            for v in (g.variants[0], g.variants[-1]):
                bench.say(f"[record] {v.name}: {self.seconds:g} s under load")
                p = record(bench, v, self.seconds)
                if self.keep is not None:
                    p.save(self.keep.with_name(f"{self.keep.stem}-{v.name.replace(' ', '-')}.json.gz"))
                self.predicted[v.name] = self.predict(p, fixes())
                said = self.predicted[v.name]
                bench.say(f"[record] {v.name}: busy {said.busy_share:.0%} ({said.pace})")


@dataclass(frozen=True)
class Check:
    """One fix: predicted against measured."""

    fix: str
    predicted: float
    measured: float  # median per-round ratio - 1
    spread: float  # the CV of the per-round ratios
    verdict: str

    @property
    def allowed(self) -> float:
        return max(TOLERANCE * abs(self.measured), TOLERANCE_POINTS)

    @property
    def close(self) -> bool:
        return abs(self.predicted - self.measured) <= self.allowed


def checks(group: Sequence[Variant], ops: Mapping[str, Sequence[float]], said: Predicted) -> list[Check]:
    """Each fix of a group against its reference (the group's first variant)."""
    base = ops[group[0].name]
    out = []
    for v in group[1:]:
        c = stats.compare(base, ops[v.name])
        fix = fix_of(v)
        out.append(Check(fix, said.gains.get(fix, 0.0), c.change, c.spread, c.verdict))
    return out


def order_misses(rows: Sequence[Check]) -> list[str]:
    """Pairs of single fixes whose measured gains differ by more than their spread and
    whose predicted order is the other way round."""
    single = [r for r in rows if r.fix != ALL]
    out = []
    for i, a in enumerate(single):
        for b in single[i + 1 :]:
            hi, lo = (a, b) if a.measured > b.measured else (b, a)
            if hi.measured - lo.measured > max(a.spread, b.spread) and hi.predicted < lo.predicted:
                out.append(f"{hi.fix} > {lo.fix}")
    return out


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def render(group: Sequence[Variant], ops: Mapping[str, Sequence[float]], rec: Recorder) -> list[str]:
    """The predicted-vs-measured table of one group, and what it says."""
    base, fixed = group[0].name, group[-1].name
    said = rec.predicted.get(base)
    if said is None:
        return []
    rows = checks(group, ops, said)
    lines = [
        f"what each fix is worth, {group[0].group}: predicted from a {rec.seconds:g} s profile of {base},",
        "measured in the paired rounds above",
        f"{'fix':<16}{'predicted':>10}{'measured':>10}{'rCV %':>7}  {'verdict':<12} close (allowed)",
    ]
    for r in rows:
        ok = "yes" if r.close else "NO"
        lines.append(
            f"{r.fix:<16}{_pct(r.predicted):>10}{_pct(r.measured):>10}{r.spread * 100:7.1f}  "
            f"{r.verdict:<12} {ok} (±{r.allowed * 100:.1f})"
        )
    misses = order_misses(rows)
    lines.append(
        "order of the single fixes, where the measured gains differ by more than their spread: "
        + ("as measured" if not misses else "NOT as measured: " + ", ".join(misses))
    )
    lines.append(f"{base}: its busy threads were busy {said.busy_share:.0%} of the time ({said.pace})")
    other = rec.predicted.get(fixed)
    if other is not None:
        verdict = "below" if other.largest <= FIXED_MAX else "NOT below"
        lines.append(
            f"{fixed}: the largest gain a finding predicts is {_pct(other.largest)}"
            + (f" ({other.largest_id})" if other.largest_id else "")
            + f", {verdict} {FIXED_MAX:.0%}"
        )
    return lines
