"""`kvprof report`: a profile as text (findings first) or as JSON for scripts.

The text fits 80 columns. Findings read like Redis's LATENCY DOCTOR: what,
how much, why, what to do, in plain sentences; then the tables they were
drawn from: top functions by self and total samples, locks, cache lines
(with the socket x socket transfer matrix when there is more than one
socket), threads and requests.
"""

from __future__ import annotations

import functools
import math
import textwrap
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, TypeVar

from kvprof.analysis import ceilings
from kvprof.analysis.findings import find, summary
from kvprof.analysis.findings.lock_cpu import ID_PREFIX as LOCK_CPU
from kvprof.analysis.hotspots import label
from kvprof.analysis.lines import kind, line_row, line_table, unattributed
from kvprof.analysis.own_cost import own_cost
from kvprof.analysis.rows import (
    FunctionRow,
    LineRow,
    LockRow,
    ThreadRow,
    function_rows,
    line_rows,
    lock_rows,
    request_rows,
    thread_rows,
)
from kvprof.analysis.tables import LINE_PROBE, THREAD_ROWS, THREADS_NAMED, sample_rate, socket_matrix
from kvprof.analysis.whatif import annotate, budget, gain_if_all_fixed
from kvprof.model.profile import Finding, Profile

WIDTH = 80
R = TypeVar("R")
REPORT_FORMAT = "kvprof-report"
REPORT_VERSION = 1

# status.counters suffix -> what to do about it
COUNTER_ADVICE = {
    "lost": "lower --hz or shorten the interval",
    "stack_errors": "raise --stack-storage",
    "map_full": "raise --max-entries",
}


def findings_of(profile: Profile) -> list[Finding]:
    """The profile's findings, computed now when the recording did not store any (and
    their gains, when it stored findings without them)."""
    if profile.findings:
        return ceilings.ranked(profile, annotate(profile, list(profile.findings)))
    return find(profile)


def whatif_of(profile: Profile, findings: list[Finding]) -> dict[str, Any]:
    """What fixing the critical and warning findings together gives back, and the threads'
    time budget it comes from (kvprof.analysis.whatif)."""
    b = budget(profile)
    return {
        "gain_if_all_fixed": gain_if_all_fixed(profile, findings),
        "busy_share": b.busy_share,
        "pace": b.pace,
        "says": b.describe(),
        "threads": {tid: asdict(t) for tid, t in b.threads.items()},
    }


