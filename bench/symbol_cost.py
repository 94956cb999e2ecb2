#!/usr/bin/env python3
"""What naming user addresses costs: per module, reading its symbols (its
debug file found by build-id / .gnu_debuglink / .gnu_debugdata, else its own
tables) the first time and from the cache, and per distinct address, the
lookup kvprof.collect.debuginfo makes, beside BCC's symbolizer (what kvprof
used before) resolving the same addresses in the same run.

The target is this process itself: python3 (a large .symtab), libc (its
libc6-dbg debug file) and the libraries it maps. Addresses are drawn evenly
from each module's executable mapping. docs/record.md keeps the numbers.

    sudo .venv/bin/python bench/symbol_cost.py [--addresses 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--addresses", type=int, default=20000, help="distinct addresses per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="kvprof-symbench-")  # a cold cache
    sys.path.insert(0, str(REPO))
    from kvprof.collect import debuginfo

    pid = os.getpid()
    process = debuginfo.ProcessSymbols(pid)
    process.refresh()
    text = [m for m in process.maps if "x" in m.perms and m.path.startswith("/")]
    print(f"{'module':<34} {'names from':<14} {'functions':>9} {'first read':>11} {'cached':>9}")
    for m in {m.path: m for m in text}.values():
        image = f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}"
        t0 = time.perf_counter()
        syms = debuginfo.module_symbols(image, m.path)
        first = time.perf_counter() - t0
        debuginfo._TABLES.clear()
        debuginfo._FILES.clear()
        t0 = time.perf_counter()
        debuginfo.module_symbols(image, m.path)
        cached = time.perf_counter() - t0
        times = f"{first * 1e3:>9.1f}ms {cached * 1e3:>7.1f}ms"
        print(f"{m.name[:34]:<34} {syms.source:<14} {len(syms.funcs):>9,} {times}")
    rng = random.Random(1)
    span = sum(m.end - m.start for m in text)
    ours, bccs = [], []
    for _ in range(args.rounds):
        addrs = set()
        while len(addrs) < args.addresses:
            off = rng.randrange(span)
            for m in text:
                if off < m.end - m.start:
                    addrs.add(m.start + off)
                    break
                off -= m.end - m.start
        fresh = debuginfo.ProcessSymbols(pid)
        fresh.load_all()
        t0 = time.perf_counter()
        for a in addrs:
            fresh.function_name(a)
        ours.append((time.perf_counter() - t0) / len(addrs))
        from bcc import BPF

        cache = BPF._sym_cache(pid)
        for a in list(addrs)[:100]:  # its per-module tables, loaded before timing
            cache.resolve(a, True)
        t0 = time.perf_counter()
        for a in addrs:
            cache.resolve(a, True)
        bccs.append((time.perf_counter() - t0) / len(addrs))
    print(f"\nper distinct address ({args.addresses:,} per round, {args.rounds} rounds, median):")
    print(f"  kvprof debuginfo lookup  {statistics.median(ours) * 1e6:6.2f} us")
    print(f"  BCC symbolizer resolve   {statistics.median(bccs) * 1e6:6.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
