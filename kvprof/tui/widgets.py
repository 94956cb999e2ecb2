"""The views of `kvprof top`: each panel draws a Frame's rows (kvprof.tui.data).

A panel's `show(frame, needle)` is the only way data gets in; it keeps the
highlighted row across refreshes by row key. `needle` is the `/` filter: a
row stays when any of its text cells contains it (case-insensitive).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Sparkline, Static
from textual.widgets.data_table import RowDoesNotExist

from kvprof.analysis.tables import LINE_PROBE, REQUEST_PROBE, THREAD_ROWS, sample_rate
from kvprof.tui import data
from kvprof.tui.data import Frame, num, pct

SEVERITY_STYLE = {"critical": "bold white on red", "warning": "bold black on yellow", "info": "dim"}
SEVERITY_LABEL = {"critical": "CRIT", "warning": "WARN", "info": "info"}
HOT = "bold yellow"
EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(frac: float, width: int) -> str:
    """A horizontal bar `width` cells wide, filled to `frac` (0..1) in eighths."""
    frac = min(max(frac, 0.0), 1.0)
    eighths = round(frac * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (EIGHTHS[part] if part else "")
    return text.ljust(width)


def us(x: float) -> str:
    return f"{x / 1e3:.1f} ms" if x >= 1e3 else f"{x:.1f} µs"


def fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 1)] + "…"


def matches(needle: str, cells: Iterable[object]) -> bool:
    if not needle:
        return True
    n = needle.lower()
    return any(n in str(c).lower() for c in cells)


def _cells(value: object) -> int:
    """How many terminal cells a table cell's value takes on one line."""
    return value.cell_len if isinstance(value, Text) else cell_len(str(value))


def fill(table: DataTable[object], rows: Sequence[tuple[str, Sequence[object]]]) -> None:
    """Replace the table's rows, keeping the highlighted one (by key) where it still is.
    The same rows as before (by key, in order) are updated cell by cell: clearing and
    adding them again made Textual lay the screen out anew at every refresh. A column
    widens for a wider cell and does not narrow for a narrower one: narrowing makes
    Textual measure every cell of the column again, at every refresh."""
    columns = list(table.columns)
    same_rows = [k for k, _ in rows] == [rk.value for rk in table.rows]
    if same_rows and all(len(cells) == len(columns) for _, cells in rows):
        for k, cells in rows:
            for column, new, old in zip(columns, cells, table.get_row(k), strict=True):
                if new != old:
                    wider = _cells(new) > table.columns[column].content_width
                    table.update_cell(k, column, new, update_width=wider)
        return
    key = None
    if table.row_count and table.cursor_row >= 0:
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # the cursor is past the last row
            key = None
    table.clear()
    for k, cells in rows:
        table.add_row(*cells, key=k)
    if key is not None:
        try:
            table.move_cursor(row=table.get_row_index(key), animate=False, scroll=False)
        except RowDoesNotExist:
            pass


class Line(Static):
    """Text that follows the data: redrawn only when it changed, and laid out again
    only when its shape may have (another line count, or a line that may wrap): a
    layout of the whole screen at every refresh was a fifth of top's CPU."""

    _shown: Text | str | None = None

    def set_text(self, content: Text | str) -> None:
        old = self._shown
        if old is not None and old == content:
            return
        self._shown = content
        width = self.content_size.width

        def shape(t: Text | str | None) -> tuple[int, bool]:
            lines = str(t or "").split("\n")
            return len(lines), any(len(line) >= width for line in lines)

        self.update(content, layout=old is None or shape(old) != shape(content) or shape(content)[1])


def new_table(id: str, columns: Sequence[tuple[str, str]]) -> DataTable[object]:
    t: DataTable[object] = DataTable(id=id, cursor_type="row", zebra_stripes=False)
    for label, key in columns:
        t.add_column(label, key=key)
    return t


class Note(Line):
    """One line above a view: why it is empty, or what it shows."""

    def say(self, text: str) -> None:
        self.set_text(text)
        self.display = bool(text)


class Panel(Vertical):
    """A view: show() draws a frame."""

    view = ""

    def note_for(self, frame: Frame) -> str:
        return frame.status.unavailable.get(self.view, "")

    def show(self, frame: Frame, needle: str) -> None:
        raise NotImplementedError

    def main_table(self) -> DataTable[object] | None:
        tables = self.query(DataTable)
        return tables.first() if tables else None


