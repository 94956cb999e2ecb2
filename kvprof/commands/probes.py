"""`kvprof probes -p PID [-d SEC]`: the target's USDT probes, their semaphores and live hit rates."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from typing import TYPE_CHECKING

from kvprof.commands import add_pid, add_seconds, command, fail, number

if TYPE_CHECKING:
    from kvprof.system.probes import Listing, Row

HELP = "list the target's USDT probes, semaphore state and live hit rate"

DESCRIPTION = """\
List the USDT probes in a process's executable (its .note.stapsdt ELF notes),
read each is-enabled semaphore from the process, and count hits per second
over a short window with a BPF counter on every probe."""

EXAMPLES = """\
examples:
  kvprof probes -p 1234          # probes, semaphore state, hits/s over 1 s
  kvprof probes -p 1234 -d 5     # hits/s over 5 s
  kvprof probes -p 1234 -d 0     # list only: attach nothing (no root needed for your own process)
  kvprof probes -p 1234 --json   # the same as one JSON object

SEM is the probe's is-enabled semaphore before kvprof attached (0: nobody
traces it; - : the probe has none). Counting raises it for the window and
lowers it again when done.
"""

WIDTH = 80


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = command(commands, "probes", HELP, DESCRIPTION, EXAMPLES)
    add_pid(p, "the process to look at (required)", required=False)  # not with --ebpf
    add_seconds(p, "-d", "--duration", type=number(float, 0, 3600), default=1.0,
                help="seconds to count hits for; 0 lists without attaching")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--ebpf", action="store_true", help=argparse.SUPPRESS)  # print the BPF program, exit
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvprof.collect import CollectError
    from kvprof.system.attach import stop_on_signals
    from kvprof.system.probes import list_probes

    if args.ebpf:
        from kvprof.collect import PROBES_DIR

        print((PROBES_DIR / "usdt_rate.bpf.c").read_text(), end="")
        return 0
    if args.pid is None:
        return fail("probes", "give the process with -p PID")
    try:
        listing = list_probes(args.pid)
        if listing.rows and args.duration > 0:
            with stop_on_signals():  # SIGTERM detaches as Ctrl-C does
                listing.count(args.duration, lambda: _counting(listing, args.duration))
    except CollectError as e:
        return fail("probes", str(e))
    except KeyboardInterrupt:
        return fail("probes", "interrupted; all probes detached", 130)
    print(json.dumps(_json(listing)) if args.json else _text(listing))
    if listing.skipped:
        print(
            f"kvprof probes: counted the first {len(listing.names) - len(listing.skipped)} probes only; "
            f"not counted: {', '.join(f'{p}:{n}' for p, n in listing.skipped)}",
            file=sys.stderr,
        )
    changed = listing.changed()
    if changed:
        print(
            "kvprof probes: warning: semaphores changed while counting (another tracer?): "
            + ", ".join(changed),
            file=sys.stderr,
        )
    return 0


def _counting(listing: Listing, duration: float) -> None:
    process = listing.process
    print(
        f"Counting hits of {len(listing.names)} USDT probes in {process.comm} PID {process.pid} "
        f"for {duration:g} s...",
        file=sys.stderr,
    )


def _text(listing: Listing) -> str:
    process = listing.process
    if not listing.rows:
        return f"PID {process.pid} ({process.comm}): {process.exe} has no USDT probes"
    return _table(
        process.pid,
        process.comm,
        process.exe,
        listing.pie,
        listing.bias,
        listing.window,
        list(listing.rows.values()),
    )


def _json(listing: Listing) -> dict[str, object]:
    process, after = listing.process, listing.after
    if not listing.rows:
        return {"pid": process.pid, "comm": process.comm, "exe": process.exe, "probes": []}
    return {
        "pid": process.pid,
        "comm": process.comm,
        "exe": process.exe,
        "pie": listing.pie,
        "load_bias": listing.bias,
        "window_s": listing.window,
        "probes": [
            {
                "provider": r.provider,
                "name": r.name,
                "sites": [{"location": loc, "arguments": list(args)} for loc, args in r.sites],
                "semaphore": r.semaphore or None,
                "semaphore_value": r.semaphore_value,
                "semaphore_value_after": after.get(r.semaphore)
                if after is not None and r.semaphore
                else None,
                "hits": r.hits,
                "hits_per_sec": r.per_sec,
            }
            for r in listing.rows.values()
        ],
    }


def _rate(per_sec: float | None) -> str:
    if per_sec is None:
        return "-"
    return f"{per_sec:.1f}" if per_sec < 100 else f"{per_sec:,.0f}"


def _table(pid: int, comm: str, exe: str, pie: bool, bias: int, window: float | None, rows: list[Row]) -> str:
    nsites = sum(len(r.sites) for r in rows)
    head = f"{comm} PID {pid}: {exe}"
    out = [head if len(head) <= WIDTH else f"{comm} PID {pid}: ...{exe[-(WIDTH - len(comm) - 16) :]}"]
    where = f"PIE loaded at {bias:#x}" if pie else "not PIE"
    counted = f"hits/s over {window:.2f} s" if window is not None else "not counted (-d 0)"
    out.append(f"{len(rows)} USDT probes at {nsites} sites ({where}); {counted}")
    out.append("")
    name_w = min(32, max(len("PROBE"), *(len(r.full_name) for r in rows)))
    columns = f"{'SITES':>5} {'LOCATION':>10} {'SEMAPHORE':>10} {'SEM':>4} {'HITS/S':>12}"
    out.append(f"{'PROBE':<{name_w}} {columns}")
    for r in rows:
        name = r.full_name if len(r.full_name) <= name_w else r.full_name[: name_w - 1] + "~"
        sem_addr = f"{r.semaphore:#x}" if r.semaphore else "-"
        sem = "-" if r.semaphore_value is None else str(r.semaphore_value)
        values = f"{len(r.sites):>5} {r.sites[0][0]:>#10x} {sem_addr:>10} {sem:>4} {_rate(r.per_sec):>12}"
        out.append(f"{name:<{name_w}} {values}")
    out.append("")
    out.append("arguments (size@operand; a negative size is signed), per site:")
    for r in rows:
        for loc, args in r.sites:
            lead = f"  {r.full_name} {loc:#x}:"
            out.extend(
                textwrap.wrap(
                    " ".join(args) or "(none)", WIDTH, initial_indent=lead + " ", subsequent_indent=" " * 6
                )
            )
    return "\n".join(out)