def top_functions(profile: Profile, n: int) -> list[FunctionRow]:
    """Functions by self samples (the leaf), with their total (anywhere on the stack)."""
    rows = function_rows(profile)
    by_self = rows[:n]
    # functions that are never a leaf but carry much of the time (callers of hot code)
    by_total = sorted(rows, key=lambda r: (-r.total_samples, r.function))
    extra = [r for r in by_total[:n] if r not in by_self and r.self_samples == 0][: max(n // 3, 1)]
    return by_self + extra


def collector_states(profile: Profile) -> dict[str, str]:
    """Collector -> "ok" or why it did not apply / failed."""
    states = dict(profile.status.collectors)
    for name in profile.collectors:
        states.setdefault(name, "ok")
    return states


def warnings_of(profile: Profile) -> list[str]:
    """Lines that say the profile is incomplete and what flag to raise."""
    out = []
    st = profile.status
    if st.partial:
        out.append(f"partial profile: {st.reason or 'the recording did not finish'}")
    for key, value in sorted(st.counters.items()):
        if value <= 0:
            continue
        suffix = key.rsplit(".", 1)[-1]
        for word, advice in COUNTER_ADVICE.items():
            if suffix == word or suffix.endswith(word):
                collector = key.split(".", 1)[0]
                said = any(w.startswith(f"{collector}:") and advice.split()[-1] in w for w in st.warnings)
                if not said:  # the collector's own warning already names the flag
                    out.append(f"{key} = {value:,}: {advice}")
                break
    for w in st.warnings:
        if w not in out:
            out.append(w)
    return out


# ---- JSON ---------------------------------------------------------------------


def to_json(profile: Profile, top: int = 15) -> dict[str, Any]:
    """Findings and tables as one JSON-able object."""
    findings = findings_of(profile)
    whatif = whatif_of(profile, findings)
    return {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "kvprof_version": profile.kvprof_version or None,  # that recorded it; None: not recorded
        "target": profile.target.to_dict(),
        "window": asdict(profile.window),
        "hz": profile.hz,
        "collectors": collector_states(profile),
        "partial": profile.status.partial,
        "warnings": warnings_of(profile),
        # what the target was and did (Go, forks, execs, threads), when there is something to say
        **({"notes": list(profile.status.notes)} if profile.status.notes else {}),
        # the modules some code of which had no symbol, and what would give them names
        **({"missing_symbols": missing_symbols(profile)} if profile.missing_symbols else {}),
        "sample_rates": dict(profile.status.sample_rates),
        "findings": [{**asdict(f), "summary": summary(f)} for f in findings],
        "gain_if_all_fixed": whatif["gain_if_all_fixed"],
        "whatif": whatif,
        "throughput_ops_per_s": round(ceilings.throughput(profile), 1),
        "ceilings": [ceilings.to_json(c) for c in ceilings.ladder(profile, findings)],
        "tables": {
            "functions": [asdict(r) for r in top_functions(profile, top)],
            "locks": [_fields("locks", r) for r in lock_rows(profile)],
            "cachelines": [_fields("cachelines", r, line=f"{r.line:#x}") for r in line_rows(profile)],
            "sampled_lines": [line_row(sl) for sl in line_table(profile)],
            "sampled_unattributed": dict(profile.addresses.unattributed),
            "socket_matrix": socket_matrix(profile),
            "threads": [_fields("threads", r, sockets=_sockets(r)) for r in thread_rows(profile)],
            # "count": the requests sampled, as the text's REQUESTS (sampled) shows
            "requests": [_fields("requests", r, count=r.samples) for r in request_rows(profile)],
        },
        **({"own_cost": asdict(cost)} if (cost := own_cost(profile)) is not None else {}),
    }


# the fields of each table's rows that --json has (docs/report.md), in its order
JSON_FIELDS = {
    "locks": (
        "name",
        "waits",
        "waits_per_s",
        "wait_ms_per_s",
        "wait_ms_per_s_err90",
        "max_ms",
        "threads",
        "call_site",
    ),
    "cachelines": (
        "site",
        "line",
        "samples",
        "updates_per_s",
        "transfers_per_s",
        "cross_socket_share",
        "cycles_mean",
        "writers",
    ),
    "threads": (
        "tid",
        "name",
        "samples",
        "cpu_share",
        "sockets",
        "lock_wait_ms",
        "offcpu_ms",
        "stack_quality",
    ),
    "requests": ("opcode", "count", "p50_us", "p99_us"),
}


def _fields(table: str, row: Any, **shown: Any) -> dict[str, Any]:
    """A row as --json has it: JSON_FIELDS[table] of it, `shown` in place of some."""
    return {k: shown[k] if k in shown else getattr(row, k) for k in JSON_FIELDS[table]}


def _sockets(r: ThreadRow) -> str:
    """ "0:120,1:3": on-CPU samples per socket."""
    return ",".join(f"{s}:{n}" for s, n in sorted(r.sockets.items()))


# ---- text ---------------------------------------------------------------------


def _n(x: float) -> str:
    """A rate or count, readable: 1,234 / 12.3 / 1.23 / 7."""
    if abs(x) >= 100 or x == int(x):
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 1)] + "…"


def _wrap(text: str, indent: str, first: str | None = None) -> list[str]:
    return textwrap.wrap(
        text,
        width=WIDTH,
        initial_indent=first if first is not None else indent,
        subsequent_indent=indent,
        break_on_hyphens=False,
        break_long_words=True,
    )


