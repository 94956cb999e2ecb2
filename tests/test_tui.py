"""`kvprof top` driven through Textual's run_test on the replay of a recorded profile.

The app is the production one (`TopApp`) over `ReplaySource` on the committed
fixture (tests/fixtures/top-baseline.json, a real recording of kvcached's
baseline preset under load); a small in-test source stands in for a target
that exits, which needs no root.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

from support import KVPROF, TOP_BASELINE, drive, halved, reaped, top_app, until
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Static, TabbedContent

from kvprof.tui.app import VIEWS as ALL_VIEWS
from kvprof.tui.app import FindingScreen, HelpScreen, TopApp
from kvprof.tui.data import Sample
from kvprof.tui.sources import ReplaySource
from kvprof.tui.widgets import OverviewPanel, StacksPanel

VIEWS = ("overview", "stacks", "locks", "lines", "threads", "requests")
TABLES = {
    "overview": "#ov-findings",
    "stacks": "#stacks-table",
    "locks": "#locks-table",
    "lines": "#lines-table",
    "threads": "#threads-table",
    "requests": "#requests-table",
}


def rows(app: TopApp, view: str) -> list[str]:
    table = app.query_one(TABLES[view], DataTable)
    return [" ".join(str(c) for c in table.get_row_at(i)) for i in range(table.row_count)]


def test_every_view_renders_and_number_keys_and_tabs_switch(tmp_path: Path) -> None:
    """Keys 1-6 switch to each view, and each draws rows from the replayed profile;
    the tabs answer the mouse as well."""
    app = top_app(out_dir=tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        for i, view in enumerate(VIEWS, 1):
            await pilot.press(str(i))
            await pilot.pause()
            assert app.query_one(TabbedContent).active == view
            assert await until(pilot, lambda v=view: bool(rows(app, v))), view  # type: ignore[misc]
        await pilot.click("#--content-tab-locks")
        await pilot.pause()
        assert app.query_one(TabbedContent).active == "locks"
        assert any("update_topkeys" in r for r in rows(app, "overview"))
        assert any("topkeys" in r for r in rows(app, "locks"))
        assert {"account_memory", "collect_timings", "on_create_item"} <= {
            r.split()[1] for r in rows(app, "lines")
        }
        matrix = str(app.query_one("#lines-matrix", Static).render())
        assert "socket → socket" in matrix

    drive(app, script)


def test_a_view_key_right_after_the_first_frame_is_kept() -> None:
    """A view's key, pressed once as soon as the first frame is drawn, shows that view and
    it stays: nothing of the Overview it left takes the tabs back (three views, each in a
    fresh app: the race it pins lost most such presses)."""

    async def press_early(app: TopApp, key: str) -> str:
        async with app.run_test(size=(132, 40)) as pilot:
            assert await until(pilot, lambda: app.frames > 0), app.error
            await pilot.press(key)
            await pilot.pause(0.5)
            return app.query_one(TabbedContent).active

    keys = {view: str(i) for i, (view, _) in enumerate(ALL_VIEWS, 1)}
    views = ("stacks", "threads", "flame")
    shown = {view: asyncio.run(press_early(top_app(), keys[view])) for view in views}
    assert shown == {view: view for view in views}


def test_pause_stops_refreshing_and_resume_restarts(tmp_path: Path) -> None:
    """p freezes the screen (no polls, PAUSED in the status bar); p again resumes."""
    app = top_app(interval=0.2, out_dir=tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("p")
        assert app.paused
        assert "PAUSED" in str(app.query_one("#status", Static).render())
        await pilot.pause(0.3)  # a poll in flight when p was pressed lands
        polls = app.polls
        await pilot.pause(0.8)
        assert app.polls == polls
        await pilot.press("p")
        assert not app.paused
        assert await until(pilot, lambda: app.polls > polls)

    drive(app, script)


def test_filter_narrows_rows_and_escape_clears_it(tmp_path: Path) -> None:
    """/ then text keeps only the matching rows; Escape brings them all back."""
    app = top_app(out_dir=tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("2")
        await pilot.pause()
        everything = rows(app, "stacks")
        await pilot.press("slash")
        assert app.query_one("#filter", Input).has_focus
        await pilot.press(*"topkeys")
        await pilot.pause()
        narrowed = rows(app, "stacks")
        assert narrowed and len(narrowed) < len(everything)
        assert all("topkeys" in r for r in narrowed)
        await pilot.press("enter")
        assert "filter: topkeys" in str(app.query_one("#status", Static).render())
        await pilot.press("escape")
        await pilot.pause()
        assert len(rows(app, "stacks")) == len(everything)

    drive(app, script)


def test_thread_key_narrows_stacks_to_one_thread(tmp_path: Path) -> None:
    """t cycles the Stacks view through the busiest threads."""
    app = top_app(out_dir=tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("2", "t")
        await pilot.pause()
        assert app.query_one(StacksPanel).tid is not None
        assert "kv-worker" in str(app.query_one("#stacks-head", Static).render())

    drive(app, script)


def test_enter_on_a_finding_shows_its_explanation_and_fix(tmp_path: Path) -> None:
    """Highlighting a finding explains it below; Enter opens everything about it."""
    app = top_app(out_dir=tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        table = app.query_one("#ov-findings", DataTable)
        first = app.query_one(OverviewPanel).rows[str(table.coordinate_to_cell_key((0, 0)).row_key.value)]
        detail = str(app.query_one("#ov-detail", Static).render())
        assert "Why:" in detail and "Fix:" in detail and first.title in detail
        table.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, FindingScreen)
        assert app.screen.row.where == first.where
        await pilot.press("escape")
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)

    drive(app, script)


def test_s_writes_a_profile_that_report_reads(tmp_path: Path) -> None:
    """s saves the session so far; `kvprof report` reads it and names the topkeys lock."""
    app = top_app(out_dir=tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("s")
        assert await until(pilot, lambda: bool(app.written))

    drive(app, script)
    (saved,) = app.written
    assert saved.parent == tmp_path and saved.name.endswith(".json.gz")
    report = subprocess.run([*KVPROF, "report", str(saved)], capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    assert "update_topkeys" in report.stdout


def test_f_writes_a_flame_graph_svg(tmp_path: Path) -> None:
    """f exports the session so far as an SVG flame graph (locks from the Locks view)."""
    app = top_app(out_dir=tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("f")
        assert await until(pilot, lambda: len(app.written) == 1), app.error
        await pilot.press("3", "f")
        assert await until(pilot, lambda: len(app.written) == 2), app.error

    drive(app, script)
    cpu, locks = app.written
    assert "-cpu-" in cpu.name and "-locks-" in locks.name
    for svg in (cpu, locks):
        assert svg.suffix == ".svg" and "<svg" in svg.read_text()[:2000]
    assert "update_topkeys" in locks.read_text()


class EndingSource:
    """A target that is seen once, then gone: what the live source reports when it exits."""

    live = True
    title = "kvcached PID 4242"
    command = "kvcached -t 2"
    label = "live"
    pid = 4242

    def __init__(self) -> None:
        self.replay = ReplaySource(TOP_BASELINE)
        self.polls = 0
        self.closed = False

    def start(self) -> None:
        pass

    def poll(self) -> list[Sample]:
        self.polls += 1
        if self.polls == 1:
            return [Sample(4.0, halved(self.replay.profile))]
        if self.polls == 2:
            return [Sample(8.0, self.replay.profile, None, alive=False)]
        return []

    def close(self) -> None:
        self.closed = True

    def attaching(self) -> bool:
        return False

    def wait_change(self, timeout: float) -> None:
        pass

    def held(self) -> bool:
        return False


def test_target_exit_shows_a_banner_and_keeps_the_data(tmp_path: Path) -> None:
    """When the target exits a banner says so and the findings stay on screen."""
    source = EndingSource()
    app = top_app(source, interval=0.1, out_dir=tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        banner = app.query_one("#banner", Static)
        assert await until(pilot, lambda: banner.display and "exited" in str(banner.render()))
        assert "kvcached PID 4242 exited after 8 s" in str(banner.render())
        assert app.query_one(OverviewPanel).rows
        await pilot.press("q")

    drive(app, script)
    app.wait_closed()
    assert source.closed


def test_top_ends_when_its_terminal_goes_away_without_a_hangup() -> None:
    """A pseudo-terminal that is not top's controlling terminal closes (a harness or a
    multiplexer died): no SIGHUP comes, and top must still end instead of spinning."""
    import os
    import pty

    master, slave = pty.openpty()
    top = subprocess.Popen(
        [*KVPROF, "top", "--replay", str(TOP_BASELINE)], stdin=slave, stdout=slave, stderr=slave
    )
    with reaped(top) as proc:
        os.close(slave)
        drawn = b""
        deadline = time.monotonic() + 60
        while b"Overview" not in drawn and time.monotonic() < deadline and proc.poll() is None:
            drawn += os.read(master, 65536)
        assert b"Overview" in drawn, drawn[-500:]
        os.close(master)
        proc.wait(timeout=60)  # bounded: the check runs every second
        assert proc.returncode == 1
