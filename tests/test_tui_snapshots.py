"""Snapshots of `kvprof top` (pytest-textual-snapshot): Overview, Cache lines and Flame at 80x24
and 132x40, and the Flame view zoomed, on one thread and in diff mode.

Deterministic: the replay of the committed fixture (fixed data), a frozen
clock, fixed terminal sizes. After an intended change of the screen, look at
the new pictures (`pytest tests/test_tui_snapshots.py --snapshot-report`)
and accept them with `--snapshot-update`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support import FIXTURES, FLAME_VIEW, TOP_BASELINE, first_frame, show_view, top_app
from textual.pilot import Pilot

from kvprof.model.profile import Profile
from kvprof.tui.app import TopApp
from kvprof.tui.sources import ReplaySource

FLAME_BASELINE, FLAME_FIXED = FIXTURES / "flame-baseline.json", FIXTURES / "flame-fixed.json"


@pytest.mark.parametrize("size", [(80, 24), (132, 40)], ids=["80x24", "132x40"])
@pytest.mark.parametrize("keys", [pytest.param([], id="overview"), pytest.param(["4"], id="cachelines")])
def test_snapshot(snap_compare: Callable[..., bool], keys: list[str], size: tuple[int, int]) -> None:
    """The view at this size looks as accepted: findings named and ranked, the socket matrix drawn."""
    assert snap_compare(top_app(), press=keys, terminal_size=size, run_before=first_frame)


async def on_flame(pilot: Pilot[None]) -> None:
    """The first frame, then view 7."""
    await first_frame(pilot)
    await show_view(pilot, *FLAME_VIEW)


def flame_app(path: Path = TOP_BASELINE, baseline: Path | None = None) -> TopApp:
    source = ReplaySource(path)
    # colours by module read the recorded binary when it is there: not on every machine
    source.profile.target.exe = ""
    return top_app(source, baseline=Profile.load(baseline) if baseline is not None else None)


@pytest.mark.parametrize("size", [(80, 24), (132, 40)], ids=["80x24", "132x40"])
def test_flame_snapshot(snap_compare: Callable[..., bool], size: tuple[int, int]) -> None:
    """View 7: the icicle of the replay, root at the top, worker_main above process_commands."""
    assert snap_compare(flame_app(), terminal_size=size, run_before=on_flame)


@pytest.mark.parametrize(
    "keys",
    [
        pytest.param(["down", "down", "down", "down", "enter"], id="zoom"),
        pytest.param(["t"], id="thread"),
        pytest.param(["o", "o"], id="locks"),
    ],
)
def test_flame_keys_snapshot(snap_compare: Callable[..., bool], keys: list[str]) -> None:
    """Enter zooms (process_commands spans the width, its callers dimmed above), t shows
    one thread, o o lock waits."""
    assert snap_compare(flame_app(), press=keys, terminal_size=(132, 40), run_before=on_flame)


def test_flame_diff_snapshot(snap_compare: Callable[..., bool]) -> None:
    """d against --baseline: the baseline preset's recording coloured by change from the fixed one's."""
    app = flame_app(FLAME_BASELINE, FLAME_FIXED)
    assert snap_compare(app, press=["d"], terminal_size=(132, 40), run_before=on_flame)