Row = tuple[str, Sequence[object], Sequence[object]]  # key, cells the filter reads, cells shown


class TablePanel(Panel):
    """A view that is one table under a note and a head line: `rows` gives its rows."""

    head = ""  # the head line; a view that changes it updates #<view>-head in `rows`
    columns: Sequence[tuple[str, str]] = ()  # (label, key)

    def compose(self) -> ComposeResult:
        yield Note(id=f"{self.view}-note", classes="note")
        yield Line(self.head, id=f"{self.view}-head", classes="head")
        yield new_table(f"{self.view}-table", self.columns)

    def rows(self, frame: Frame) -> Iterable[Row]:
        raise NotImplementedError

    def show(self, frame: Frame, needle: str) -> None:
        self.query_one(Note).say(self.note_for(frame))
        out = [(key, cells) for key, words, cells in self.rows(frame) if matches(needle, words)]
        fill(self.query_one(f"#{self.view}-table", DataTable), out)


# ---- Overview ---------------------------------------------------------------------


def _uptime(s: int) -> str:
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"


class OverviewPanel(Panel):
    view = "overview"

    def __init__(self) -> None:
        super().__init__(id="overview-panel")
        self.rows: dict[str, data.FindingRow] = {}

    def compose(self) -> ComposeResult:
        with Horizontal(id="ov-top"):
            yield Line(id="ov-info")
            yield Line(id="ov-cpu")
        yield Line(id="ov-ceiling")
        yield Sparkline([], id="ov-spark")
        yield new_table("ov-findings", [("", "sev"), ("if fixed", "gain"), ("finding — cost", "cost")])
        with VerticalScroll(id="ov-detail-box"):
            yield Line(id="ov-detail")

    def show(self, frame: Frame, needle: str) -> None:
        info = Text(no_wrap=True, overflow="ellipsis")
        info.append(frame.title, "bold")
        info.append(f"  {frame.source}\n", "dim")
        info.append(frame.command + "\n", "dim")
        up = _uptime(frame.uptime_s) if frame.uptime_s is not None else "-"
        ops = "-" if frame.ops_per_s is None else f"{frame.ops_per_s:,.0f}"
        info.append("ops/s ")
        info.append(ops, "bold cyan")
        if frame.server == "none":
            info.append(" (its ports answer neither memcached stats nor Redis INFO)", "dim")
        elif frame.server == "redis":
            info.append(" (Redis INFO)", "dim")
        info.append(f"  up {up}  profiled {frame.elapsed_s:.0f} s")
        self.query_one("#ov-info", Line).set_text(info)
        ceiling = self.query_one("#ov-ceiling", Line)
        ceiling.display = bool(frame.ceiling)
        ceiling.set_text(Text(frame.ceiling, "bold", no_wrap=True, overflow="ellipsis"))

        cpu = Text(no_wrap=True, overflow="ellipsis")
        bars = data.cpu_bars(frame)
        # from the terminal's width, not the widget's: that is 0 until the first layout,
        # and what is drawn must not depend on when that happened (snapshot tests)
        box = (self.app.size.width - 2) * 2 // 5  # #ov-cpu is 2fr of 5
        width = max(4, min(40, box - 21))
        shown = bars[:3]
        for i, b in enumerate(shown):
            cpu.append(f"{fit(b.name or b.tid, 14):<14} ")
            cpu.append(bar(b.cpu, width), "green")
            cpu.append(f" {b.cpu * 100:3.0f}%")
            if i < len(shown) - 1:
                cpu.append("\n")
        if not bars:
            cpu.append("CPU per thread: waiting for on-CPU samples", "dim")
        elif len(bars) > 3:
            cpu.append(f"  +{len(bars) - 3} (5: Threads)", "dim")
        self.query_one("#ov-cpu", Line).set_text(cpu)
        spark = self.query_one("#ov-spark", Sparkline)
        spark.display = len(frame.ops_history) >= 2  # one point is no trend (a replay)
        rows = 3 if self.app.size.height >= 36 else 1
        if spark.styles.height is None or spark.styles.height.value != rows:
            spark.styles.height = rows
        spark.data = frame.ops_history

        self.rows = {r.id: r for r in data.finding_rows(frame)}
        table = self.query_one("#ov-findings", DataTable)
        avail = max(20, self.app.size.width - 24)  # the severity and gain columns, padding, scrollbar
        out = []
        for r in self.rows.values():
            if not matches(needle, (r.cost, r.title, r.where, r.severity)):
                continue
            sev = Text(SEVERITY_LABEL.get(r.severity, r.severity), SEVERITY_STYLE.get(r.severity, ""))
            cost = Text()
            head, sep, tail = fit(r.cost, avail).partition(" — ")
            cost.append(("★ " if r.hotspot else "  ") + head, HOT if r.hotspot else "bold")
            cost.append(sep + tail)
            gain = Text(r.gain.rjust(8), "bold green" if r.gain not in ("-", "+0.0%") else "dim")
            out.append((r.id, [sev, gain, cost]))
        fill(table, out)
        self.show_detail()

    def show_detail(self) -> None:
        table = self.query_one("#ov-findings", DataTable)
        detail = self.query_one("#ov-detail", Line)
        if not table.row_count:
            detail.set_text(
                Text("no findings yet: they appear once the collectors have counted a while", "dim")
            )
            return
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:
            return
        r = self.rows.get(key or "")
        if r is None:
            return
        t = Text()
        t.append(r.title, "bold")
        t.append(f"  [{r.category}]\n", "dim")
        t.append(r.summary + "\n")
        t.append("Why: ", "bold")
        t.append(r.explanation + "\n")
        t.append("Fix: ", "bold green")
        t.append(r.advice)
        detail.set_text(t)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show_detail()

    def selected(self) -> data.FindingRow | None:
        table = self.query_one("#ov-findings", DataTable)
        if not table.row_count:
            return None
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:
            return None
        return self.rows.get(key or "")


