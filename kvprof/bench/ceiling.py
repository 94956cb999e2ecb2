"""`kvprof bench --scenario ceiling`: the ceilings predicted from one worker against
what two workers reach.

For each topkeys hold (`kvcached --topkeys-hold-ns`, 0 and HOLD_NS), each run:
kvcached `baseline` at one worker under the demo's load is recorded (the
ladder comes from the command: kvprof.analysis.ceilings, handed in; the
bench does no analysis of its own), then its throughput is measured with
kvprof detached; then the same at two workers, measured only. The table
sets the first predicted ceiling beside what two workers reached, and
beside plain scaling (twice one worker's throughput).

With the hold, the topkeys mutex is the ceiling a 2-core machine reaches:
the prediction should be close to two workers' throughput, where plain
scaling overshoots. Without it, two workers are far from any ceiling: the
prediction should be well above what they reach (the model claims no
binding ceiling that is not there).
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from kvprof.bench import BenchError, published
from kvprof.bench.placement import handoff_ns
from kvprof.bench.whatif import ops_done, profile_of
from kvprof.model.profile import Profile
from kvprof.system.demo import LOAD_BATCH, LOAD_CONNECTIONS, LOAD_ITEMS, LOAD_SET_PCT
from kvprof.system.servers import Server, die_with_parent, kvload_binary, start_kvcached

HOLD_NS = 10_000
RECORD_S = 4.0
MEASURE_S = 4.0
SETTLE_S = 1.0
CLOSE = 0.20  # with the hold: the prediction within this share of two workers' throughput
OVERSHOOT = 0.25  # ... where plain scaling is at least this much too high
HANDOFF_MS = 300  # the hand-off probe's window before each run
FAR = 2.0  # without it: the prediction at least this many times what two workers reach

# first rung: (resource, ceiling ops/s), or None when the profile shows none
Predict = Callable[[Profile], tuple[str, float] | None]


@dataclass
class Row:
    hold_ns: int
    run: int
    one_worker_ops: float
    two_workers_ops: float
    resource: str
    predicted_ops: float
    handoff_ns: float = math.nan  # this machine's, measured before the run (atomics --mode handoff)
    wake_ns: float = math.nan

    @property
    def error(self) -> float:
        """The prediction against two workers' throughput (0.1: 10 % above)."""
        return self.predicted_ops / self.two_workers_ops - 1

    @property
    def scaling_error(self) -> float:
        """Plain scaling (twice one worker) against two workers' throughput."""
        return 2 * self.one_worker_ops / self.two_workers_ops - 1

    @property
    def holds(self) -> bool:
        if self.hold_ns:
            return abs(self.error) <= CLOSE and self.scaling_error >= OVERSHOOT
        return self.predicted_ops >= FAR * self.two_workers_ops


def _loaded(server: Server, seconds: float) -> subprocess.Popen[bytes]:
    argv = [str(kvload_binary()), "--server", server.address, "--num-threads", "1",
            "--connections", str(LOAD_CONNECTIONS), "--batch-size", str(LOAD_BATCH),
            "--set-pct", str(LOAD_SET_PCT), "--num-items", str(LOAD_ITEMS),
            "--duration", f"{seconds:g}", "--quiet"]  # fmt: skip
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent
    )


def _rate(server: Server, seconds: float) -> float:
    ops0, t0 = ops_done(server), time.monotonic()
    time.sleep(seconds)
    return (ops_done(server) - ops0) / (time.monotonic() - t0)


def _serve(workers: int, hold: int, predict: Predict | None) -> tuple[float, tuple[str, float] | None]:
    """kvcached at `workers` under the load: its ops/s with kvprof detached, and the first
    rung predicted from a recording before that (when `predict` is given)."""
    server = start_kvcached(["-t", str(workers), "--topkeys-hold-ns", str(hold)])
    try:
        load = _loaded(server, SETTLE_S + RECORD_S + MEASURE_S + 30)
        try:
            time.sleep(SETTLE_S)
            rung = predict(profile_of(server, RECORD_S)) if predict is not None else None
            time.sleep(SETTLE_S)  # the detach's own work out of the window
            return _rate(server, MEASURE_S), rung
        finally:
            load.terminate()
            load.wait(10)
    finally:
        server.stop()
        server.log_path.unlink(missing_ok=True)