def _header(profile: Profile) -> list[str]:
    t = profile.target
    lines = []
    who = t.comm or (t.exe.rsplit("/", 1)[-1] if t.exe else "?")
    lines.append(_fit(f"kvprof report: {who} {t.pids}", WIDTH))
    if t.cmdline:
        lines.extend(_wrap(" ".join(t.cmdline), "    ", "  command: "))
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(profile.window.start))
        if profile.window.start
        else "unknown start"
    )
    sockets = {p.get("socket", 0) for p in profile.host.topology.values()} or {0}
    host = []
    if profile.host.kernel:
        host.append(f"kernel {profile.host.kernel}")
    if profile.host.cpus:
        host.append(f"{profile.host.cpus} CPUs")
    host.append(f"{len(sockets)} socket" + ("s" if len(sockets) != 1 else ""))
    lines.extend(
        _wrap(
            f"{when}, {profile.window.duration_s:.1f} s at {profile.hz} Hz; {', '.join(host)}; "
            f"kvs probes: {'yes' if t.kvs_probes else 'no'}",
            "    ",
            "  window: ",
        )
    )
    if profile.kvprof_version:  # older profiles do not say
        lines.append(f"  recorded by: kvprof {profile.kvprof_version}")
    states = collector_states(profile)
    # "ok", or "ok (perf backend)", "ok (py-spy ...)": which backend gave the section
    ok = [n if s == "ok" else f"{n} {s[3:]}" for n, s in states.items() if s.startswith("ok")]
    lines.extend(_wrap(", ".join(ok) or "none", "    ", "  collectors: "))
    for name, state in states.items():
        if not state.startswith("ok"):
            lines.extend(_wrap(f"{name}: {state}", "      ", "    not used: "))
    for w in warnings_of(profile):
        lines.extend(_wrap(w, "    ", "WARNING: "))
    for note in profile.status.notes:
        lines.extend(_wrap(note, "    ", "  note: "))
    for m in missing_symbols(profile):
        lines.extend(_wrap(_missing_line(m), "    ", "  no symbols: "))
    return lines


# where a module's names came from (kvprof.collect.debuginfo.SOURCES) when some code had none
_NAMES_FROM = {"none": "stripped", "dynsym": "only its exported functions named"}


def missing_symbols(profile: Profile) -> list[dict[str, Any]]:
    """The modules some of whose code had no symbol (profile.missing_symbols), each with
    `cpu_share`: the share of the on-CPU samples that ran in that code."""
    total = sum(s.count for s in profile.oncpu)
    out = []
    for m in profile.missing_symbols:
        own = sum(s.count for s in profile.oncpu if s.frames and s.frames[-1].startswith(m.module + "+0x"))
        out.append({**asdict(m), "cpu_share": own / total if total else 0.0})
    return out


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _missing_line(m: dict[str, Any]) -> str:
    how = _NAMES_FROM.get(m["names"], f"names from {m['names']}")
    text = f"{m['module']} ({how}; {m['cpu_share']:.0%} of the CPU samples ran in its unnamed code)"
    if m["functions"]:
        text += f": {_plural(m['functions'], 'function', 'functions')} named by the start the unwind "
        text += f"table gives them, {m['module']}+0xSTART"
    if outside := m["outside_unwind"]:
        text += f"; {_plural(len(outside), 'address', 'addresses')} outside any function of that table, "
        text += f"shown as they are ({', '.join(outside[:3])}{', ...' if len(outside) > 3 else ''})"
    return text + (f". For names: {m['fix']}" if m["fix"] else "")


