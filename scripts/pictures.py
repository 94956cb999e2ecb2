#!/usr/bin/env python3
"""Make the pictures in the docs from the demo (`make pictures`); needs root.

1. kvcached (`--preset baseline`, 2 workers) under kvprof's demo load: the
   real `kvprof top` app on a live source at 132x40, every view saved once
   every collector is attached and the recent window is full (Textual's own
   SVG screenshot, turned into a PNG): docs/images/top-<view>.png.
2. `kvprof record -d RECORD_S --hz RECORD_HZ` of that server, then of the same server
   started `--preset fixed` under the same load; from them `kvprof flamegraph
   --kind cpu|offcpu|locks` of the baseline and `kvprof diff` baseline ->
   fixed (on-CPU): docs/images/flamegraph-<kind>.png, flamegraph-diff.png.

3. The ceiling ladder of that baseline recording (`kvprof report --json`'s
   `ceilings`): each serialized resource's ceiling on a log scale, lowest
   first, beside today's throughput: docs/images/ceiling-ladder.png.

SVGs become PNGs in headless Chromium (Debian's `chromium`, installed by
provision.sh), at the SVG's own size. Timings and counts in the pictures are
whatever the machine gave that minute.

    sudo .venv/bin/python scripts/pictures.py [--only top|flame]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvprof.system import demo  # noqa: E402
from kvprof.system.servers import Server, start_kvcached  # noqa: E402
from kvprof.tui.app import VIEWS, TopApp  # noqa: E402
from kvprof.tui.sources import LiveSource  # noqa: E402

IMAGES = REPO / "docs" / "images"
SIZE = (132, 40)
SETTLE_S = 8.0  # after the last collector attached: the "recent" window is full by then
RECORD_S = 8.0
RECORD_HZ = 499  # enough on-CPU samples in RECORD_S for a flame graph worth looking at
KVPROF = [sys.executable, "-m", "kvprof"]


def svg_size(svg: Path) -> tuple[int, int]:
    """The SVG's width and height in px, from its viewBox (Textual) or width/height (kvprof)."""
    head = svg.read_text()[:4000]
    box = re.search(r'viewBox="[-\d.]+ [-\d.]+ ([\d.]+) ([\d.]+)"', head)
    if box is None:
        raise SystemExit(f"pictures: {svg}: no viewBox")
    return round(float(box.group(1))), round(float(box.group(2)))


