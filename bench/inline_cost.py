#!/usr/bin/env python3
"""What inline frames cost (kvprof/collect/inline.py): per distinct address,
and in all on a kvcached recording.

1. `record` run in this process on kvcached (baseline preset, 2 workers)
   under the demo load, every default collector, --seconds long: the time
   spent looking up inline chains (`inline.module_inlines` and
   `ModuleInlines.chain`, timed by wrapping them), the distinct addresses
   looked up, the `[inlined]` frames in the profile, beside the whole of
   user-frame symbolization (`Symbolizer.frames_at`) and the CPU seconds of
   the recording; then the same recording with --no-inline.
2. The DWARF of one binary (kvcached's, or --binary PATH such as a debug file
   under /usr/lib/debug/.build-id/), in a fresh process: the seconds to open
   it, and every --step-th address of its .text looked up in address order:
   the first lookup in a function reads that function's DIEs (and, first in
   its compile unit, the unit's list of functions), the others only search
   what was read.

Run it as root, under the benchmark lock so no other measurement overlaps:

    flock /tmp/kvprof-bench.lock .venv/bin/python bench/inline_cost.py \
        [--seconds 5] [--binary PATH] [--step 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvprof.collect import inline, symbols  # noqa: E402
from kvprof.commands.record import RecordOptions, record  # noqa: E402
from kvprof.model.profile import INLINED, Profile  # noqa: E402
from kvprof.system import demo  # noqa: E402
from kvprof.system.servers import kvcached_binary, start_kvcached  # noqa: E402


class Timer:
    """Calls and seconds spent in the functions it wraps."""

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1

        return timed


def cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def frames(profile: Profile) -> list[str]:
    out = [f for s in profile.oncpu for f in s.frames]
    out += [f for s in profile.offcpu.stacks for f in s.frames]
    out += [f for s in profile.offcpu.futex for f in s.frames]
    return out + [f for lk in profile.locks for s in lk.stacks for f in s.frames]


def recording(pid: int, seconds: float, out: Path) -> None:
    """Part 1: one recording with inline frames, timed inside, then one without."""
    opened, chains, symbolized = Timer(), Timer(), Timer()
    inline.module_inlines = opened.wrap(inline.module_inlines)  # type: ignore[method-assign]
    inline.ModuleInlines.chain = chains.wrap(inline.ModuleInlines.chain)  # type: ignore[method-assign]
    symbols.Symbolizer.frames_at = symbolized.wrap(symbols.Symbolizer.frames_at)  # type: ignore[method-assign]
    for inlines in (True, False):
        t0 = cpu_s()
        opts = RecordOptions(pid=pid, duration=seconds, output=out, inline=inlines, quiet=True)
        profile, _, _ = record(opts)
        used = cpu_s() - t0
        seen = frames(profile)
        marked = [f for f in seen if f.endswith(INLINED)]
        how = "(inline frames)" if inlines else "--no-inline"
        print(f"record -d {seconds:g} {how:16}: {used:.2f} CPU s; "
              f"{len(seen):,} frames in the profile, {len(marked):,} [inlined] "
              f"({len(set(marked))} distinct)")  # fmt: skip
        if inlines:
            per = chains.seconds / chains.calls * 1e6 if chains.calls else 0.0
            print(f"  inline lookups: {chains.calls:,} distinct addresses, {chains.seconds:.3f} s "
                  f"({per:.0f} us each, DWARF read included); modules opened: {opened.calls} "
                  f"in {opened.seconds:.3f} s")  # fmt: skip
            print(f"  all user-frame symbolization (Symbolizer.frames_at): {symbolized.calls:,} calls, "
                  f"{symbolized.seconds:.3f} s, of which inline "
                  f"{(chains.seconds + opened.seconds) / max(symbolized.seconds, 1e-9):.0%}")  # fmt: skip


def dwarf(path: str, step: int) -> None:
    """Part 2 (its own process: the tables are cached per build-id in a process)."""
    out = subprocess.run(["readelf", "-SW", path], capture_output=True, text=True, check=True).stdout
    row = next(line.split() for line in out.splitlines() if " .text " in line)
    at = row.index(".text")
    lo, size = int(row[at + 2], 16), int(row[at + 4], 16)
    t0 = time.perf_counter()
    tables = inline.module_inlines(path)
    opened = time.perf_counter() - t0
    if tables is None:
        print(f"{path}: no DWARF")
        return
    first: list[float] = []
    rest: list[float] = []
    found = 0
    for pc in range(lo, lo + size, step):
        read = len(tables.functions) + len(tables.calls)
        t0 = time.perf_counter()
        found += bool(tables.chain(pc))
        (first if len(tables.functions) + len(tables.calls) > read else rest).append(time.perf_counter() - t0)
    print(f"{path}: opened in {opened * 1e3:.1f} ms, {len(tables.units):,} compile-unit ranges")
    print(f"  {len(first) + len(rest):,} addresses (every {step}th of .text), {found:,} in inlined code")
    if first:
        print(f"  first address of a function (reads it): {len(first)} functions "
              f"({len(tables.functions)} units), median "
              f"{statistics.median(first) * 1e3:.1f} ms, max {max(first) * 1e3:.1f} ms, "
              f"total {sum(first):.2f} s")  # fmt: skip
    if rest:
        print(f"  any other address: median {statistics.median(rest) * 1e6:.1f} us, "
              f"max {max(rest) * 1e6:.0f} us")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="each recording's length (default 5)")
    ap.add_argument("--binary", help="the binary of part 2 (default: kvcached's)")
    ap.add_argument("--step", type=int, default=3, help="part 2 looks up every STEP-th address (default 3)")
    ap.add_argument("--dwarf-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    path = a.binary or str(kvcached_binary())
    if a.dwarf_only:
        dwarf(path, a.step)
        return 0
    if os.geteuid() != 0:
        print("inline_cost: needs root (record loads BPF programs)", file=sys.stderr)
        return 2
    server = start_kvcached(["--preset", "baseline", "-t", "2"])
    load = demo.start_load(server.address, None)
    try:
        time.sleep(2.0)  # kvload populates its keys first
        print(f"kvcached PID {server.pid} (baseline, 2 workers) under the demo load; "
              f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="kvprof-inline-") as tmp:
            recording(server.pid, a.seconds, Path(tmp) / "p.json.gz")
    finally:
        load.stop()
        load.cleanup()
        server.stop()
        server.log_path.unlink(missing_ok=True)
    args = [sys.executable, __file__, "--dwarf-only", "--binary", path, "--step", str(a.step)]
    return subprocess.run(args, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