# per-thread columns shown for each kind of finding: (key, header, scale)
WAIT_COLUMNS = [
    ("waits_per_s", "waits/s", 1.0),
    ("wait_ms_per_s", "wait ms/s", 1.0),
    ("wait_share", "% time", 100.0),
]
CPU_COLUMNS = [
    ("samples", "samples", 1.0),
    ("share_of_thread", "% thread", 100.0),
    ("cpu_s_per_s", "CPU %", 100.0),
]
THREAD_COLUMNS: dict[str, list[tuple[str, str, float]]] = {
    "lock": WAIT_COLUMNS,
    "cacheline": [
        ("updates_per_s", "updates/s", 1.0),
        ("transfers_per_s", "transfers/s", 1.0),
        ("cycles_mean", "cycles", 1.0),
    ],
    "sampled-line": [
        ("samples", "samples", 1.0),
        ("share", "% its CPU", 100.0),
    ],
    "cpu": CPU_COLUMNS,
    "lock-cpu": CPU_COLUMNS,
    "futex": WAIT_COLUMNS,
    "offcpu": [("offcpu_ms_per_s", "off-CPU ms/s", 1.0), ("wall_share", "% time", 100.0)],
}


def _finding_lines(i: int, f: Finding, many_sockets: bool) -> list[str]:
    lines = []
    head = f"{i}. {f.severity.upper()}: {f.title} [{f.category}]"
    lines.extend(_wrap(head, "   ", ""))
    lines.extend(_wrap(summary(f), "   "))
    if f.severity == "info":
        # info findings are context, not problems: what and how much only
        return lines
    kind = (
        "lock-cpu"
        if f.id.startswith(LOCK_CPU)
        else "futex"
        if f.id.startswith("futex:")
        else "sampled-line"
        if f.id.startswith("sampled-line:")
        else f.category
    )
    cols = THREAD_COLUMNS.get(kind, [])
    if f.per_thread and cols:
        name_w = WIDTH - 5 - 13 * len(cols)
        hdr = "   " + "thread".ljust(name_w) + "".join(h.rjust(13) for _, h, _ in cols)
        lines.append(hdr.rstrip())
        for tid, row in list(f.per_thread.items())[:THREADS_NAMED]:
            label = f"{f.thread_names.get(tid) or '?'} ({tid})"
            cells = "".join(_n(row.get(k, 0.0) * scale).rjust(13) for k, _, scale in cols)
            lines.append("     " + _fit(label, name_w - 2).ljust(name_w - 2) + cells)
        if len(f.per_thread) > THREADS_NAMED:
            lines.append(f"     ... and {len(f.per_thread) - THREADS_NAMED} more threads")
    if many_sockets and f.per_socket:
        parts = []
        for s, row in sorted(f.per_socket.items()):
            parts.append(f"socket {s}: " + ", ".join(f"{k} {_n(v)}" for k, v in row.items()))
        lines.extend(_wrap("; ".join(parts), "     ", "   Per socket: "))
    lines.extend(_wrap(f.explanation, "   ", "   Why: "))
    lines.extend(_wrap(f.advice, "   ", "   What to do: "))
    return lines


def _section(title: str) -> list[str]:
    return ["", title, "-" * len(title)]


def _table(title: str, header: str, empty: str, rows: Sequence[R], line: Callable[[R], str]) -> list[str]:
    """A section that holds a table: its title, then the column header and a line per
    row, or the one line that says it is empty."""
    return [*_section(title), *([header, *map(line, rows)] if rows else [empty])]


def _sampled_lines(profile: Profile, top: int) -> list[str]:
    """The cache lines found from sampled registers (kvprof.analysis.lines)."""
    if "regsample" not in profile.collectors:
        return []
    a = profile.addresses
    lines = line_table(profile)
    on_atomics = sum(sl.samples for sl in lines)
    out = _section("CACHE LINES FROM SAMPLED REGISTERS (atomic writes, any target)")
    out.append(f"{on_atomics:,} of {a.user_samples:,} user-mode samples on atomic writes")
    out.append(
        f"could not attribute {unattributed(profile):,} samples"
        + (f" ({', '.join(f'{k} {v}' for k, v in a.unattributed.items())})" if a.unattributed else "")
    )
    if a.lost:
        out.append(f"{a.lost:,} samples overwritten before they were read")
    if not lines:
        out.append("no samples on atomic writes")
        return out
    out.append(f"{'data symbol':<24}{'samples':>8}{'CPU %':>7}{'thr':>4}  {'kind':<14}function")
    for sl in lines[: max(top, 1)]:
        funcs = ", ".join(sl.ranked_functions)
        head = f"{_fit(sl.symbol, 23):<24}{sl.samples:>8}{sl.share * 100:7.1f}{sl.writers:>4}  {kind(sl):<14}"
        out.append(head + _fit(funcs, WIDTH - len(head)))
    if len(lines) > top:
        out.append(f"... and {len(lines) - top} more lines")
    out.append("  CPU %: the writing threads' on-CPU samples spent on these writes")
    return out


