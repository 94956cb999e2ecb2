"""View 7 of `kvprof top`: a live flame graph (icicle, root at the top).

The graph is laid out by kvprof.export.icicle, the layout `kvprof report
--flame` prints; here its pieces get the SVG's colours (by module, hotspots
violet, `/` matches magenta, and in diff mode red/blue by change of share).
Work follows the data: the stacks are folded and sorted only when a new
window arrives or the kind or thread changes, laid out only when that, the
width or the zoom changed, and a row is styled only when the compositor
asks for it (the rows on screen).

The selection and the zoom are call paths, so they stay on the same frame
across refreshes. The window drawn is the recent one (the last few seconds,
as the findings use); diff mode compares it with the window before it
(RECENT_SAMPLES refreshes earlier, so the two do not overlap) or with the
profile given with `top --baseline FILE`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.actions import SkipAction
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from kvprof.export.diff import change_colour
from kvprof.export.frames import Classifier
from kvprof.export.icicle import Icicle, Span, flame_of, hotspot_note, layout, matched, row_pieces
from kvprof.export.stacks import KINDS, TITLES, check_kind
from kvprof.export.svg import format_value, frame_colour
from kvprof.export.tree import ROOT, Flame
from kvprof.model.profile import Profile
from kvprof.tui import data
from kvprof.tui.data import Frame, pct
from kvprof.tui.widgets import Line, Note, Panel, next_thread

MATCH = "#e600e6"  # the SVG's search highlight
# the view whose note says why the stacks of a kind are missing
KIND_VIEW = {"cpu": "stacks", "locks": "locks"}


class FlameGraph(ScrollView, can_focus=True):
    """The icicle of a Flame; arrows select, Enter zooms, Backspace/Escape zoom out."""

    DEFAULT_CSS = """
    FlameGraph { height: 1fr; overflow: hidden hidden; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move('up')", "Caller", show=False),
        Binding("down", "move('down')", "Callee", show=False),
        Binding("left", "move('left')", "Left", show=False),
        Binding("right", "move('right')", "Right", show=False),
        Binding("enter", "zoom", "Zoom", show=False),
        Binding("backspace,escape", "zoom_out", "Zoom out", show=False),
    ]

    class Changed(Message):
        """The selection, the zoom or the data changed: the status line follows."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.flame: Flame | None = None
        self.base: Flame | None = None  # diff mode: the window compared with
        self.classify: Classifier | None = None
        self.needle = ""
        self.zoom: tuple[str, ...] = ()
        self.zooms: list[tuple[str, ...]] = []  # where Backspace goes back to
        self.selected: tuple[str, ...] = ()
        self._icicle: Icicle | None = None
        self._key: tuple[object, ...] = ()
        self._strips: dict[int, Strip] = {}
        self._colours: dict[tuple[str, int], str] = {}
        self._diff: dict[tuple[str, ...], str] = {}

    # ---- data in ---------------------------------------------------------------------

    def set_data(self, flame: Flame, base: Flame | None, classify: Classifier, needle: str) -> None:
        if flame is self.flame and base is self.base and needle == self.needle:
            return
        if classify is not self.classify:
            self._colours.clear()
        self.flame, self.base, self.classify, self.needle = flame, base, classify, needle
        self._strips.clear()
        self._diff.clear()
        self.refresh()
        self.post_message(self.Changed())

    def width_now(self) -> int:
        return max(self.scrollable_content_region.width, 1)

    def icicle(self) -> Icicle | None:
        """The layout for the data, width and zoom now (laid out again only when one changed)."""
        if self.flame is None:
            return None
        width = self.width_now()
        key = (self.flame, width, self.zoom)  # the object, not its id: ids are reused
        if key != self._key or self._icicle is None:
            self._key = key
            self._icicle = layout(self.flame, width, self.zoom)
            self._strips.clear()
            self._diff.clear()
            rows = len(self._icicle.rows)
            if self.virtual_size != Size(width, rows):
                self.virtual_size = Size(width, rows)
        return self._icicle

    def current(self) -> Span | None:
        """The selected frame, or its nearest caller on screen when it is not drawn now."""
        ic = self.icicle()
        if ic is None:
            return None
        path = self.selected
        while True:
            at = ic.find(path)
            if at is not None:
                return ic.rows[at[0]][at[1]]
            if not path:
                return None
            path = path[:-1]

    # ---- drawing ---------------------------------------------------------------------

    def _colour(self, span: Span) -> str:
        if self.base is not None and self.flame is not None and self.flame.total and self.base.total:
            if not self._diff:
                self._diff_colours()
            return self._diff.get(span.path, "#e4e4e4")
        assert self.classify is not None
        depth = len(span.path)
        key = (span.name, min(depth, 2))
        colour = self._colours.get(key)
        if colour is None:
            colour = self._colours[key] = frame_colour(self.classify(span.name, depth), span.name)
        return colour

    def _diff_colours(self) -> None:
        """Each drawn frame's colour by how its share changed from the base (kvprof diff's)."""
        assert self.flame is not None and self.base is not None and self._icicle is not None
        new, old = self.flame, self.base
        shares = {
            s.path: (old.value_of(s.path) / old.total, s.value / new.total) for s in self._icicle.spans()
        }
        biggest = max((abs(a - b) for b, a in shares.values()), default=0.0) or 1.0
        self._diff = {path: change_colour(b, a, biggest)[0] for path, (b, a) in shares.items()}

    def render_line(self, y: int) -> Strip:
        ic = self.icicle()
        width = self.width_now()
        row = y + round(self.scroll_offset.y)
        if ic is None or row >= len(ic.rows):
            return Strip.blank(width, self.rich_style)
        strip = self._strips.get(row)
        if strip is None:
            strip = self._strips[row] = self._row_strip(ic, row)
        return strip

    def _row_strip(self, ic: Icicle, row: int) -> Strip:
        assert self.classify is not None
        selected = self.current()
        needle = self.needle.lower()
        segments = []
        for text, span in row_pieces(ic.rows[row], ic.width, self.classify):
            if span is None:
                segments.append(Segment(text, self.rich_style))
                continue
            bg = MATCH if needle and needle in span.name.lower() else self._colour(span)
            style = Style(color="#000000", bgcolor=bg, dim=span.caller)
            if selected is not None and span.path == selected.path:
                style += Style(reverse=True, bold=True)
            segments.append(Segment(text, style))
        return Strip(segments, ic.width)

    def redraw(self) -> None:
        self._strips.clear()
        self.refresh()
        self.post_message(self.Changed())

    # ---- navigation --------------------------------------------------------------------

    def action_move(self, where: str) -> None:
        ic, span = self.icicle(), self.current()
        if ic is None or span is None:
            return
        row = len(span.path)
        target: Span | None = None
        if where == "up" and span.path:
            above = ic.find(span.path[:-1])
            target = ic.rows[row - 1][above[1]] if above is not None else None
        elif where == "down" and row + 1 < len(ic.rows):
            callees = [s for s in ic.rows[row + 1] if s.path[:-1] == span.path]
            target = max(callees, key=lambda s: s.value, default=None)  # the hot path first
        elif where in ("left", "right"):
            at = ic.find(span.path)
            assert at is not None
            i = at[1] + (1 if where == "right" else -1)
            target = ic.rows[row][i] if 0 <= i < len(ic.rows[row]) else None
        if target is not None:
            self.select(target.path)

    def select(self, path: tuple[str, ...]) -> None:
        self.selected = path
        row = len(path)
        top, height = round(self.scroll_offset.y), self.scrollable_content_region.height
        if row < top:
            self.scroll_to(y=row, animate=False)
        elif height and row >= top + height:
            self.scroll_to(y=row - height + 1, animate=False)
        self.redraw()

    def action_zoom(self) -> None:
        span = self.current()
        if span is None:
            return
        if not span.path:
            self.zooms, self.zoom = [], ()
        elif span.path != self.zoom:
            self.zooms.append(self.zoom)
            self.zoom = span.path
        self.selected = span.path
        self.redraw()

    def action_zoom_out(self) -> None:
        if not self.zoom:
            raise SkipAction()  # the app's Escape: clear the filter
        self.zoom = self.zooms.pop() if self.zooms else ()
        self.redraw()

    def on_click(self, event: events.Click) -> None:
        ic = self.icicle()
        row = event.y + round(self.scroll_offset.y)
        if ic is None or row >= len(ic.rows):
            return
        hit = next((s for s in ic.rows[row] if s.col <= event.x < s.col + s.width), None)
        if hit is not None:
            self.select(hit.path)

    def on_resize(self, event: events.Resize) -> None:
        # the rows follow the width by themselves (icicle()); the status line may not
        self.post_message(self.Changed())


class FlamePanel(Panel):
    """The Flame view: a head line (what is drawn), the graph, the selected frame's numbers."""

    view = "flame"
    DEFAULT_CSS = """
    #flame-head, #flame-hot, #flame-status { text-wrap: nowrap; text-overflow: ellipsis; }
    #flame-hot { height: 1; padding: 0 1; color: $warning; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("o", "next_kind", "Kind", show=False),
        Binding("t", "next_thread", "Thread", show=False),
        Binding("d", "diff", "Diff", show=False),
    ]

    def __init__(self, baseline: Profile | None = None, id: str | None = "flame-panel") -> None:
        super().__init__(id=id)
        self.baseline = baseline
        self.kind = "cpu"
        self.tid: str | None = None
        self.threads: list[tuple[str, str]] = []
        self.diff = False
        self.frame: Frame | None = None
        self.needle = ""
        self.windows: deque[Profile] = deque(maxlen=data.RECENT_SAMPLES + 1)  # recent windows, oldest first
        # (id(profile), kind, tid) -> (the profile, kept so that its id is not reused, its Flame)
        self._flames: dict[tuple[int, str, str | None], tuple[Profile, Flame]] = {}
        self._classifier: tuple[tuple[str, int], Classifier] | None = None
        self._notes: dict[object, tuple[tuple[object, ...], object]] = {}

    def compose(self) -> ComposeResult:
        yield Note(id="flame-note", classes="note")
        yield Line(id="flame-head", classes="head")
        yield FlameGraph(id="flame-graph")
        yield Line(id="flame-hot")
        yield Line(id="flame-status", classes="head")

    @property
    def graph(self) -> FlameGraph:
        return self.query_one(FlameGraph)

    def remember(self, frame: Frame) -> None:
        """Every frame that arrives, shown or not: the windows diff mode compares with."""
        if frame.recent is not None and (not self.windows or self.windows[-1] is not frame.recent):
            self.windows.append(frame.recent)

    def previous(self) -> Profile | None:
        """The recent window that ended when the one shown began, once there is one."""
        full = len(self.windows) == self.windows.maxlen
        return self.windows[0] if full else None

    def _flame(self, profile: Profile) -> Flame:
        key = (id(profile), self.kind, self.tid)
        hit = self._flames.get(key)
        if hit is None:
            live = {id(p) for p in self.windows} | {id(self.baseline)}
            self._flames = {k: v for k, v in self._flames.items() if k[0] in live}  # windows gone go
            flame = flame_of(profile, self.kind, int(self.tid) if self.tid else None)
            hit = self._flames[key] = (profile, flame)
        return hit[1]

    def _classify(self, profile: Profile) -> Classifier:
        target = (profile.target.exe, profile.target.pid)  # each window is a new Profile
        if self._classifier is None or self._classifier[0] != target:
            self._classifier = (target, Classifier(profile))
        return self._classifier[1]

    def show(self, frame: Frame, needle: str) -> None:
        self.frame, self.needle = frame, needle
        self.remember(frame)
        view = KIND_VIEW.get(self.kind)
        self.query_one(Note).say(frame.status.unavailable.get(view, "") if view else "")
        self.threads = data.thread_choices(frame)
        window = frame.recent
        if window is None:
            self.query_one("#flame-head", Line).set_text(Text("waiting for the first samples", "dim"))
            return
        flame = self._flame(window)
        base_profile = self.baseline if self.baseline is not None else self.previous()
        base = self._flame(base_profile) if self.diff and base_profile is not None else None
        self.graph.set_data(flame, base, self._classify(window), needle)
        self.show_head(window, flame, base_profile)
        self.show_status()

    def show_head(self, window: Profile, flame: Flame, base: Profile | None) -> None:
        unit = check_kind(self.kind)
        names = dict(self.threads)
        who = "all threads" if self.tid is None else f"{names.get(self.tid, '')} ({self.tid})"
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(TITLES[self.kind], "bold")
        t.append(f" · last {window.window.duration_s:.0f} s · {format_value(flame.total, unit)} · ")
        t.append(who, "bold")
        if self.diff:
            if base is None:
                t.append(" · diff: no previous window yet", "yellow")
            else:
                before = f"the {base.window.duration_s:.0f} s before"
                t.append(" · diff vs " + ("baseline" if base is self.baseline else before), "bold")
                t.append(" (red grew, blue shrank)", "dim")
        t.append("   o kind  t thread  d diff  Enter zoom  Esc out", "dim")
        self.query_one("#flame-head", Line).set_text(t)

    def cached(self, key: tuple[object, ...], make: Callable[[], object]) -> object:
        """One value per key, the last key only: the match share and the hotspot line
        follow the data, not the refreshes."""
        hit = self._notes.get(key[0])
        if hit is None or hit[0] != key:
            hit = self._notes[key[0]] = (key, make())
        return hit[1]

    def show_status(self) -> None:
        graph = self.graph
        flame, span, ic = graph.flame, graph.current(), graph.icicle()
        t = Text(no_wrap=True, overflow="ellipsis")
        hot = self.query_one("#flame-hot", Line)
        if flame is None or ic is None or not flame.total:
            t.append(f"no {TITLES[self.kind]} stacks in this window", "dim")
            self.query_one("#flame-status", Line).set_text(t)
            hot.set_text("")
            return
        unit = check_kind(self.kind)
        if span is not None:
            own = flame.own_value(span.path)
            t.append(span.name if span.path else ROOT, "bold")
            t.append(f"  {format_value(span.value, unit)}, {pct(span.value / flame.total)} of the total")
            t.append(f", self {format_value(own, unit)} ({pct(own / flame.total)})")
            if graph.base is not None and graph.base.total:
                before = graph.base.value_of(span.path) / graph.base.total
                t.append(f", was {pct(before)}", "bold")
            if graph.zoom and ic.focus:
                t.append(f", {pct(span.value / ic.focus)} of {graph.zoom[-1]}")
        if self.needle:
            needle = self.needle
            share = self.cached(("match", flame, needle.lower()), lambda: matched(flame, needle))
            assert isinstance(share, int)
            t.append(f"   /{needle}/ {pct(share / flame.total)} of the total", "bold magenta")
        self.query_one("#flame-status", Line).set_text(t)
        assert graph.classify is not None
        kind = graph.classify
        note = self.cached(("hot", flame, ic), lambda: hotspot_note(flame, ic, kind))
        hot.set_text(str(note))

    def on_flame_graph_changed(self, event: FlameGraph.Changed) -> None:
        self.show_status()

    def _again(self) -> None:
        if self.frame is not None:
            self.show(self.frame, self.needle)

    def action_next_kind(self) -> None:
        self.kind = KINDS[(KINDS.index(self.kind) + 1) % len(KINDS)]
        self.graph.zoom, self.graph.zooms, self.graph.selected = (), [], ()
        self._again()

    def action_next_thread(self) -> None:
        self.tid = next_thread(self.tid, self.threads)
        self._again()

    def action_diff(self) -> None:
        self.diff = not self.diff
        self._again()
