"""`kvprof demo`: kvcached under load, with its live stats once a second.

The numbers come from the server itself (`stats` and `stats locks`), so the
demo needs neither root nor BPF. The load is our own `kvload`. `make demo`
runs `kvprof top --demo` instead: the same server and load, seen through the
eBPF collectors (root).
"""

from __future__ import annotations

import contextlib
import math
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from kvprof.system.servers import Process, Server, TargetError, die_with_parent, kvload_binary, start_kvcached

LOCK = "topkeys"  # the study's mutex around the top-keys table (`update_topkeys`)

# kvload's workload: the study's shape, batched multi-gets with a few sets,
# 10k keys of 64-256 bytes, 4 connections (two per worker) each keeping 32
# requests in flight. It stores every key first, so gets hit.
LOAD_CONNECTIONS = 4
LOAD_BATCH = 32
LOAD_SET_PCT = 5
LOAD_ITEMS = 10_000
UNBOUNDED_LOAD = 24 * 3600  # "until Ctrl-C"; stopped by PID at exit, and with the demo if it dies

HEADER = (
    f"{'time':>6}{'ops/s':>10}{'hit %':>7}{'curr_items':>12}{'item_objects':>14}"
    f"{LOCK + ' waits/s':>17}{'wait ms/s':>11}"
)
HEADER_EVERY = 20  # lines, as vmstat repeats its header


class DemoError(RuntimeError):
    """The demo cannot go on; the message says why."""


class _Stop(Exception):
    """SIGTERM or SIGHUP: stop like Ctrl-C."""


@dataclass(frozen=True)
class Sample:
    """One reading of the server's counters."""

    at: float  # time.monotonic()
    stats: dict[str, str]
    locks: dict[str, str] | None  # None when the server has no `stats locks`


@dataclass(frozen=True)
class Rates:
    """What one line shows: rates over an interval, gauges at its end."""

    seconds: float
    ops: int
    ops_per_s: float
    hit_rate: float | None  # None when there were no gets
    curr_items: int | None
    item_objects: int | None
    lock_waits: int | None
    lock_waits_per_s: float | None
    lock_wait_ms_per_s: float | None


def _int(values: dict[str, str] | None, name: str) -> int | None:
    if values is None or name not in values:
        return None
    try:
        return int(values[name])
    except ValueError:
        return None


def _delta(old: dict[str, str] | None, new: dict[str, str] | None, name: str) -> int | None:
    a, b = _int(old, name), _int(new, name)
    if a is None or b is None:
        return None
    return b - a


def rates(old: Sample, new: Sample, lock: str = LOCK) -> Rates:
    """Rates between two samples: ops/s (cmd_get + cmd_set), hit rate, lock waits."""
    seconds = max(new.at - old.at, 1e-9)
    ops = sum(_delta(old.stats, new.stats, name) or 0 for name in ("cmd_get", "cmd_set"))
    hits = _delta(old.stats, new.stats, "get_hits")
    misses = _delta(old.stats, new.stats, "get_misses")
    hit_rate = None
    if hits is not None and misses is not None and hits + misses > 0:
        hit_rate = hits / (hits + misses)
    waits = _delta(old.locks, new.locks, f"{lock}:contended")
    wait_ns = _delta(old.locks, new.locks, f"{lock}:wait_ns")
    return Rates(
        seconds=seconds,
        ops=ops,
        ops_per_s=ops / seconds,
        hit_rate=hit_rate,
        curr_items=_int(new.stats, "curr_items"),
        item_objects=_int(new.stats, "item_objects"),
        lock_waits=waits,
        lock_waits_per_s=None if waits is None else waits / seconds,
        lock_wait_ms_per_s=None if wait_ns is None else wait_ns / 1e6 / seconds,
    )


def _num(value: float | None, width: int, decimals: int = 0) -> str:
    if value is None:
        return f"{'-':>{width}}"
    return f"{value:>{width},.{decimals}f}"


def format_line(elapsed: float, r: Rates) -> str:
    """One fixed-width line under HEADER (77 columns)."""
    hit = None if r.hit_rate is None else 100 * r.hit_rate
    return (
        f"{elapsed:>5.0f}s"
        + _num(r.ops_per_s, 10)
        + _num(hit, 7, 1)
        + _num(r.curr_items, 12)
        + _num(r.item_objects, 14)
        + _num(r.lock_waits_per_s, 17)
        + _num(r.lock_wait_ms_per_s, 11, 1)
    )


def format_summary(r: Rates, lock: str = LOCK) -> str:
    """The last line: the whole run's rates."""
    hit = "-" if r.hit_rate is None else f"{100 * r.hit_rate:.1f} %"
    if r.lock_waits_per_s is None or r.lock_wait_ms_per_s is None:
        waits = f"{lock} lock: -"
    else:
        waits = f"{lock} lock {r.lock_waits_per_s:,.0f} waits/s, {r.lock_wait_ms_per_s:,.1f} ms/s"
    return f"summary: {r.seconds:.0f} s, {r.ops_per_s:,.0f} ops/s, hits {hit}, {waits}"