def _findings_section(findings: list[Finding], many_sockets: bool, whatif: dict[str, Any]) -> list[str]:
    counts = {s: sum(1 for f in findings if f.severity == s) for s in ("critical", "warning", "info")}
    out = _section(
        f"FINDINGS: {counts['critical']} critical, {counts['warning']} warning, "
        f"{counts['info']} info (most worth fixing first)"
    )
    if not findings:
        out.append("No contention found: no hot catalog function, contended lock or bouncing")
        out.append("cache line crossed a threshold (see docs/report.md).")
    together = (
        f"If fixed together, the critical and warning findings would give back about "
        f"{whatif['gain_if_all_fixed']:+.1%} throughput (docs/findings.md). "
        if counts["critical"] or counts["warning"]
        else ""
    )
    if findings:
        out += [*_wrap(together + whatif["says"], ""), ""]
    for i, f in enumerate(findings, 1):
        if i > 1 and (f.severity != "info" or findings[i - 2].severity != "info"):
            out.append("")
        out += _finding_lines(i, f, many_sockets)
    if any(f.severity == "info" for f in findings):
        out.append("(info findings are shown short; --json has every field)")
    return out


def _ceilings_section(profile: Profile, findings: list[Finding]) -> list[str]:
    """The ladder: each serialized resource's ceiling, in the order they bind."""
    rungs = ceilings.ladder(profile, findings)
    if not rungs:
        return []
    ops, what = ceilings.counted(profile)
    out = _section(f"CEILINGS: where throughput stops scaling (today {ops:,.0f} ops/s)")
    out.append(f"{'resource':<32}{'ns/op':>9}{'ceiling ops/s':>14}{'at threads':>12}{'after fix':>12}")
    for c in rungs:
        after = "-" if math.isinf(c.after_fix_ops_per_s) else ceilings.ops_text(c.after_fix_ops_per_s)
        out.append(
            f"{_fit(c.resource, 31):<32}{c.busy_ns_per_op:>9.1f}{ceilings.ops_text(c.ceiling_ops_per_s):>14}"
            f"{c.binds_at_threads:>12,.0f}{after:>12}"
        )
    out += _wrap(
        "A lock every request takes, or a line every request writes, serves one core at a "
        "time: its time per request caps the server whatever its cores (docs/findings.md).",
        "",
    )
    below = [c.resource for c in rungs if c.kind == "lock" and c.ceiling_ops_per_s < ops]
    if below:
        out += _wrap(
            f"Below today's throughput: {', '.join(below)}. Its threads hold it most of their "
            "time on a CPU, so two saturate it, and a saturated sleeping mutex is handed over "
            "slower than one thread takes it: more threads would serve less.",
            "",
        )
    if what != "requests":
        out += _wrap(
            f"The target counts no requests: an op here is one of the {what}, counted while "
            "--hold's uprobes trapped every mutex call: on a hot lock today's rate is lower, and "
            "the threads a ceiling binds at more, than without them (docs/record.md).",
            "",
        )
    return out


def _function_line(r: FunctionRow) -> str:
    name = label(r.function)
    mark = " *" if r.hotspot else ""
    return f"{r.self_share * 100:7.1f} {r.total_share * 100:8.1f}  " + _fit(name + mark, WIDTH - 19)


def _functions_section(profile: Profile, top: int) -> list[str]:
    total = sum(s.count for s in profile.oncpu)
    funcs = top_functions(profile, top)
    out = _table(
        f"TOP FUNCTIONS ({total:,} on-CPU samples)",
        f"{'self %':>7} {'total %':>8}  function",
        "no on-CPU samples",
        funcs,
        _function_line,
    )
    if any(r.hotspot for r in funcs):
        out.append("  * a known contention spot (see FINDINGS)")
    return out


