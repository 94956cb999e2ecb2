"""A benchmark's results as one JSON file, the data docs/results.md is made from.

Every benchmark (bench/*.py, `kvprof bench --results DIR`) calls `write` once
at its end with a `document` of what it ran (the command, the settings) and what it found (figures,
each with its spread). The file names the machine and the kvprof version, so
a figure can always be traced to where and what measured it.
`scripts/results_page.py` turns the directory into the page. A file may
also carry a `source` (where figures converted from older records came from)
and a `note` (what the person who ran it knows of the machine at the time,
e.g. that it was shared), added by hand.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from kvprof import __version__
from kvprof.bench.machine import host_metadata

FORMAT = "kvprof-result"
VERSION = 1


@dataclass(frozen=True)
class Figure:
    """One measured figure: its value, and how far it spread (low/high and what they are)."""

    name: str
    value: float
    unit: str  # "x" (a ratio), "s", "ops/s", "%", ...
    low: float | None = None
    high: float | None = None
    spread: str = ""  # what low-high is: "IQR of 200 pairs", "min-max of 5", ...
    n: int | None = None  # how many measurements the value summarises

    @classmethod
    def median_of(cls, name: str, values: Sequence[float], unit: str, what: str, digits: int = 3) -> Figure:
        """The median of `values`, spread as their min-max ("min-max of 5 runs" with what="runs")."""
        return cls(
            name,
            round(statistics.median(values), digits),
            unit,
            round(min(values), digits),
            round(max(values), digits),
            f"min-max of {len(values)} {what}",
            len(values),
        )


def machine() -> dict[str, str | int | float]:
    """The machine as a result file names it: CPUs, model, kernel, load at the time."""
    return {**host_metadata(), "kernel": platform.release(), "load_avg_1min": round(os.getloadavg()[0], 2)}


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that ran, as a user would type it (the script's path relative to the checkout)."""
    args = list(sys.argv if argv is None else argv)
    if args and args[0].endswith(".py"):
        path = Path(args[0])
        args[0] = f"bench/{path.name}" if path.parent.name == "bench" else path.name
    elif args:
        args[0] = Path(args[0]).name
    return shlex.join(args)


def document(
    bench: str,
    title: str,
    figures: Sequence[Figure],
    settings: Mapping[str, object],
    command: str | None = None,
    date: str | None = None,
    source: str = "",
    machine_info: Mapping[str, object] | None = None,
    version: str | None = None,
) -> dict[str, object]:
    """The JSON document of one result (see `write`)."""
    doc: dict[str, object] = {
        "format": FORMAT,
        "version": VERSION,
        "bench": bench,
        "title": title,
        "date": date or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command if command is not None else command_line(),
        "kvprof_version": version or __version__,
        "machine": dict(machine_info) if machine_info is not None else machine(),
        "settings": dict(settings),
        "figures": [{k: v for k, v in asdict(f).items() if v not in (None, "")} for f in figures],
    }
    if source:
        doc["source"] = source
    return doc


def write(doc: dict[str, object], directory: Path) -> Path:
    """Write `doc` (from `document`) as DIRECTORY/<bench>-<UTC time>.json; its path."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = str(doc["date"]).replace("-", "").replace(":", "")
    path = directory / f"{doc['bench']}-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
