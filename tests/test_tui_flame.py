"""`kvprof top`'s Flame view (7) driven through Textual's run_test (no root).

The replay of the committed fixture, as in tests/test_tui.py; a small source
that grows a cumulative profile poll by poll stands in for a live target
where diff mode needs a previous window.
"""

from __future__ import annotations

import copy
from pathlib import Path

from support import FIXTURES, FLAME_VIEW, TOP_BASELINE, drive, top_app, until
from textual.pilot import Pilot
from textual.widgets import TabbedContent

from kvprof.model.profile import CpuStack, Profile, Window
from kvprof.tui.app import TopApp
from kvprof.tui.data import RECENT_SAMPLES, Sample
from kvprof.tui.flame import FlameGraph, FlamePanel
from kvprof.tui.sources import ReplaySource


def replay(tmp_path: Path, baseline: Profile | None = None) -> TopApp:
    return top_app(out_dir=tmp_path, baseline=baseline)


def status(app: TopApp) -> str:
    return str(app.query_one("#flame-status").render())


def head(app: TopApp) -> str:
    return str(app.query_one("#flame-head").render())


def test_view_7_draws_the_root_to_leaf_path(tmp_path: Path) -> None:
    """Key 7 shows the icicle: worker_main above process_commands, update_topkeys drawn,
    the graph focused."""
    app = replay(tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        assert app.query_one(TabbedContent).active == "flame"
        graph = app.query_one(FlameGraph)
        assert app.focused is graph
        ic = graph.icicle()
        assert ic is not None and len(ic.rows) >= 5
        rows = {s.name: len(s.path) for s in ic.spans()}
        assert rows["worker_main"] < rows["process_commands"] < rows["update_topkeys"]
        assert "all  211 samples, 100% of the total" in status(app)
        assert str(app.query_one("#flame-hot").render()).startswith("★ update_topkeys 10.0% · ")

    drive(app, script, (80, 24), FLAME_VIEW)


def test_enter_zooms_and_escape_restores(tmp_path: Path) -> None:
    """Down to process_commands, Enter: it spans the full width; Escape: the whole graph again;
    a second Escape falls through to the app (clears the filter)."""
    app = replay(tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        graph = app.query_one(FlameGraph)
        width = graph.icicle().width  # type: ignore[union-attr]
        for _ in range(4):
            await pilot.press("down")
        assert graph.selected == ("start_thread", "worker_main", "conn_event", "process_commands")
        await pilot.press("enter")
        ic = graph.icicle()
        assert ic is not None and ic.zoom == graph.selected
        (span,) = ic.rows[4]
        assert (span.name, span.col, span.width) == ("process_commands", 0, width)
        assert all(s.caller for r in ic.rows[:4] for s in r)
        assert "of process_commands" in status(app)
        await pilot.press("escape")
        ic = graph.icicle()
        assert ic is not None and ic.zoom == () and ic.rows[4][0].width < width
        await pilot.press("up")
        assert graph.selected == ("start_thread", "worker_main", "conn_event")
        await pilot.press("escape")  # not zoomed: the app's binding
        assert app.query_one(TabbedContent).active == "flame"

    drive(app, script, (132, 40), FLAME_VIEW)


def test_zoom_survives_a_refresh(tmp_path: Path) -> None:
    """A new frame keeps the zoomed frame and the selection (they are call paths)."""
    app = replay(tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        graph = app.query_one(FlameGraph)
        for key in ("down", "down", "enter"):
            await pilot.press(key)
        assert app.frame is not None
        new = copy.copy(app.frame)
        new.recent = copy.deepcopy(app.frame.recent)
        app.query_one(FlamePanel).show(new, "")
        await pilot.pause()
        ic = graph.icicle()
        assert ic is not None and ic.zoom == ("start_thread", "worker_main") == graph.selected
        assert ic.rows[2][0].width == ic.width

    drive(app, script, (132, 40), FLAME_VIEW)


def test_slash_highlights_and_gives_the_share(tmp_path: Path) -> None:
    """`/topkeys`: the status line gives the share of the samples under a matching frame."""
    app = replay(tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("slash", *"topkeys", "enter")
        await pilot.pause()
        assert "/topkeys/ 10.0% of the total" in status(app)  # 21 of the 211 samples
        assert app.query_one(TabbedContent).active == "flame"
        assert app.focused is app.query_one(FlameGraph)

    drive(app, script, (132, 40), FLAME_VIEW)


def test_t_cycles_threads_and_o_kinds_in_the_view(tmp_path: Path) -> None:
    """t goes to one thread (busiest first) and back to all, o through cpu, offcpu, locks; the view stays."""
    app = replay(tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        panel = app.query_one(FlamePanel)
        graph = app.query_one(FlameGraph)
        seen = []
        for _ in range(3):
            await pilot.press("t")
            seen.append((panel.tid, graph.flame.total if graph.flame else 0))
        assert seen == [("30761", 110), ("30760", 101), (None, 211)]
        assert app.query_one(TabbedContent).active == "flame"
        kinds = []
        for _ in range(3):
            await pilot.press("o")
            kinds.append((panel.kind, head(app).split(" · ")[0]))
        assert kinds == [("offcpu", "off-CPU"), ("locks", "lock wait"), ("cpu", "on-CPU")]

    drive(app, script, (132, 40), FLAME_VIEW)


def test_f_writes_the_kind_shown(tmp_path: Path) -> None:
    """`f` in the Flame view writes the SVG of the kind it shows."""
    app = replay(tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("o", "o", "f")
        assert await until(pilot, lambda: bool(app.written))

    drive(app, script, (132, 40), FLAME_VIEW)
    assert "-locks-" in app.written[0].name


def test_diff_without_a_previous_window_says_so(tmp_path: Path) -> None:
    """A replay is one window: d says there is nothing yet to compare with, and draws the plain colours."""
    app = replay(tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("d")
        assert "diff: no previous window yet" in head(app)
        assert app.query_one(FlameGraph).base is None

    drive(app, script, (132, 40), FLAME_VIEW)


def test_diff_against_a_baseline(tmp_path: Path) -> None:
    """With --baseline, d compares with it: the status line gives the frame's share there."""
    base = Profile.load(FIXTURES / "flame-fixed.json")
    app = replay(tmp_path, base)

    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("d", "down")
        assert "diff vs baseline" in head(app)
        graph = app.query_one(FlameGraph)
        assert graph.base is not None and graph.base.total == sum(s.count for s in base.oncpu)
        # the fixture's stacks start at start_thread, the newer recording's at clone3
        assert "start_thread" in status(app) and "was 0.0%" in status(app)

    drive(app, script, (132, 40), FLAME_VIEW)


class GrowingSource(ReplaySource):
    """A live-like target: one interval more of the fixture's stacks at every poll."""

    live = True

    def __init__(self) -> None:
        super().__init__(TOP_BASELINE)
        self.label = "live"
        self.polls = 0

    def poll(self) -> list[Sample]:
        self.polls += 1
        p = copy.deepcopy(self.profile)
        k = self.polls
        p.window = Window(self.profile.window.start, float(k))
        p.oncpu = [CpuStack(s.tid, s.frames, s.count * k) for s in self.profile.oncpu]
        for th in p.threads.values():
            th.cpu_samples *= k
        return [Sample(float(k), p)]


def test_diff_against_the_previous_window(tmp_path: Path) -> None:
    """Live, d compares the recent window with the one before it, once that has passed."""
    source = GrowingSource()
    app = top_app(source, interval=0.05, out_dir=tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("d")
        panel = app.query_one(FlamePanel)
        assert await until(pilot, lambda: source.polls > 2 * RECENT_SAMPLES + 1)
        await pilot.pause(0.2)
        assert f"diff vs the {RECENT_SAMPLES} s before" in head(app)
        graph = app.query_one(FlameGraph)
        assert graph.base is not None and graph.flame is not None
        assert graph.base.total == graph.flame.total  # the same pace in both windows
        assert panel.previous() is panel.windows[0]

    drive(app, script, (132, 40), FLAME_VIEW)


def test_a_refresh_with_the_same_data_lays_nothing_out(tmp_path: Path) -> None:
    """The same window again keeps the layout; only the rows on screen are ever styled."""
    app = replay(tmp_path)

    async def script(pilot: Pilot[None]) -> None:
        graph = app.query_one(FlameGraph)
        panel = app.query_one(FlamePanel)
        first = graph.icicle()
        assert first is not None and app.frame is not None
        panel.show(app.frame, "")
        await pilot.pause()
        assert graph.icicle() is first
        assert len(first.rows) > graph.size.height  # the fixture's stacks are deeper than the screen
        assert await until(pilot, lambda: bool(graph._strips))
        assert max(graph._strips) < graph.size.height

    drive(app, script, (80, 24), FLAME_VIEW)