LOCK_NAME = (13, 27)  # the LOCKS table's lock column: its narrowest and widest


def _lock_line(lr: LockRow, name_width: int) -> str:
    err = "" if lr.wait_ms_per_s_err90 is None else "±" + _n(lr.wait_ms_per_s_err90)
    return (
        f"{_fit(lr.name, name_width):<{name_width + 1}}"
        f"{_n(lr.waits_per_s):>10}{_n(lr.wait_ms_per_s):>11}{err:>7}"
        f"{'-' if lr.max_ms is None else _n(lr.max_ms):>8}{lr.threads:>4}  "
        + _fit(lr.call_site, WIDTH - 43 - name_width)
    )


def _locks_section(profile: Profile) -> list[str]:
    """The LOCKS table, its lock column as wide as its longest name within LOCK_NAME (two
    heap addresses differ in their last digits)."""
    rows = lock_rows(profile)
    width = min(max([LOCK_NAME[0], *(len(r.name) for r in rows)]), LOCK_NAME[1])
    return _table(
        "LOCKS (contended acquisitions only; ±: a sampled wait's 90 % interval)",
        f"{'lock':<{width + 1}}{'waits/s':>10}{'wait ms/s':>11}{'±90%':>7}{'max ms':>8}{'thr':>4}  call site",
        "no contended lock",
        rows,
        functools.partial(_lock_line, name_width=width),
    )


def _line_line(cr: LineRow) -> str:
    return (
        f"{_fit(cr.site, 16):<17}{_fit(f'{cr.line:#x}', 14):>15}{_n(cr.updates_per_s):>12}"
        f"{_n(cr.transfers_per_s):>12}{cr.cross_socket_share * 100:7.1f}{cr.cycles_mean:8.0f}{cr.writers:>5}"
    )


def _lines_section(profile: Profile, top: int, matrix: list[list[float]], many_sockets: bool) -> list[str]:
    lrows = line_rows(profile)
    rate = sample_rate(profile, LINE_PROBE)
    out = _table(
        "CACHE LINES" + (f" (sampled 1 in {rate}, rates scaled)" if rate > 1 else ""),
        f"{'site':<17}{'line':>15}{'updates/s':>12}{'transfers/s':>12}{'cross%':>7}{'cycles':>8}{'thr':>5}",
        "no cache-line samples" if profile.target.kvs_probes else "no data (no kvs probes)",
        lrows[: max(top, 1)],
        _line_line,
    )
    if not lrows:
        return out
    if len(lrows) > top:
        out.append(f"... and {len(lrows) - top} more lines")
    if many_sockets and matrix:
        out.append("")
        out.append("transfers/s, from socket (row) to socket (column):")
        out.append("      " + "".join(f"{j:>12}" for j in range(len(matrix))))
        for i, row in enumerate(matrix):
            out.append(f"{i:>6}" + "".join(f"{_n(v):>12}" for v in row))
    return out


def _thread_line(th: ThreadRow) -> str:
    q = "-" if th.stack_quality is None else f"{(1 - th.stack_quality) * 100:.0f}%"
    return (
        f"{_fit(th.tid, 7):>7} {_fit(th.name, 15):<16}{th.samples:>8}{th.cpu_share * 100:7.1f} "
        f"{_fit(_sockets(th) or '-', 9):<10}{_n(th.lock_wait_ms):>8}{_n(th.offcpu_ms):>10}{q:>7}"
    )