def to_png(svg: Path, png: Path) -> Path:
    """The SVG as a PNG of its own size, drawn by headless Chromium (quiet, offline)."""
    width, height = svg_size(svg)
    with tempfile.TemporaryDirectory() as home:
        subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={home}", "--host-resolver-rules=MAP * ~NOTFOUND",
             f"--window-size={width},{height}", f"--screenshot={png}", svg.as_uri()],
            check=True, capture_output=True, timeout=120, env={"HOME": home, "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
    print(f"wrote {png.relative_to(REPO)} ({width}x{height})", flush=True)
    return png


async def shoot(app: TopApp, source: LiveSource, out: Path) -> list[Path]:
    """Every view of the live app, as Textual SVGs in `out`."""
    svgs = []
    async with app.run_test(size=SIZE) as pilot:
        while source.attaching() or not app.frames:
            await pilot.pause(0.5)
        await pilot.pause(SETTLE_S)
        await pilot.press("p")  # hold still while the views are saved
        for i, (view, _) in enumerate(VIEWS, 1):
            await pilot.press(str(i))
            await pilot.pause(0.5)
            name = f"top-{view}.svg"
            app.save_screenshot(name, str(out))
            svgs.append(out / name)
        await pilot.press("q")
    return svgs


def top_pictures(server: Server, tmp: Path) -> None:
    source = LiveSource(server.pid)
    app = TopApp(source, clock=time.time)
    svgs = asyncio.run(shoot(app, source, tmp))
    app.wait_closed()
    for svg in svgs:
        to_png(svg, IMAGES / svg.with_suffix(".png").name)


def record(server: Server, out: Path) -> Path:
    subprocess.run(
        [
            *KVPROF,
            "record",
            "-p",
            str(server.pid),
            "-d",
            str(RECORD_S),
            "--hz",
            str(RECORD_HZ),
            "-o",
            str(out),
            "-q",
        ],
        check=True,
        timeout=300,
    )
    return out


def flame_pictures(baseline: Path, fixed: Path, tmp: Path) -> None:
    for kind in ("cpu", "offcpu", "locks"):
        svg = tmp / f"flamegraph-{kind}.svg"
        subprocess.run([*KVPROF, "flamegraph", str(baseline), "--kind", kind, "-o", str(svg)], check=True)
        to_png(svg, IMAGES / f"flamegraph-{kind}.png")
    svg = tmp / "flamegraph-diff.svg"
    subprocess.run([*KVPROF, "diff", str(baseline), str(fixed), "-o", str(svg)], check=True)
    to_png(svg, IMAGES / "flamegraph-diff.png")


LADDER_W, LADDER_ROW, LADDER_LEFT = 900, 34, 260


def ladder_svg(report: dict[str, object]) -> str:
    """The ceilings lowest first as bars on a log scale of ops/s, today's throughput a line."""
    rungs: list[dict[str, object]] = report["ceilings"]  # type: ignore[assignment]
    ops = float(report["throughput_ops_per_s"])  # type: ignore[arg-type]
    values = [float(r["ceiling_ops_per_s"]) for r in rungs]  # type: ignore[arg-type]
    lo, hi = math.log10(max(ops, 1) / 2), math.log10(max([*values, ops]) * 8)  # room for the labels
    width = LADDER_W - LADDER_LEFT - 20

    def x(v: float) -> float:
        return LADDER_LEFT + width * (math.log10(max(v, 1)) - lo) / (hi - lo)

    height = max(220, 60 + LADDER_ROW * len(rungs))  # Chromium draws nothing in a very short window
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LADDER_W}" height="{height}" '
           f'viewBox="0 0 {LADDER_W} {height}" font-family="DejaVu Sans, sans-serif" font-size="13">',
           f'<rect width="{LADDER_W}" height="{height}" fill="white"/>',
           '<text x="10" y="22" font-weight="bold">Where throughput stops scaling: '
           "each serialized resource's ceiling (ops/s, log scale)</text>"]  # fmt: skip
    for i, (r, v) in enumerate(zip(rungs, values, strict=True)):
        y = 40 + i * LADDER_ROW
        out.append(f'<text x="10" y="{y + 18}">{r["resource"]}</text>')
        out.append(f'<rect x="{LADDER_LEFT}" y="{y + 4}" width="{x(v) - LADDER_LEFT:.1f}" height="20" '
                   f'fill="{"#d9534f" if i == 0 else "#f0ad4e"}"/>')  # fmt: skip
        threads = float(r["binds_at_threads"])  # type: ignore[arg-type]
        out.append(f'<text x="{x(v) + 6:.1f}" y="{y + 18}">{v:,.0f} (~{threads:,.0f} threads)</text>')
    out.append(f'<line x1="{x(ops):.1f}" y1="34" x2="{x(ops):.1f}" y2="{height - 8}" stroke="#337ab7" '
               'stroke-width="2" stroke-dasharray="4 3"/>')  # fmt: skip
    out.append(f'<text x="{x(ops) + 4:.1f}" y="{height - 10}" fill="#337ab7">today {ops:,.0f} ops/s</text>')
    return "\n".join([*out, "</svg>"])


def ladder_picture(baseline: Path, tmp: Path) -> None:
    report = subprocess.run([*KVPROF, "report", "--json", str(baseline)], check=True, capture_output=True,
                            text=True).stdout  # fmt: skip
    svg = tmp / "ceiling-ladder.svg"
    svg.write_text(ladder_svg(json.loads(report)))
    to_png(svg, IMAGES / "ceiling-ladder.png")


def under_load(preset: str, then: list[Callable[[Server], object]]) -> None:
    """kvcached at `preset` under the demo load while each of `then` runs with the server."""
    server = start_kvcached(["--preset", preset, "-t", "2"])
    load = demo.start_load(server.address, None)
    try:
        time.sleep(2.0)  # kvload populates its keys first
        for step in then:
            step(server)
    finally:
        load.stop()
        load.cleanup()
        server.stop()
        server.log_path.unlink(missing_ok=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("top", "flame"), help="one kind of picture")
    a = ap.parse_args()
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvprof-pictures-") as name:
        tmp = Path(name)
        steps: list[Callable[[Server], object]] = []
        if a.only != "flame":
            steps.append(lambda s: top_pictures(s, tmp))
        if a.only != "top":
            steps.append(lambda s: record(s, tmp / "baseline.json.gz"))
        under_load("baseline", steps)
        if a.only != "top":
            under_load("fixed", [lambda s: record(s, tmp / "fixed.json.gz")])
            flame_pictures(tmp / "baseline.json.gz", tmp / "fixed.json.gz", tmp)
            ladder_picture(tmp / "baseline.json.gz", tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
