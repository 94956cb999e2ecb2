"""Snapshots of `kvprof top` (pytest-textual-snapshot): Overview and Cache lines at 80x24 and 132x40.

Deterministic: the replay of the committed fixture (fixed data), a frozen
clock, fixed terminal sizes. After an intended change of the screen, look at
the new pictures (`pytest tests/test_tui_snapshots.py --snapshot-report`)
and accept them with `--snapshot-update`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from kvprof.tui.app import TopApp
from kvprof.tui.sources import ReplaySource

FIXTURE = Path(__file__).parent / "fixtures" / "top-baseline.json"
FROZEN = 1_800_000_000.0


def app() -> TopApp:
    return TopApp(ReplaySource(FIXTURE), interval=1.0, out_dir="/nonexistent", clock=lambda: FROZEN)


async def ready(pilot: Pilot[None]) -> None:
    """Wait for the first frame, as a person would before looking."""
    top = pilot.app
    assert isinstance(top, TopApp)
    for _ in range(200):
        if top.frames:
            break
        await pilot.pause(0.05)
    assert top.frames, top.error
    await pilot.pause()


@pytest.mark.parametrize("size", [(80, 24), (132, 40)], ids=["80x24", "132x40"])
@pytest.mark.parametrize("keys", [pytest.param([], id="overview"), pytest.param(["4"], id="cachelines")])
def test_snapshot(snap_compare: Callable[..., bool], keys: list[str], size: tuple[int, int]) -> None:
    """The view at this size looks as accepted: findings named and ranked, the socket matrix drawn."""
    assert snap_compare(app(), press=keys, terminal_size=size, run_before=ready)