def _threads_section(profile: Profile) -> list[str]:
    trows = thread_rows(profile)
    out = _table(
        "THREADS",
        f"{'tid':>7} {'name':<16}{'samples':>8}{'CPU %':>7} {'sockets':<10}{'lock ms':>8}{'offcpu ms':>10}"
        f"{'stk ok':>7}",
        "no thread data",
        trows[:THREAD_ROWS],
        _thread_line,
    )
    if not trows:
        return out
    if len(trows) > THREAD_ROWS:
        rest = trows[THREAD_ROWS:]
        out.append(
            f"{'':>7} {f'{len(rest):,} more threads':<16}{sum(t.samples for t in rest):>8}"
            f"{sum(t.cpu_share for t in rest) * 100:7.1f} {'':<10}{_n(sum(t.lock_wait_ms for t in rest)):>8}"
            f"{_n(sum(t.offcpu_ms for t in rest)):>10}"
        )
    out.append("  stk ok: share of the thread's on-CPU stacks that reached the thread's entry")
    stops: dict[str, int] = defaultdict(int)
    for info in profile.threads.values():
        for why, n in info.stack_stops.items():
            stops[why] += n
    if stops:
        out.append(
            "  stopped early: "
            + ", ".join(f"{why} {n}" for why, n in sorted(stops.items(), key=lambda kv: -kv[1]))
        )
    return out


def _requests_section(profile: Profile) -> list[str]:
    rrows = request_rows(profile)
    if not rrows and not profile.target.kvs_probes:
        return []
    return _table(
        "REQUESTS (sampled)",
        f"{'opcode':<12}{'count':>12}{'p50 µs':>12}{'p99 µs':>12}",
        "no requests sampled",
        rrows,
        lambda rq: f"{_fit(rq.opcode, 11):<12}{rq.samples:>12,}{_n(rq.p50_us):>12}{_n(rq.p99_us):>12}",
    )


def render_text(profile: Profile, top: int = 15) -> str:
    """The whole report as text, every line at most 80 columns."""
    sockets = {p.get("socket", 0) for p in profile.host.topology.values()}
    matrix = socket_matrix(profile)
    many_sockets = len(sockets) > 1 or len(matrix) > 1
    findings = findings_of(profile)
    out = [
        *_header(profile),
        *_findings_section(findings, many_sockets, whatif_of(profile, findings)),
        *_ceilings_section(profile, findings),
        *_functions_section(profile, top),
        *_locks_section(profile),
        *_lines_section(profile, top, matrix, many_sockets),
        *_sampled_lines(profile, top),
        *_threads_section(profile),
        *_requests_section(profile),
        *_own_cost_lines(profile),
    ]
    return "\n".join(line.rstrip() for line in out) + "\n"


def _own_cost_lines(profile: Profile) -> list[str]:
    """What kvprof cost the target over the window, by collector (nothing when unknown)."""
    cost = own_cost(profile)
    if cost is None:
        return []
    out = _section(f"KVPROF'S OWN COST: {cost.share:.1%} of the target")
    if not cost.measured:
        out.append("BPF run time not measured (BPF statistics could not be turned on)")
    out += _wrap(
        f"BPF programs {cost.bpf_share:.1%}, uprobe traps {cost.trap_share:.1%} and sampling interrupts "
        f"{cost.interrupt_share:.1%} of the target's CPU time, the kvprof process {cost.process_share:.1%} "
        "of the machine's: CPU time kvprof took. What its events leave in the caches and what its process "
        "displaces are not counted, so a busy server can lose more (docs/record.md, Overhead)",
        "",
    )
    width = max([12] + [len(r.collector) + 2 for r in cost.rows])  # "oncpu+regsample" is longer
    out.append(
        f"{'collector':<{width}}{'fired by':<12}{'events/s':>10}{'ns/event':>10}{'BPF ms/s':>10}"
        f"{'kernel ms/s':>12}{'share':>8}"
    )
    seconds = max(profile.overhead.window_s, 1e-9)
    for r in cost.rows:
        out.append(
            f"{r.collector:<{width}}{r.fired_by:<12}{r.events_per_s:>10,.0f}{r.ns_per_event:>10,.0f}"
            f"{r.bpf_ns / seconds / 1e6:>10.2f}{(r.trap_ns + r.interrupt_ns) / seconds / 1e6:>12.2f}"
            f"{r.share * 100:>7.2f}%"
        )
    return out
