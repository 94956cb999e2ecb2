"""`kvprof probes -p PID [-d SEC]`: the target's USDT probes, their semaphores and live hit rates."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from dataclasses import dataclass, field

from kvprof.commands import add_seconds, command, number

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
    p.add_argument("-p", "--pid", type=int, metavar="PID", help="the process to look at (required)")
    add_seconds(p, "-d", "--duration", type=number(float, 0, 3600), default=1.0,
                help="seconds to count hits for; 0 lists without attaching")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--ebpf", action="store_true", help=argparse.SUPPRESS)  # print the BPF program, exit
    p.set_defaults(run=run)


@dataclass
class Row:
    provider: str
    name: str
    semaphore: int
    semaphore_value: int | None
    sites: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    hits: int | None = None
    per_sec: float | None = None

    @property
    def full_name(self) -> str:
        return f"{self.provider}:{self.name}"


def _fail(message: str) -> int:
    print(f"kvprof probes: {message}", file=sys.stderr)
    return 1


def _may_attach() -> bool:
    if os.geteuid() == 0:
        return True
    from kvprof.system.doctor import CAP_BPF, CAP_PERFMON, Host, cap_eff

    caps = cap_eff(Host())
    return bool(caps >> CAP_BPF & 1 and caps >> CAP_PERFMON & 1)


def run(args: argparse.Namespace) -> int:
    from kvprof.collect.elf import (
        ElfFile,
        ProbesError,
        load_bias,
        open_process,
        probe_names,
        read_probes,
        read_semaphores,
    )

    if args.ebpf:
        from kvprof.collect import PROBES_DIR

        print((PROBES_DIR / "usdt_rate.bpf.c").read_text(), end="")
        return 0
    if args.pid is None:
        return _fail("give the process with -p PID")
    pid: int = args.pid
    try:
        process = open_process(pid)
        elf = ElfFile(process.image)
        sites = read_probes(elf)
        if not sites:
            if args.json:
                print(json.dumps({"pid": pid, "comm": process.comm, "exe": process.exe, "probes": []}))
            else:
                print(f"PID {pid} ({process.comm}): {process.exe} has no USDT probes")
            return 0
        bias = load_bias(process, elf)
        before = read_semaphores(process, sites, bias)
    except ProbesError as e:
        return _fail(str(e))

    rows: dict[tuple[str, str], Row] = {}
    for s in sites:
        row = rows.setdefault(
            (s.provider, s.name),
            Row(s.provider, s.name, s.semaphore, before.get(s.semaphore) if s.semaphore else None),
        )
        row.sites.append((s.location, s.arguments))

    window = None
    skipped: list[tuple[str, str]] = []
    after: dict[int, int] | None = None
    if args.duration > 0:
        if not _may_attach():
            return _fail(
                f"counting hits needs root (or CAP_BPF + CAP_PERFMON): sudo kvprof probes -p {pid}; "
                "-d 0 lists the probes without counting"
            )
        from kvprof.collect import CollectError
        from kvprof.collect.usdt_rate import count_hits

        names = probe_names(sites)
        print(
            f"Counting hits of {len(names)} USDT probes in {process.comm} PID {pid} "
            f"for {args.duration:g} s...",
            file=sys.stderr,
        )
        try:
            rates = count_hits(pid, names, args.duration)
        except CollectError as e:
            return _fail(str(e))
        except KeyboardInterrupt:
            print("kvprof probes: interrupted; all probes detached", file=sys.stderr)
            return 130
        window, skipped = rates.window_s, rates.skipped
        for r in rates.probes:
            rows[(r.provider, r.name)].hits = r.hits
            rows[(r.provider, r.name)].per_sec = r.per_sec
        try:
            after = read_semaphores(process, sites, bias)
        except ProbesError:
            after = None  # the target exited meanwhile

    if args.json:
        print(json.dumps(_json(process.pid, process.comm, process.exe, elf.pie, bias, window, rows, after)))
    else:
        print(_table(process.pid, process.comm, process.exe, elf.pie, bias, window, list(rows.values())))
    if skipped:
        print(
            f"kvprof probes: counted the first {len(names) - len(skipped)} probes only; "
            f"not counted: {', '.join(f'{p}:{n}' for p, n in skipped)}",
            file=sys.stderr,
        )
    if after is not None and after != before:
        changed = [
            r.full_name
            for r in rows.values()
            if r.semaphore and after.get(r.semaphore) != before.get(r.semaphore)
        ]
        print(
            "kvprof probes: warning: semaphores changed while counting (another tracer?): "
            + ", ".join(changed),
            file=sys.stderr,
        )
    return 0


def _json(
    pid: int,
    comm: str,
    exe: str,
    pie: bool,
    bias: int,
    window: float | None,
    rows: dict[tuple[str, str], Row],
    after: dict[int, int] | None,
) -> dict[str, object]:
    return {
        "pid": pid,
        "comm": comm,
        "exe": exe,
        "pie": pie,
        "load_bias": bias,
        "window_s": window,
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
            for r in rows.values()
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