# ---- Stacks -----------------------------------------------------------------------


def next_thread(tid: str | None, threads: list[tuple[str, str]]) -> str | None:
    """After `tid`: all threads (None), then each thread with samples, busiest first."""
    tids = [None, *(t for t, _ in threads)]
    i = tids.index(tid) if tid in tids else 0
    return tids[(i + 1) % len(tids)]


class StacksPanel(TablePanel):
    view = "stacks"
    columns = (
        ("function", "function"), ("self now", "self_now"), ("total now", "total_now"),
        ("self all", "self_all"), ("total all", "total_all"),
    )  # fmt: skip

    def __init__(self) -> None:
        super().__init__(id="stacks-panel")
        self.tid: str | None = None  # the thread filter; None: all threads
        self.threads: list[tuple[str, str]] = []

    def next_thread(self) -> None:
        self.tid = next_thread(self.tid, self.threads)

    def rows(self, frame: Frame) -> Iterable[Row]:
        self.threads = data.thread_choices(frame)
        names = dict(self.threads)
        who = "all threads" if self.tid is None else f"{names.get(self.tid, '')} ({self.tid})"
        head = Text()
        head.append("thread: ")
        head.append(who, "bold")
        head.append("  (t: next thread)", "dim")
        head.append("   share of on-CPU samples: now = last interval, all = since start", "dim")
        self.query_one("#stacks-head", Line).set_text(head)
        width = max(24, self.app.size.width - 48)
        for r in data.stack_rows(frame, self.tid):
            name = Text(("★ " if r.hotspot else "  ") + fit(r.function, width), HOT if r.hotspot else "")
            cells = [name, pct(r.self_now), pct(r.total_now), pct(r.self_all), pct(r.total_all)]
            yield r.function, (r.function, r.hotspot), cells


# ---- Locks ------------------------------------------------------------------------