def figures(rows: list[Row]) -> list[published.Figure]:
    """The result file's figures: per hold setting, the prediction and plain scaling, each
    over what two workers reached."""
    out = []
    for hold in sorted({r.hold_ns for r in rows}, reverse=True):
        mine = [r for r in rows if r.hold_ns == hold]
        predicted = [r.error + 1 for r in mine]
        scaled = [r.scaling_error + 1 for r in mine]
        out.append(
            published.Figure.median_of(f"hold {hold} ns: predicted / 2 workers", predicted, "x", "runs")
        )
        out.append(
            published.Figure.median_of(f"hold {hold} ns: 2 x 1 worker / 2 workers", scaled, "x", "runs")
        )
    return out


def run(
    predict: Predict, model: tuple[float, float], runs: int, results: Path | None, out: TextIO = sys.stdout
) -> int:
    """The bench; `model`: the hand-off and waking unlock (ns) the model takes, printed beside
    this machine's."""
    rows = []
    for run_i in range(runs):
        handoff, wake = handoff_ns(HOLD_NS, HANDOFF_MS)
        print(f"ceiling: run {run_i + 1}/{runs}: a mutex's hand-off here {handoff / 1e3:.1f} us, "
              f"waking unlock {wake / 1e3:.1f} us (the model's: {model[0] / 1e3:.1f}, "
              f"{model[1] / 1e3:.1f})", file=sys.stderr)  # fmt: skip
        for hold in (HOLD_NS, 0):
            print(f"ceiling: run {run_i + 1}/{runs}, hold {hold} ns: 1 worker (recorded)...", file=sys.stderr)
            one, rung = _serve(1, hold, predict)
            if rung is None:
                raise BenchError(f"the recording of one worker (hold {hold} ns) showed no ceiling")
            print(f"ceiling: run {run_i + 1}/{runs}, hold {hold} ns: 2 workers...", file=sys.stderr)
            two, _ = _serve(2, hold, None)
            rows.append(Row(hold, run_i + 1, one, two, rung[0], rung[1], handoff, wake))
    print(f"{'hold ns':>8} {'run':>4} {'1 worker':>10} {'2 workers':>10} {'predicted':>10} "
          f"{'error':>7} {'2x1 err':>8}  first ceiling", file=out)  # fmt: skip
    for r in rows:
        print(f"{r.hold_ns:>8} {r.run:>4} {r.one_worker_ops:>10,.0f} {r.two_workers_ops:>10,.0f} "
              f"{r.predicted_ops:>10,.0f} {r.error:>+7.0%} {r.scaling_error:>+8.0%}  {r.resource}"
              f"{'' if r.holds else '  (misses)'}", file=out)  # fmt: skip
    print(f"with the hold: within {CLOSE:.0%} of 2 workers while 2x1 worker overshoots by >= "
          f"{OVERSHOOT:.0%}; without: predicted >= {FAR:g}x 2 workers", file=out)  # fmt: skip
    if results is not None:
        settings = {"runs": runs, "hold_ns": HOLD_NS, "record_s": RECORD_S, "measure_s": MEASURE_S}
        title = "Ceiling predicted at 1 worker against 2 workers"
        doc = published.document("ceiling", title, figures(rows), settings)
        doc["rows"] = [{k: None if v != v else v for k, v in asdict(r).items()} for r in rows]  # NaN: null
        print(f"wrote {published.write(doc, results)} (results)", file=out)
    return 0 if all(r.holds for r in rows) else 1
