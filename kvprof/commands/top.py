"""`kvprof top`: the live terminal UI (-p PID, --demo, or --replay FILE)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvprof.collect import TOP_INTERVAL_S
from kvprof.commands import add_collectors, add_hz, add_inline, add_pid, add_seconds, command, number, options

HELP = "live terminal UI: findings, stacks, locks, cache lines, threads, requests, flame graph"

DESCRIPTION = """\
Attach kvprof's collectors to a running process and show, refreshed every
--interval, where it loses throughput: the contention spots ranked by cost
(known ones marked, each with why and the fix), hot functions, contended
locks, bouncing cache lines with the socket x socket matrix, threads,
request latency and a live flame graph. Needs root, except --replay. Everything is detached on
exit, on SIGINT, SIGTERM or SIGHUP, and when the target exits (its last data stays on screen).
Exit status: 0 quit with q; 128 + the signal's number when a signal ended it; 2 it could
not start."""

EXAMPLES = """\
examples:
  kvprof top -p $(pgrep -x kvcached)   # attach to a running server (root)
  kvprof top --demo                    # kvcached (baseline, 2 workers), attach, then kvload
  kvprof top --replay base.json.gz     # a recorded profile, no root needed
  kvprof top -p 1234 --hz 199 -i 2     # sample faster, refresh every 2 s
  kvprof top -p 1234 --baseline fixed.json.gz   # 7, d: the flame graph against it

keys: 1-7 views, q quit, p pause, ? help, / filter, s save a profile,
f flame graph (SVG), r reset counters, arrows and Enter to navigate;
in 7 (Flame) Enter zooms, Backspace/Esc zooms out, o kind, t thread, d diff.
"""


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = command(commands, "top", HELP, DESCRIPTION, EXAMPLES)
    what = p.add_mutually_exclusive_group(required=True)
    add_pid(what, "the process to watch", required=False)
    what.add_argument(
        "--demo", action="store_true", help="start kvcached (baseline preset) and kvload, watch it, stop both"
    )
    what.add_argument("--replay", type=Path, metavar="FILE", help="show a profile written by record or `s`")
    add_hz(p)
    add_seconds(
        p,
        "-i",
        "--interval",
        type=number(float, lo=0.2),
        default=TOP_INTERVAL_S,
        help="seconds between refreshes; each reads every map and redraws: CPU a busy target loses",
    )
    add_collectors(p)
    add_inline(p)
    p.add_argument(
        "--baseline",
        type=Path,
        metavar="FILE",
        help="a profile the Flame view's diff (d) compares with (default: the previous window)",
    )
    p.add_argument(
        "-o",
        "--output-dir",
        type=Path,
        default=Path("."),
        metavar="DIR",
        help="where `s` and `f` write their files (default: the current directory)",
    )
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from kvprof.tui.run import TopOptions, main

    return main(options(TopOptions, args))