class LocksPanel(TablePanel):
    view = "locks"
    head = "contended acquisitions (kvs lock probes), last few seconds"
    columns = (
        ("lock / call site", "lock"), ("waits/s", "waits"), ("wait ms/s", "wait_ms"), ("p99 wait", "p99"),
        ("wait per thread", "split"),
    )  # fmt: skip

    def rows(self, frame: Frame) -> Iterable[Row]:
        width = max(16, self.app.size.width - 62)
        for r in data.lock_rows(frame):
            hot = data.lock_hotspot(r.name, "")
            label = Text(("★ " if hot else "") + r.name, "bold " + (HOT if hot else ""))
            p99 = "-" if r.p99_ms is None else f"{r.p99_ms:.2f} ms"
            split = data.wait_split(frame, r)
            cells = [label, num(r.waits_per_s), num(r.wait_ms_per_s), p99, fit(split, width)]
            yield f"{r.name}|", (r.name, "", split), cells
            for s in r.sites:
                hot = data.lock_hotspot("", s.site)
                label = Text("  └ " + s.site, HOT if hot else "")
                cells = [label, num(s.waits_per_s), num(s.wait_ms_per_s), "", ""]
                yield f"{r.name}|{s.site}", (r.name, s.site, ""), cells


# ---- Cache lines ------------------------------------------------------------------


LINE_COLUMNS = (
    ("site", "site"), ("updates/s", "updates"), ("cycles", "cycles"), ("p99", "p99"),
    ("xfers/s", "transfers"), ("xfer%", "share"), ("x-socket", "cross"), ("writers", "writers"),
)  # fmt: skip
SAMPLED_COLUMNS = (
    ("data symbol", "symbol"), ("samples", "samples"), ("CPU%", "share"), ("writers", "writers"),
    ("kind", "kind"), ("functions", "functions"),
)  # fmt: skip


class LinesPanel(Panel):
    view = "lines"

    def __init__(self) -> None:
        super().__init__(id="lines-panel")
        self.frame: Frame | None = None

    def compose(self) -> ComposeResult:
        yield Note(id="lines-note", classes="note")
        yield Line(id="lines-head", classes="head")
        yield new_table("lines-table", LINE_COLUMNS)
        with Horizontal(id="lines-bottom"):
            yield Line(id="lines-threads")
            yield Line(id="lines-matrix")
        yield Line(id="lines-sampled-head", classes="head")
        yield new_table("lines-sampled", SAMPLED_COLUMNS)

    def show(self, frame: Frame, needle: str) -> None:
        self.frame = frame
        self.query_one(Note).say(self.note_for(frame))
        rate = sample_rate(frame.recent, LINE_PROBE) if frame.recent is not None else 1
        head = "shared counters (kvs atomic__sample), last few seconds"
        if rate > 1:
            head += f"; sampled 1 in {rate}, rates scaled ×{rate}"
        self.query_one("#lines-head", Line).set_text(Text(head, "dim"))
        out = []
        for r in data.line_rows(frame):
            if not matches(needle, (r.site, r.hotspot)):
                continue
            site = Text(("★ " if r.hotspot else "  ") + r.site, HOT if r.hotspot and r.writers != 1 else "")
            out.append(
                (
                    r.site,
                    [
                        site,
                        num(r.updates_per_s),
                        f"{r.cycles_mean:.0f}",
                        str(r.cycles_p99),
                        num(r.transfers_per_s),
                        pct(r.transfer_share),
                        pct(r.cross_socket_share),
                        str(r.writers),
                    ],
                )
            )
        fill(self.query_one("#lines-table", DataTable), out)
        self.show_bottom()
        self.show_sampled(frame, needle)

    def show_sampled(self, frame: Frame, needle: str) -> None:
        rows = data.sampled_rows(frame)
        on = "regsample" in (frame.total.collectors if frame.total is not None else [])
        head = "atomic writes from sampled registers (any target), since start; CPU%: of the writers' samples"
        self.query_one("#lines-sampled-head", Line).set_text(Text(head, "dim"))
        for widget in (self.query_one("#lines-sampled-head"), self.query_one("#lines-sampled")):
            widget.display = on  # a profile without regsample keeps the kvs view alone
        out = []
        for r in rows:
            if not matches(needle, (r.symbol, r.functions)):
                continue
            hot = r.kind in ("shared", "false sharing")
            out.append(
                (
                    r.key,
                    [
                        Text(r.symbol, HOT if hot else ""),
                        str(r.samples),
                        pct(r.share),
                        str(r.writers),
                        r.kind,
                        r.functions,
                    ],
                )
            )
        fill(self.query_one("#lines-sampled", DataTable), out)

    def show_bottom(self) -> None:
        frame = self.frame
        if frame is None:
            return
        table = self.query_one("#lines-table", DataTable)
        site = ""
        if table.row_count:
            try:
                site = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value or ""
            except Exception:
                site = ""
        threads = Text(no_wrap=True, overflow="ellipsis")
        matrix = data.transfer_matrix(frame)
        sockets = max(len(matrix), data.socket_count(frame))
        if site:
            rows = data.line_threads(frame, site)
            threads.append(f"{site}: updates per thread\n", "bold")
            top = max((r.updates_per_s for r in rows), default=0.0)
            box = self.app.size.width - 2 - (2 + 8 + 9 * sockets)  # beside the matrix (matrix_text)
            width = max(4, min(40, box - 34))
            for r in rows[:6]:
                threads.append(f"{fit(r.name or r.tid, 12):<12} ")
                threads.append(bar(r.updates_per_s / top if top else 0, width), "magenta")
                threads.append(f" {num(r.updates_per_s):>6}/s {r.cycles_mean:4.0f} cyc\n")
        self.query_one("#lines-threads", Line).set_text(threads)
        self.query_one("#lines-matrix", Line).set_text(matrix_text(matrix, sockets))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show_bottom()


