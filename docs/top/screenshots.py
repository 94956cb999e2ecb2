"""Regenerate the screenshots in docs/top/ (docs/top.md): every view of a live `kvprof top`.

Starts kvcached (baseline preset, 2 workers) under kvprof's demo load, runs
the real app on a live source at 132x40 until every collector is attached
and a few more seconds have passed, saves an SVG of each view (Textual's own
screenshot), and turns each into a PNG with headless Chromium (Debian's
`chromium`, which provision.sh installs). Needs root.

    sudo .venv/bin/python docs/top/screenshots.py
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from kvprof.system import demo  # noqa: E402
from kvprof.system.servers import start_kvcached  # noqa: E402
from kvprof.tui.app import VIEWS, TopApp  # noqa: E402
from kvprof.tui.sources import LiveSource  # noqa: E402

SIZE = (132, 40)
SETTLE_S = 8.0  # after the last collector attached: the "recent" window is full by then


def to_png(svg: Path) -> Path:
    """The SVG as a PNG of the same size, drawn by headless Chromium."""
    width, height = (
        round(float(v))
        for v in re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg.read_text()).groups()  # type: ignore[union-attr]
    )
    png = svg.with_suffix(".png")
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={width},{height}", f"--screenshot={png}", svg.as_uri()],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return png


async def shoot(app: TopApp, source: LiveSource) -> list[Path]:
    out = []
    async with app.run_test(size=SIZE) as pilot:
        while source.attaching() or not app.frames:
            await pilot.pause(0.5)
        await pilot.pause(SETTLE_S)
        await pilot.press("p")  # hold still while the views are saved
        for i, (view, _) in enumerate(VIEWS, 1):
            await pilot.press(str(i))
            await pilot.pause(0.3)
            name = f"top-{view}.svg"
            app.save_screenshot(name, str(HERE))
            out.append(HERE / name)
        await pilot.press("q")
    return out


def main() -> int:
    server = start_kvcached(["--preset", "baseline", "-t", "2"])
    load = demo.start_load(server.address, None)
    try:
        time.sleep(1.0)
        source = LiveSource(server.pid)
        app = TopApp(source, clock=time.time)
        svgs = asyncio.run(shoot(app, source))
        app.wait_closed()
    finally:
        load.stop()
        load.cleanup()
        server.stop()
        server.log_path.unlink(missing_ok=True)
    for svg in svgs:
        png = to_png(svg)
        svg.unlink()
        print(f"wrote {png.relative_to(HERE.parent.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
