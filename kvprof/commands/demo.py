"""`kvprof demo`: kvcached under load, with its live stats once a second."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from kvprof.commands import add_seconds, command, fail, number

if TYPE_CHECKING:
    from kvprof.system.demo import Demo

HELP = "run kvcached under load and show its live stats"

DESCRIPTION = """\
Start kvcached on a free loopback port, drive it with kvload (batched
multi-gets, 5 % sets) and print ops/s, hit rate, items and the topkeys
lock's contended waits once a second. Ctrl-C, SIGTERM or --duration stop both."""

EXAMPLES = """\
examples:
  kvprof demo                  # run until Ctrl-C
  kvprof demo -d 30            # run for 30 seconds
  kvprof demo --preset fixed   # compare: the per-thread design of every site
"""


def add_parser(commands: Any) -> None:
    p = command(commands, "demo", HELP, DESCRIPTION, EXAMPLES)
    add_seconds(p, "-d", "--duration", help="stop after SEC seconds (default: run until Ctrl-C)")
    p.add_argument(
        "--preset",
        choices=("baseline", "fixed"),
        default="baseline",
        help="kvcached's contention sites: baseline = shared (the study's start), "
        "fixed = per-thread (default: %(default)s)",
    )
    p.add_argument(
        "-t",
        "--threads",
        type=number(int, lo=1),
        default=2,
        metavar="N",
        help="kvcached worker threads (default: %(default)s)",
    )
    add_seconds(p, "-i", "--interval", default=1.0, help="seconds between lines")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    return run(duration=args.duration, preset=args.preset, threads=args.threads, interval=args.interval)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


def run(
    duration: float | None = None,
    preset: str = "baseline",
    threads: int = 2,
    interval: float = 1.0,
) -> int:
    """Run the demo; returns the exit status (0 when stopped by Ctrl-C, a signal or the
    duration; 2 when it could not start, 1 when the server or the load failed)."""
    from kvprof.system.attach import ignore_stop_signals, stop_on_signals
    from kvprof.system.demo import Demo, DemoError
    from kvprof.system.servers import TargetError

    out = sys.stdout
    demo = Demo()
    failure: str | None = None
    with stop_on_signals(signal.SIGHUP):  # SIGTERM and SIGHUP stop both, as Ctrl-C does
        try:
            demo.start(preset, threads, duration)
            _watch(demo, f"preset {preset}, {threads} workers", duration, interval, out)
        except KeyboardInterrupt as e:
            if not e.args:  # Ctrl-C, not a signal we turned into it
                print(file=out)  # after the terminal's ^C
        except (DemoError, TargetError, OSError) as e:
            failure = str(e)
        finally:
            ignore_stop_signals(signal.SIGHUP)
            status = demo.stop(last_look=failure is None)
    return _finish(demo, failure, status, out)


def _watch(demo: Demo, what: str, duration: float | None, interval: float, out: TextIO) -> None:
    """The banner, then a line every `interval` s until `duration` (None: until Ctrl-C)."""
    from kvprof.system.demo import HEADER, HEADER_EVERY, format_line, rates

    assert demo.server is not None and demo.load is not None and demo.first is not None
    # kvcached answers `version` as "1.6.0-kvcached-0.1.0" for memcached's clients.
    version = demo.first.stats.get("version", "?").rsplit("kvcached-", 1)[-1]
    until = "Ctrl-C to stop" if duration is None else f"{duration:g} s, Ctrl-C to stop early"
    print(
        f"kvprof demo: kvcached {version} ({what}) PID {demo.server.pid} on {demo.server.address}\n"
        f"  load: {demo.load.describe()}\n"
        f"  `stats` and `stats locks` every {interval:g} s; {until}",
        file=out,
        flush=True,
    )
    start = time.monotonic()
    lines = 0
    while duration is None or time.monotonic() - start < duration - 1e-3:
        wake = start + (lines + 1) * interval
        if duration is not None:
            wake = min(wake, start + duration)
        time.sleep(max(0.0, wake - time.monotonic()))
        old, new = demo.look()
        if lines % HEADER_EVERY == 0:
            print(HEADER, file=out)
        print(format_line(new.at - start, rates(old, new)), file=out, flush=True)
        lines += 1


def _finish(demo: Demo, failure: str | None, status: int | None, out: TextIO) -> int:
    """The summary, or what failed with the logs that say why; the logs removed unless
    they are needed; the exit status."""
    from kvprof.system.demo import exit_status, format_summary, rates

    server, load = demo.server, demo.load
    code = 0
    if failure is not None:
        # 2: the server or the load could not start; 1: one of them failed later
        code = fail("demo", f"error: {failure}", 2 if load is None else 1)
        if server is not None and server.log().strip():
            print(f"  kvcached said ({server.log_path}):\n{_tail(server.log())}", file=sys.stderr)
        if load is not None and load.log().strip():
            print(f"  kvload said:\n{_tail(load.log())}", file=sys.stderr)
    elif demo.first is not None and demo.last is not None and demo.last is not demo.first:
        print(format_summary(rates(demo.first, demo.last)), file=out, flush=True)
    if load is not None:
        load.cleanup()
    if server is not None:
        if failure is None and status not in (0, None):
            code = fail("demo", f"kvcached {exit_status(status)} when stopped:", 1)
            print(_tail(server.log()), file=sys.stderr)
        if code == 0:
            server.log_path.unlink(missing_ok=True)
    return code