def matrix_text(m: list[list[float]], sockets: int) -> Text:
    """The socket x socket transfer matrix: rows are where the line was, columns where it went."""
    t = Text(no_wrap=True)
    t.append("transfers/s, socket → socket\n", "bold")
    n = max(len(m), sockets, 1)
    t.append("from\\to" + "".join(f"{j:>9}" for j in range(n)) + "\n", "dim")
    for i in range(n):
        t.append(f"{i:>7} ")
        for j in range(n):
            v = m[i][j] if i < len(m) and j < len(m[i]) else 0.0
            cell = num(v)
            t.append(" " * (9 - len(cell)))
            t.append(cell, "bold red" if i != j and v else "")
        t.append("\n")
    if n == 1:
        t.append("one socket: all transfers stay on it", "dim")
    return t


# ---- Threads ----------------------------------------------------------------------


class ThreadsPanel(TablePanel):
    view = "threads"
    head = "last few seconds; % of one CPU / of the thread's wall time; Enter: its stacks"
    columns = (
        ("tid", "tid"), ("name", "name"), ("CPU", "cpu"), ("sock", "sockets"), ("lock", "lock"),
        ("off-CPU", "off"), ("top function", "top"), ("stacks", "quality"),
    )  # fmt: skip

    def rows(self, frame: Frame) -> Iterable[Row]:
        every = data.thread_rows(frame)
        head: Text | str = self.head
        if len(every) > THREAD_ROWS:  # a table of thousands would cost a second to draw
            rest = every[THREAD_ROWS:]
            head = (
                f"the busiest {THREAD_ROWS} threads; {len(rest):,} more threads: "
                f"{pct(sum(r.cpu_share for r in rest))} CPU in all; Enter: its stacks"
            )
        self.query_one("#threads-head", Line).set_text(head)
        for r in every[:THREAD_ROWS]:
            function = data.top_function(r)
            top = fit(function, max(12, self.app.size.width - 64))
            sockets = ",".join(s for s, n in sorted(r.sockets.items()) if n > 0) or "-"
            shares = [pct(r.cpu_share), sockets, pct(r.lock_wait_share), pct(r.offcpu_share)]
            cells = [r.tid, r.name, *shares, top, data.stack_quality(r.stack_quality)]
            yield r.tid, (r.tid, r.name, function), cells


# ---- Requests ---------------------------------------------------------------------


class RequestsPanel(TablePanel):
    view = "requests"
    columns = (
        ("opcode", "op"), ("req/s", "rate"), ("sampled", "n"),
        ("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("p99.9", "p999"),
    )  # fmt: skip

    def rows(self, frame: Frame) -> Iterable[Row]:
        rate = sample_rate(frame.total, REQUEST_PROBE) if frame.total is not None else 1
        head = "server-side latency per opcode (kvs cmd probes), percentiles since start"
        if rate > 1:
            head += f"; 1 in {rate} requests sampled"
        self.query_one("#requests-head", Line).set_text(Text(head, "dim"))
        for r in data.request_rows(frame):
            latency = [us(x) for x in (r.p50_us, r.p90_us, r.p99_us, r.p999_us)]
            cells = [r.opcode, num(r.per_s), f"{r.samples:,}", *latency]
            yield r.opcode, (r.opcode,), cells
