"""The `kvprof top` application: tabs of views over one source.

Refreshes follow STYLE.md: a thread worker polls the source and builds the
Frame (reading BPF maps and ranking findings take milliseconds to tens of
them), the UI thread only draws it, and the next poll is armed by a
one-shot timer once a frame is drawn, so polls never overlap. While a modal
screen is open the frame is kept and drawn when it closes.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Input, Static, TabbedContent, TabPane

from kvprof.analysis.own_cost import own_cost_line
from kvprof.collect import TOP_INTERVAL_S
from kvprof.model.profile import Profile
from kvprof.system.attach import end_yield, starved_note
from kvprof.tui import data
from kvprof.tui.data import Frame, Timeline, build_frame, num, pct, profile_to_save
from kvprof.tui.flame import FlamePanel
from kvprof.tui.sources import Source
from kvprof.tui.widgets import (
    Line,
    LinesPanel,
    LocksPanel,
    OverviewPanel,
    Panel,
    RequestsPanel,
    StacksPanel,
    ThreadsPanel,
)

VIEWS = (
    ("overview", "Overview"),
    ("stacks", "Stacks"),
    ("locks", "Locks"),
    ("lines", "Cache lines"),
    ("threads", "Threads"),
    ("requests", "Requests"),
    ("flame", "Flame"),
)
# the flame graph `f` writes from each view (kvprof.export KINDS)
FLAME_KIND = {"locks": "locks", "threads": "offcpu"}

HELP = """\
[b]kvprof top[/b] — where a cache server loses its throughput, live

[b]Views[/b] (number keys, or click a tab)
  1 Overview     target, ops/s, CPU per thread, findings ranked by cost
  2 Stacks       top functions by self and total share (t: one thread)
  3 Locks        contended locks per call site: waits/s, wait ms/s, p99
  4 Cache lines  shared counters: updates/s, cycles, transfers, sockets
  5 Threads      CPU, sockets, lock wait, off-CPU, top function
  6 Requests     server-side latency percentiles per opcode
  7 Flame        flame graph of the last few seconds: arrows move, Enter
                 zooms, Backspace/Esc zooms out, o on-CPU/off-CPU/locks,
                 t one thread, d diff (previous window or --baseline)

[b]Keys[/b]
  q  quit             p  pause / resume      ?  this help
  /  filter rows      s  save a profile      f  flame graph (SVG)
  r  reset counters   ↑↓ move    Enter  details (a finding, a thread)

Findings and rates cover the last few seconds; "all" columns and `s`
cover the time since start (or since r). ★ marks known contention spots.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static(HELP, id="help-text")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


def _resume_only_after_suspend() -> None:
    """Textual's terminal driver sets the terminal up again on every SIGCONT, as if
    Ctrl+Z had suspended it: after a plain SIGSTOP and SIGCONT (a debugger, a
    benchmark pausing kvprof, `kill -STOP`) it started another input thread each
    time, and `q` no longer quit. SIGCONT now resumes only what SIGTSTP suspended."""
    tstp, cont = signal.getsignal(signal.SIGTSTP), signal.getsignal(signal.SIGCONT)
    if not callable(tstp) or not callable(cont):
        return
    suspended = threading.Event()

    def on_tstp(signum: int, frame: FrameType | None) -> None:
        suspended.set()
        tstp(signum, frame)

    def on_cont(signum: int, frame: FrameType | None) -> None:
        if suspended.is_set():
            suspended.clear()
            cont(signum, frame)

    signal.signal(signal.SIGTSTP, on_tstp)
    signal.signal(signal.SIGCONT, on_cont)


def measures(values: dict[str, float]) -> str:
    """A finding's per-thread numbers in a line: `waits/s 152, wait ms/s 15.3, wait 1.5%`."""
    parts = []
    for key, v in values.items():
        label = key.replace("_per_s", "/s").replace("_", " ")
        if key.endswith("share"):
            parts.append(f"{label.removesuffix(' share')} {pct(v)}")
        else:
            parts.append(f"{label} {num(v)}")
    return ", ".join(parts)