def sample(server: Server) -> Sample:
    """Read `stats` and, when the server has it, `stats locks`."""
    general = server.stats()
    try:
        locks: dict[str, str] | None = server.stats("locks")
    except TargetError:
        locks = None  # e.g. a stock memcached: the columns show "-"
    return Sample(time.monotonic(), general, locks)


@dataclass
class Load(Process):
    """A running kvload, its output kept in a file."""

    argv: list[str]

    def describe(self) -> str:
        return (
            f"kvload PID {self.proc.pid}, {LOAD_CONNECTIONS} connections x {LOAD_BATCH} requests "
            f"in flight, {100 - LOAD_SET_PCT}% multi-get / {LOAD_SET_PCT}% set, {LOAD_ITEMS:,} keys"
        )

    def cleanup(self) -> None:
        self.log_path.unlink(missing_ok=True)


def start_load(address: str, duration: float | None) -> Load:
    """kvload against `address`, for `duration` seconds (plus slack) or until stopped."""
    run_for = UNBOUNDED_LOAD if duration is None else math.ceil(duration) + 5
    argv = [
        str(kvload_binary()),
        f"--server={address}",
        f"--connections={LOAD_CONNECTIONS}",
        f"--batch-size={LOAD_BATCH}",
        f"--set-pct={LOAD_SET_PCT}",
        f"--num-items={LOAD_ITEMS}",
        "--min-size=64",
        "--max-size=256",
        f"--duration={run_for}",
        "--quiet",
    ]
    with tempfile.NamedTemporaryFile(prefix="kvprof-demo-kvload-", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
    return Load(proc, Path(log.name), argv)


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _stop_on_term() -> Iterator[None]:
    """SIGTERM and SIGHUP end the demo the way Ctrl-C does (stop both, summarize)."""
    old = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGHUP, _raise_stop)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _ignore_stop_signals() -> None:
    # A second Ctrl-C while stopping must not leave the server or the load behind.
    for sig in _SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _exit_status(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


def run(
    duration: float | None = None,
    preset: str = "baseline",
    threads: int = 2,
    interval: float = 1.0,
) -> int:
    """Run the demo; returns the exit status (0 when stopped by Ctrl-C, a signal or the duration)."""
    out = sys.stdout
    server: Server | None = None
    load: Load | None = None
    first: Sample | None = None
    last: Sample | None = None
    failure: str | None = None
    with _stop_on_term():
        try:
            kvload_binary()  # fail before starting anything
            server = start_kvcached(["--preset", preset, "-t", str(threads)])
            first = last = sample(server)
            load = start_load(server.address, duration)
            # kvcached answers `version` as "1.6.0-kvcached-0.1.0" for memcached's clients.
            version = first.stats.get("version", "?").rsplit("kvcached-", 1)[-1]
            until = "Ctrl-C to stop" if duration is None else f"{duration:g} s, Ctrl-C to stop early"
            print(
                f"kvprof demo: kvcached {version} (preset {preset}, {threads} workers) "
                f"PID {server.pid} on {server.address}\n"
                f"  load: {load.describe()}\n"
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
                if not server.alive():
                    raise DemoError(f"kvcached {_exit_status(server.proc.returncode)}")
                if load.proc.poll() is not None:
                    raise DemoError(f"kvload {_exit_status(load.proc.returncode)}")
                new = sample(server)
                if lines % HEADER_EVERY == 0:
                    print(HEADER, file=out)
                print(format_line(new.at - start, rates(last, new)), file=out, flush=True)
                last = new
                lines += 1
        except KeyboardInterrupt:
            print(file=out)  # after the terminal's ^C
        except _Stop:
            pass
        except (DemoError, TargetError, OSError) as e:
            failure = str(e)
        finally:
            _ignore_stop_signals()
            if server is not None and server.alive() and first is not None and failure is None:
                with contextlib.suppress(TargetError, OSError):
                    last = sample(server)  # count up to the very end when we can
            if load is not None:
                load.stop()
            status = server.stop() if server is not None else None

    if failure is not None:
        print(f"kvprof demo: error: {failure}", file=sys.stderr)
        if server is not None and server.log().strip():
            print(f"  kvcached said ({server.log_path}):\n{_tail(server.log())}", file=sys.stderr)
        if load is not None and load.log().strip():
            print(f"  kvload said:\n{_tail(load.log())}", file=sys.stderr)
    elif first is not None and last is not None and last is not first:
        print(format_summary(rates(first, last)), file=out, flush=True)
    if load is not None:
        load.cleanup()
    if server is not None:
        if failure is None and status not in (0, None):
            print(f"kvprof demo: kvcached {_exit_status(status)} when stopped:", file=sys.stderr)
            print(_tail(server.log()), file=sys.stderr)
            failure = f"status {status}"
        if failure is None:
            server.log_path.unlink(missing_ok=True)
    return 0 if failure is None else 1
