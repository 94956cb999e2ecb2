#!/usr/bin/env python3
"""What one probe event costs the traced thread on this kernel, by kind.

Builds bench/programs/probe_loop.c, which fires one USDT probe per iteration
(on a 5-byte nop site, as kvcached's are, and on sdt.h's 1-byte nop, which
the kernel runs as an int3 trap) or makes one getppid() syscall, and times
it with nothing attached and with an empty BPF program attached (interleaved,
--rounds times): the difference per iteration is what an event costs the
thread, the BPF run-time statistics give the program's own part, and the
rest is the kernel's (trap, or tracepoint dispatch). kvprof's own-cost figure
uses the uprobe figure (kvprof.collect.UPROBE_HIT_NS); docs/record.md keeps
the measurements.

    sudo .venv/bin/python bench/probe_cost.py [--rounds 5] [--iterations 2000000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "bench" / "programs" / "probe_loop.c"
EMPTY = "int on_event(void *ctx) { return 0; }"
STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


def build(tmp: str) -> str:
    exe = str(Path(tmp) / "probe_loop")
    subprocess.run(["cc", "-O2", "-o", exe, str(SOURCE)], check=True)
    return exe


def timed(exe: str, mode: str, n: int) -> float:
    """ns per iteration of one run."""
    return float(subprocess.run([exe, mode, str(n)], check=True, capture_output=True, text=True).stdout)


def program_ns(bpf: object) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of the one program loaded in `bpf`."""
    fn = bpf.funcs[b"on_event"]  # type: ignore[attr-defined]
    fields = dict(
        line.split(":\t", 1)
        for line in Path(f"/proc/self/fdinfo/{fn.fd}").read_text().splitlines()
        if ":\t" in line
    )
    return int(fields.get("run_time_ns", 0)), int(fields.get("run_cnt", 0))


def measure(exe: str, mode: str, n: int, rounds: int) -> tuple[list[float], float]:
    """Per round, attached minus detached ns per iteration; and the program's ns per run."""
    from bcc import BPF, USDT

    deltas = []
    prog_ns, prog_runs = 0, 0
    for _ in range(rounds):
        base = timed(exe, mode, n)
        if mode == "syscall":
            bpf = BPF(text=EMPTY.encode())
            bpf.attach_raw_tracepoint(tp=b"sys_enter", fn_name=b"on_event")
            t = timed(exe, mode, n)
        else:
            probe = "hit" if mode == "nop5" else "hit1"
            # it sleeps first, so the whole loop runs attached
            proc = subprocess.Popen([exe, mode, str(n), "wait"], stdout=subprocess.PIPE, text=True)
            u = USDT(pid=proc.pid)
            u.enable_probe(probe=f"probe_loop:{probe}", fn_name="on_event")
            bpf = BPF(text=EMPTY.encode(), usdt_contexts=[u])
            out, _ = proc.communicate()
            t = float(out)
        ns, runs = program_ns(bpf)
        prog_ns, prog_runs = prog_ns + ns, prog_runs + runs
        bpf.cleanup()
        deltas.append(t - base)
    return deltas, prog_ns / max(1, prog_runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=2_000_000)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("probe_cost: needs root (it loads BPF programs)", file=sys.stderr)
        return 2
    before = STATS.read_text().strip()
    STATS.write_text("1")
    try:
        with tempfile.TemporaryDirectory(prefix="kvprof-probe-cost-") as tmp:
            exe = build(tmp)
            print(f"kernel {os.uname().release}; {args.rounds} rounds of {args.iterations:,} events each")
            print(f"{'event':<34} {'per event':>10} {'of it BPF':>10} {'kernel':>8}  (spread of rounds)")
            kinds = (("nop5", "uprobe, 5-byte nop (optimized)"), ("int3", "uprobe, 1-byte nop (int3)"),
                     ("syscall", "syscall with raw tp sys_enter"))  # fmt: skip
            for mode, label in kinds:
                deltas, prog = measure(exe, mode, args.iterations, args.rounds)
                med = statistics.median(deltas)
                print(f"{label:<34} {med:>8.0f} ns {prog:>7.0f} ns {med - prog:>5.0f} ns"
                      f"  ({min(deltas):.0f}-{max(deltas):.0f})")  # fmt: skip
    finally:
        STATS.write_text(before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
