"""`kvprof bench --history FILE`: one JSON line per bench run, and the waterline.

Each line: the date, the scenario, and per variant its revision, commit,
median figures and CV; the last variant of the first group is the run's
"new" one (with `--rev A --rev B`, B). A new figure is judged against the
same workload's last HISTORY_WINDOW runs: the waterline is their median moved
by max(3 %, their CV), the rule of `kvprof.bench.stats`; there is no paired
test across runs, so a figure beyond the waterline is flagged without one.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvprof.bench import BenchError, stats

HISTORY_WINDOW = 5
# figure -> (whether more is better, how it is printed, decimals)
FIGURES = {"ops_per_sec": (True, "ops/s", 0), "instructions_per_op": (False, "instructions/op", 1)}


@dataclass(frozen=True)
class Entry:
    """One variant's figures in one run."""

    name: str
    workload: str  # the group title: what must match for two runs to be compared
    revision: str
    commit: str
    figures: dict[str, float]


def read(path: Path) -> list[dict[str, object]]:
    """The file's lines (none when it does not exist yet); BenchError on a broken line."""
    if not path.exists():
        return []
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise BenchError(f"--history {path}: line {n} is not JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise BenchError(f"--history {path}: line {n} is not a JSON object")
        out.append(record)
    return out


def _past(records: Sequence[dict[str, object]], workload: str, figure: str) -> list[float]:
    """The new variant's `figure` in the last runs of the same workload, oldest first."""
    values = []
    for record in records:
        new = record.get("new")
        if not isinstance(new, dict) or new.get("workload") != workload:
            continue
        value = new.get("figures", {}).get(figure) if isinstance(new.get("figures"), dict) else None
        if isinstance(value, int | float):
            values.append(float(value))
    return values[-HISTORY_WINDOW:]


def judge(value: float, past: Sequence[float], higher_is_better: bool) -> tuple[str, float, float]:
    """(verdict, median of the past, waterline's distance): UNSTABLE when the past's CV is
    above 10 %, REGRESSION / IMPROVEMENT beyond max(3 %, that CV), else no change."""
    mid, spread = stats.median(past), stats.cv(past)
    line = stats.waterline(spread)
    change = value / mid - 1 if mid else 0.0
    if not higher_is_better:
        change = -change
    if spread > stats.UNSTABLE_CV:
        return stats.UNSTABLE, mid, line
    if change < -line:
        return stats.REGRESSION, mid, line
    if change > line:
        return stats.IMPROVEMENT, mid, line
    return stats.NO_CHANGE, mid, line


def append(path: Path, scenario: str, entries: Sequence[Entry], new: Entry) -> list[str]:
    """Judge `new` against the file's last runs, append this run, return the lines to print."""
    records = read(path)
    lines = []
    for figure, (higher, what, digits) in FIGURES.items():
        if figure not in new.figures:
            continue
        past = _past(records, new.workload, figure)
        value = new.figures[figure]
        if not past:
            lines.append(
                f"history {path}: {new.name} {value:,.{digits}f} {what}, the first run of this workload"
            )
            continue
        verdict, mid, line = judge(value, past, higher)
        lines.append(
            f"history {path}: {new.name} {value:,.{digits}f} {what} vs the median of the last {len(past)} "
            f"runs {mid:,.{digits}f} (CV {100 * stats.cv(past):.1f} %, waterline +-{100 * line:.1f} %): "
            f"{verdict}"
        )
    record = {
        "date": datetime.datetime.now().isoformat(" ", "seconds"),
        "scenario": scenario,
        "new": _entry_json(new),
        "variants": [_entry_json(e) for e in entries],
    }
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    return lines


def _entry_json(e: Entry) -> dict[str, object]:
    return {
        "name": e.name,
        "workload": e.workload,
        "revision": e.revision,
        "commit": e.commit,
        "figures": e.figures,
    }