class FindingScreen(ModalScreen[None]):
    """Everything about one finding: the numbers, per thread, why, the fix."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,enter", "dismiss", "Close")]

    def __init__(self, row: data.FindingRow, frame: Frame) -> None:
        super().__init__()
        self.row = row
        self.frame = frame

    def compose(self) -> ComposeResult:
        r = self.row
        t = Text()
        t.append(f"{r.title}\n", "bold")
        t.append(f"{r.severity} · {r.category} · {r.where}\n\n", "dim")
        t.append(r.summary + "\n\n")
        finding = next((f for f in self.frame.findings if f.id == r.id), None)
        if finding is not None and finding.per_thread:
            t.append("per thread\n", "bold")
            for tid, values in sorted(finding.per_thread.items()):
                name = finding.thread_names.get(tid, "") or tid
                t.append(f"  {name:<14} {measures(values)}\n")
            t.append("\n")
        t.append("Why: ", "bold")
        t.append(r.explanation + "\n\n")
        t.append("Fix: ", "bold green")
        t.append(r.advice)
        with VerticalScroll(id="finding-box"):
            yield Static(t)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class TopApp(App[None]):
    """`kvprof top` over a source (live or replay)."""

    TITLE = "kvprof top"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #banner { display: none; height: auto; background: $error; color: $text; padding: 0 1; }
    #banner.shown { display: block; }
    TabbedContent { height: 1fr; }
    TabPane { padding: 0; }
    ContentSwitcher { height: 1fr; }
    #status { height: auto; max-height: 3; background: $panel; color: $text; padding: 0 1; }
    #filter { display: none; height: 3; }
    #filter.shown { display: block; }
    .note { height: auto; color: $warning; text-style: bold; padding: 0 1; }
    .head { height: auto; padding: 0 1; color: $text-muted; }
    DataTable { height: 1fr; }
    #ov-top { height: 3; padding: 0 1; }
    #ov-ceiling { height: 1; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    #ov-info, #ov-cpu, #lines-threads, #lines-matrix { text-wrap: nowrap; text-overflow: ellipsis; }
    #ov-info { width: 3fr; height: auto; }
    #ov-cpu { width: 2fr; height: auto; }
    #ov-spark { height: 1; margin: 0 1; }
    #ov-findings { height: 1fr; min-height: 4; }
    #ov-detail-box { height: 30%; min-height: 5; border-top: solid $primary; padding: 0 1; }
    #lines-table { height: 1fr; min-height: 4; }
    #lines-sampled { height: 1fr; min-height: 4; }
    #lines-bottom { height: auto; max-height: 9; padding: 0 1; }
    #lines-threads { width: 1fr; height: auto; }
    #lines-matrix { width: auto; height: auto; padding-left: 2; }
    HelpScreen, FindingScreen { align: center middle; }
    #help-box { width: 78; height: auto; max-height: 90%; border: thick $primary; background: $surface;
                padding: 0 1; }
    #finding-box { width: 90%; height: 80%; border: thick $primary; background: $surface; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("p", "pause", "Pause"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("s", "save", "Save"),
        Binding("f", "flamegraph", "Flame"),
        Binding("r", "reset", "Reset"),
        Binding("t", "next_thread", "Thread", show=False),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        *(Binding(str(i), f"view('{v}')", name, show=False) for i, (v, name) in enumerate(VIEWS, 1)),
    ]

    def __init__(
        self,
        source: Source,
        interval: float = TOP_INTERVAL_S,
        out_dir: Path | str = ".",
        clock: Callable[[], float] = time.time,
        handle_signals: bool = False,
        baseline: Profile | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.baseline = baseline  # what the Flame view's diff compares with
        self.interval = interval
        self.out_dir = Path(out_dir)
        self.clock = clock
        self.handle_signals = handle_signals
        self.timeline = Timeline()
        self._tl_lock = threading.Lock()
        self.frame: Frame | None = None
        self.frames = 0  # frames drawn, for tests and the benchmark
        self.polls = 0
        self.paused = False
        self.needle = ""
        self.written: list[Path] = []  # files `s` and `f` wrote
        self.error = ""
        self._reset = False
        self._timer: Timer | None = None
        self._started = False
        self._closer: threading.Thread | None = None
        self.stopped_by: signal.Signals | None = None  # the signal that ended it, if one did

    # ---- layout -------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Line(id="banner")
        with TabbedContent(initial="overview", id="tabs"):
            panels: list[Panel] = [
                OverviewPanel(),
                StacksPanel(),
                LocksPanel(id="locks-panel"),
                LinesPanel(),
                ThreadsPanel(id="threads-panel"),
                RequestsPanel(id="requests-panel"),
                FlamePanel(self.baseline),
            ]
            for i, ((view, name), panel) in enumerate(zip(VIEWS, panels, strict=True), 1):
                with TabPane(f"{i} {name}", id=view):
                    yield panel
        yield Input(placeholder="filter rows (Enter: keep, Esc: clear)", id="filter")
        yield Line(id="status")
        yield Footer()

    def on_mount(self) -> None:
        if self.handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGINT: ignored by a
                loop.add_signal_handler(sig, self.stop_by, sig)  # background job until set here
            _resume_only_after_suspend()
        self.draw_status()
        self.fetch()

    def stop_by(self, sig: signal.Signals) -> None:
        """End as `q` does, because `sig` came (the exit status says so)."""
        self.stopped_by = sig
        self.exit()

    def action_quit(self) -> None:  # type: ignore[override]
        self.start_closing()  # detaching takes a second: overlap it with leaving the screen
        self.exit()

    def on_unmount(self) -> None:
        if self._timer is not None:
            self._timer.stop()
        self.start_closing()

    def start_closing(self) -> None:
        """Close the source in the background (once); wait_closed() waits for it."""
        if self._closer is None:
            end_yield()  # the detach must end, idle CPU or not
            self._closer = threading.Thread(target=self.source.close, name="kvprof-close")
            self._closer.start()

    def wait_closed(self) -> None:
        self.start_closing()
        assert self._closer is not None
        self._closer.join()

    # ---- refresh ----------------------------------------------------------------------

    def fetch(self) -> None:
        self.run_worker(self._poll, thread=True, group="poll", exit_on_error=False)

    def _poll(self) -> None:
        try:
            if not self._started:
                self._started = True
                self.source.start()
            samples = self.source.poll()
            self.polls += 1
            with self._tl_lock:
                for s in samples:
                    self.timeline.add(s)
                reset, self._reset = self._reset, False
                if reset:
                    self.timeline.reset()
                frame = None
                if samples or reset or self.frame is None:
                    frame = build_frame(
                        self.timeline, self.source.title, self.source.command, self.source.label
                    )
        except Exception as e:  # keep the last frame on screen and say what broke
            self.error = f"refresh failed: {type(e).__name__}: {e}"
            frame = None
        self.call_from_thread(self._arrived, frame)

    def _arrived(self, frame: Frame | None) -> None:
        if frame is not None:
            self.frame = frame
            self.query_one(FlamePanel).remember(frame)  # its diff compares with earlier windows
            if not isinstance(self.screen, ModalScreen):
                self.draw()
        else:
            self.draw_status()
        if self.source.attaching():
            self.run_worker(self._after_change, thread=True, group="poll", exit_on_error=False)
        else:
            self._timer = self.set_timer(self.interval, self._tick)

    def _after_change(self) -> None:
        """While collectors attach: the next poll once one attaches (or an interval passes)."""
        self.source.wait_change(self.interval)
        self.call_from_thread(self._tick)

    def _tick(self) -> None:
        # paused here (p) or from outside (SIGUSR1): no map reads, no drawing, the same pace
        if self.paused or self.source.held():
            self.draw_status()
            self._timer = self.set_timer(self.interval, self._tick)
            return
        self.fetch()

    # ---- drawing -----------------------------------------------------------------------

    def active_view(self) -> str:
        return self.query_one(TabbedContent).active or "overview"

    def panel(self, view: str) -> Panel:
        return self.query_one(f"#{view}", TabPane).query_one(Panel)

    def draw(self) -> None:
        if self.frame is not None:
            self.panel(self.active_view()).show(self.frame, self.needle)
            self.frames += 1
        self.draw_status()

    def draw_status(self) -> None:
        frame = self.frame
        banner = self.query_one("#banner", Line)
        ended = frame.status.ended if frame is not None else ""
        banner.set_text(ended)
        banner.set_class(bool(ended), "shown")
        t = Text()
        if self.paused or self.source.held():
            why = "" if self.paused else "(SIGUSR1, SIGUSR2 resumes) "
            t.append(f" PAUSED {why}", "bold black on yellow")
            t.append(" ")
        t.append(self.source.label, "bold")
        if frame is not None:
            st = frame.status
            hz = st.hz or getattr(self.source, "hz", 0)
            t.append(f" · {hz} Hz · every {self.interval:g} s · drops {st.drops:,}")
            if self.needle:
                t.append(f" · filter: {self.needle}", "bold cyan")
            t.append(" · ")
            states = {n: s for n, s in st.collectors.items() if n != "error"}
            if states and all(s == "ok" for s in states.values()):
                t.append(f"{len(states)} collectors ✓", "green")
                cost = own_cost_line(frame.total) if frame.total is not None else ""
                if cost:
                    t.append(f" · {cost}")
            else:
                for name, state in states.items():
                    mark, style = ("✓", "green") if state == "ok" else ("…", "yellow")
                    if state.startswith("not applicable"):
                        mark, style = "–", "dim"
                    elif state not in ("ok", "attaching"):
                        mark, style = "✗", "red"
                    t.append(f"{name}{mark} ", style)
            notes = list(dict.fromkeys(st.unavailable.values()))
            starved = starved_note()
            if starved:
                notes.append(starved)
            if "error" in st.collectors:
                notes.insert(0, st.collectors["error"])
            if notes:
                t.append("\n" + " · ".join(notes), "yellow")
        if self.error:
            t.append("\n" + self.error, "bold red")
        self.query_one("#status", Line).set_text(t)

    # ---- events --------------------------------------------------------------------------

    def focus_view(self) -> None:
        panel = self.panel(self.active_view())
        target = panel.graph if isinstance(panel, FlamePanel) else panel.main_table()
        if target is not None:
            target.focus()

    @on(TabbedContent.TabActivated)
    def _tab_changed(self, event: TabbedContent.TabActivated) -> None:
        self.draw()
        self.focus_view()

    def on_screen_resume(self) -> None:
        self.draw()  # a modal closed: draw what arrived meanwhile

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.needle = event.value.strip()
        self.draw()

    @on(Input.Submitted, "#filter")
    def _filter_done(self, event: Input.Submitted) -> None:
        self.query_one("#filter", Input).remove_class("shown")
        self.focus_view()

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        if self.frame is None:
            return
        key = event.row_key.value or ""
        if event.data_table.id == "ov-findings":
            row = self.query_one(OverviewPanel).rows.get(key)
            if row is not None:
                self.push_screen(FindingScreen(row, self.frame))
        elif event.data_table.id == "threads-table":
            stacks = self.query_one(StacksPanel)
            stacks.tid = key
            self.action_view("stacks")

    # ---- actions -------------------------------------------------------------------------

    def action_view(self, view: str) -> None:
        tabs = self.query_one(TabbedContent)
        if tabs.active != view:
            # Let go of the focus first: a focused widget that its pane's hiding blurs hands
            # the focus to a sibling Textual still counts as shown, and TabbedContent then
            # shows that sibling's pane again, undoing the key (it happened to a key pressed
            # right after the first frame). _tab_changed focuses the new view.
            self.set_focus(None)
            tabs.active = view

    def action_pause(self) -> None:
        self.paused = not self.paused
        self.draw_status()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("shown")
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        box.remove_class("shown")
        self.needle = ""
        self.draw()

    def action_next_thread(self) -> None:
        self.query_one(StacksPanel).next_thread()
        self.action_view("stacks")
        self.draw()

    def action_reset(self) -> None:
        if not self.source.live:
            self.notify("a replay is one recorded window: nothing to reset")
            return
        self._reset = True
        self.notify("counters reset: findings and totals count from now")

    def _stamp(self) -> str:
        return time.strftime("%Y%m%d-%H%M%S", time.localtime(self.clock()))

    def action_save(self) -> None:
        self.run_worker(self._save, thread=True, group="io", exit_on_error=False)

    def _save(self) -> None:
        with self._tl_lock:
            profile = profile_to_save(self.timeline)
        if profile is None:
            self.call_from_thread(self.notify, "nothing collected yet", severity="warning")
            return
        path = self.out_dir / f"kvprof-top-{self.source.pid}-{self._stamp()}.json.gz"
        try:
            profile.save(path)
        except OSError as e:
            self.call_from_thread(self.notify, f"cannot save: {e}", severity="error")
            return
        self.written.append(path)
        self.call_from_thread(
            self.notify, f"saved {profile.window.duration_s:.0f} s to {path}\nkvprof report {path}", timeout=8
        )

    def flame_kind(self) -> str:
        """The stacks `f` writes from the view shown: the Flame view's own kind there."""
        view = self.active_view()
        return self.query_one(FlamePanel).kind if view == "flame" else FLAME_KIND.get(view, "cpu")

    def action_flamegraph(self) -> None:
        self.run_worker(self._flamegraph, thread=True, group="io", exit_on_error=False)

    def _flamegraph(self) -> None:
        try:
            from kvprof.export import KINDS, ExportError, export
        except ImportError as e:
            self.call_from_thread(self.notify, f"flame graphs unavailable: {e}", severity="error")
            return
        with self._tl_lock:
            profile = profile_to_save(self.timeline)
        if profile is None:
            self.call_from_thread(self.notify, "nothing collected yet", severity="warning")
            return
        kind = self.call_from_thread(self.flame_kind)
        if kind not in KINDS:
            kind = "cpu"
        path = self.out_dir / f"kvprof-top-{self.source.pid}-{kind}-{self._stamp()}.svg"
        try:
            what = export(profile, kind, path)
        except (ExportError, OSError) as e:
            self.call_from_thread(self.notify, f"flame graph: {e}", severity="error")
            return
        self.written.append(path)
        self.call_from_thread(self.notify, what, timeout=8)  # "wrote PATH: kind, samples, ..."
