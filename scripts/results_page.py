#!/usr/bin/env python3
"""Make docs/results.md from the result files in bench/results/ (`make results-page`).

Each result file is one run of one benchmark (kvprof/bench/published.py
writes them). The page shows, per benchmark, the latest value of each
figure with its spread, and the command, machine and settings that made it.
Nothing on the page is typed by hand: change the data or this script, then
run it again. `--check` exits 1 when the page differs from what the data
gives (tests/test_results_page.py runs it).

    python3 scripts/results_page.py [--results bench/results] [--out docs/results.md] [--check]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# (file name prefix, heading, what it measures, how to run it); the page's order.
SECTIONS = (
    (
        "overhead",
        "Overhead",
        "What kvprof costs the server it watches: the server's own throughput (`stats`) with the tool "
        "attached against without, as a ratio (1.000: no cost).",
        "sudo .venv/bin/python bench/overhead.py --mode toggle --pairs 250",
    ),
    (
        "attach-time",
        "Attach time",
        "Seconds from starting the command to every collector attached (and, for `top`, to its first "
        "finding on screen), with kvcached under the demo load.",
        "sudo .venv/bin/python bench/attach_time.py --runs 5",
    ),
    (
        "bench-whatif",
        "What-if: predicted against measured",
        "Each fix's gain as kvprof predicts it from a profile, against the gain measured by switching "
        "the fix on and off on the same server (kvcached's `site` command): how far kvprof's numbers "
        "can be trusted.",
        "sudo kvprof bench --scenario whatif --results bench/results",
    ),
    (
        "lockwait-accuracy",
        "Lock waits against an exact tracer",
        "kvprof's LOCKS total over bpftrace's exact figure for the same threads and window (a switch-out "
        "asleep in a lock's futex wait until back on a CPU), with every wait timed (`--offcpu-hz 0`) and "
        "sampled (the default), the ±90 % interval the report states for a sampled figure, and how "
        "often that interval held bpftrace's figure.",
        "sudo .venv/bin/python bench/lockwait_accuracy.py --runs=5",
    ),
    (
        "ceiling",
        "Ceiling: predicted against reached",
        "The ceiling kvprof predicts from a recording of kvcached at one worker (its first rung, the "
        "topkeys mutex), over the throughput two workers reach, with and without a slower topkeys "
        "critical section (`--topkeys-hold-ns`); beside it plain scaling, twice one worker's throughput.",
        "sudo kvprof bench --scenario ceiling --runs=3 --results bench/results",
    ),
    (
        "bench-",
        "kvprof bench",
        "Server variants under kvload, interleaved rounds; ratios are each variant's median per-round "
        "ratio to its group's first variant.",
        "kvprof bench --scenario SCENARIO --results bench/results",
    ),
    (
        "flamegraph-speed",
        "Flame graph speed",
        "A synthetic profile of 1,000,000 samples over 100,000 distinct stacks written as an SVG flame "
        "graph.",
        ".venv/bin/python bench/flamegraph_speed.py",
    ),
)


def load(directory: Path) -> list[dict]:
    docs = []
    for path in sorted(directory.glob("*.json")):
        doc = json.loads(path.read_text())
        if doc.get("format") != "kvprof-result":
            raise SystemExit(f"results_page: {path}: not a kvprof result file")
        doc["_file"] = path.name
        docs.append(doc)
    return docs


def section_of(bench: str) -> int:
    for i, (prefix, *_rest) in enumerate(SECTIONS):
        if bench.startswith(prefix):
            return i
    return len(SECTIONS)


def number(x: float) -> str:
    if x == int(x) and abs(x) >= 100:
        return f"{int(x):,}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.4g}" if abs(x) < 10 else f"{x:.3g}"


def ratio(x: float) -> str:
    return f"{x:.3f}"


def value(f: dict) -> str:
    unit = f.get("unit", "")
    if unit == "x":
        return f"{ratio(f['value'])}x"
    sep = "" if unit in ("x", "%") else " "
    return f"{number(f['value'])}{sep}{unit}"


def spread(f: dict) -> str:
    parts = []
    if "low" in f and "high" in f:
        show = ratio if f.get("unit") == "x" else number
        parts.append(f"{show(f['low'])}-{show(f['high'])}")
    if f.get("spread"):
        parts.append(f["spread"])
    return " ".join(parts) if parts else "-"


# options that say only where a run wrote its files, left out of the command shown
WHERE_WRITTEN = r"(?:-o|--out|--results)"


def command(text: str) -> str:
    """The command as shown: `--runs=N` for `--runs N` (the same to argparse), so that a
    run count never reads as a reference to a numbered run; without the options that say
    where the files went, and with any other path outside the checkout as its file name."""
    text = re.sub(rf" {WHERE_WRITTEN}[ =]\S+", "", text)
    text = re.sub(r"(?<![\w.])/\S*/([^/\s]+)", r"\1", text)
    return re.sub(r"--runs (\d+)", r"--runs=\1", text)


def when(doc: dict) -> str:
    return doc["date"][:16].replace("T", " ") + " UTC"


def machine(doc: dict) -> str:
    m = doc.get("machine", {})
    cpus = m.get("cpu_count", "?")
    model = m.get("cpu_model_name", "")
    kernel = m.get("kernel", "")
    load_avg = m.get("load_avg_1min")
    text = f"{cpus} CPUs" + (f", {model}" if model else "") + (f", kernel {kernel}" if kernel else "")
    if load_avg is not None:
        text += f", load {load_avg:g} at the end"
    return text


def settings(doc: dict) -> str:
    items = [
        f"{k} {v if not isinstance(v, list) else ','.join(map(str, v))}" for k, v in doc["settings"].items()
    ]
    return "; ".join(items) if items else "defaults"


def bench_block(docs: list[dict]) -> list[str]:
    """One benchmark: its documents newest first, each with the figures no newer one has."""
    lines: list[str] = []
    shown: set[str] = set()
    for doc in sorted(docs, key=lambda d: (d["date"], d["_file"]), reverse=True):
        figures = [f for f in doc["figures"] if f["name"] not in shown]
        if not figures:
            continue
        shown.update(f["name"] for f in figures)
        lines += [
            f"`{command(doc['command'])}`, {when(doc)}, kvprof {doc['kvprof_version']}",
            "",
            f"- machine: {machine(doc)}",
            f"- settings: {settings(doc)}",
        ]
        if doc.get("source"):
            lines.append(f"- source: {doc['source']}")
        if doc.get("note"):
            lines.append(f"- note: {doc['note']}")
        lines += ["", "| figure | value | spread | n |", "| --- | --- | --- | --- |"]
        lines += [f"| {f['name']} | {value(f)} | {spread(f)} | {f.get('n', '-')} |" for f in figures]
        lines.append("")
    return lines


def render(docs: list[dict]) -> str:
    lines = [
        "# Results",
        "",
        "<!-- generated by scripts/results_page.py from bench/results/*.json: `make results-page` -->",
        "",
        "What kvprof costs and how far its numbers hold, as measured; every figure here comes from a",
        "result file in [bench/results/](../bench/results/), written by the benchmark named above it.",
        "For each benchmark the latest value of each figure is shown, with its spread (what the range is",
        "says beside it) and n, the number of measurements it summarises. Timings depend on the",
        "machine and on what else runs on it: the machine line says what it was. Files with a `source`",
        "were converted from measurements recorded in the docs before results were kept as data.",
        "",
    ]
    by_section: dict[int, dict[str, list[dict]]] = {}
    for doc in docs:
        by_section.setdefault(section_of(doc["bench"]), {}).setdefault(doc["bench"], []).append(doc)
    for i, (_prefix, heading, what, how) in enumerate(SECTIONS):
        lines += [f"## {heading}", "", what, "", f"Run: `{how}`", ""]
        benches = by_section.get(i, {})
        if not benches:
            lines += ["No results yet.", ""]
        for bench in sorted(benches):
            lines += [f"### {bench}", "", *bench_block(benches[bench])]
    others = by_section.get(len(SECTIONS), {})
    if others:
        lines += ["## Other", ""]
        for bench in sorted(others):
            lines += [f"### {bench}", "", *bench_block(others[bench])]
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "results.md")
    ap.add_argument("--check", action="store_true", help="exit 1 when the page is not what the data gives")
    a = ap.parse_args()
    page = render(load(a.results))
    if a.check:
        current = a.out.read_text() if a.out.exists() else ""
        if current != page:
            print(f"results_page: {a.out} is out of date: run `make results-page`", file=sys.stderr)
            return 1
        return 0
    a.out.write_text(page)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
