"""The demo's kvcached under kvload, and what its counters say: `kvprof demo`
prints them (kvprof/commands/demo.py), `kvprof top --demo` watches the same
server and load through the eBPF collectors.

The numbers come from the server itself (`stats` and `stats locks`), so the
demo needs neither root nor BPF. The load is our own `kvload`.
"""

from __future__ import annotations

import contextlib
import math
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

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


def exit_status(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


@dataclass
class Demo:
    """kvcached (a preset, N workers) and kvload against it; stop() stops both.
    `first` and `last` are the server's counters when it started and at the last look."""

    server: Server | None = None
    load: Load | None = None
    first: Sample | None = None
    last: Sample | None = None

    def start(self, preset: str, threads: int, duration: float | None) -> None:
        """The server, its first counters, then the load (for `duration` s, None: until stopped)."""
        kvload_binary()  # fail before starting anything
        self.server = start_kvcached(["--preset", preset, "-t", str(threads)])
        self.first = self.last = sample(self.server)
        self.load = start_load(self.server.address, duration)

    def look(self) -> tuple[Sample, Sample]:
        """(the counters at the last look, now); DemoError when the server or the load died."""
        assert self.server is not None and self.load is not None and self.last is not None
        if not self.server.alive():
            raise DemoError(f"kvcached {exit_status(self.server.proc.returncode)}")
        if self.load.proc.poll() is not None:
            raise DemoError(f"kvload {exit_status(self.load.proc.returncode)}")
        old, self.last = self.last, sample(self.server)
        return old, self.last

    def stop(self, last_look: bool) -> int | None:
        """Stop the load, then the server (`last_look`: its counters read first, when it
        still answers); the server's exit status, None when it never started."""
        if last_look and self.server is not None and self.server.alive() and self.first is not None:
            with contextlib.suppress(TargetError, OSError):
                self.last = sample(self.server)  # count up to the very end when we can
        if self.load is not None:
            self.load.stop()
        return self.server.stop() if self.server is not None else None
