"""`kvprof record -p PID`: attach the collectors, write a profile.

The session is opened as every command opens one (kvprof.system.attach); this
module drives it: the banner, the progress lines, the profile and its findings.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvprof.collect import (
    HOLD_SECONDS,
    HOLD_SECONDS_MAX,
    HZ,
    INLINE_FRAMES,
    MAX_ENTRIES,
    OFFCPU_HZ,
    OFFCPU_SAMPLE,
    OFFCPU_WALKS,
    STACK_STORAGE,
    CollectOptions,
)
from kvprof.commands import (
    add_collectors,
    add_hz,
    add_inline,
    add_pid,
    add_seconds,
    command,
    fail,
    number,
    options,
)
from kvprof.model.profile import Profile

if TYPE_CHECKING:
    from kvprof.collect.session import Session

HELP = "attach to a process and write a profile"

DESCRIPTION = """\
Attach kvprof's eBPF collectors to a running process (on-CPU stacks, off-CPU
and futex waits; on kvcached also lock waits, cache-line transfers and request
latency from its kvs probes), collect for a while, and write a profile file.
Needs root. Everything is detached at the end, on Ctrl-C or SIGTERM (also when
started in the background of a script) or when the target dies. Exit status: 0
written; 130 or 143 stopped early by SIGINT or SIGTERM, written with what came
before; 2 nothing written."""

EXAMPLES = """\
examples:
  kvprof record -p 1234                 # 10 s, every collector, kvprof-1234.json.gz
  kvprof record -p 1234 -d 5 -o base.json.gz
  kvprof record -p 1234 --hz 999 --collectors oncpu,locks
  kvprof record -p $(pgrep -x kvcached) -d 30   # then: kvprof report kvprof-<pid>.json.gz
  kvprof record -p 1234 --backend perf  # no BPF: perf's dwarf unwinding, stacks through libc
  kvprof record -p 1234 -o base.json.gz --flamegraph base.svg   # the profile and its flame graph
  kvprof record -p $(pgrep -f app.py)   # a CPython process: Python stacks from py-spy, waits from BPF
  kvprof record -p 1234 --python --native --collectors oncpu   # py-spy alone (no root for your own)
  kvprof record -p 1234 --follow-forks  # and the worker processes it forks
  kvprof record -p 1234 --hold stats_lock   # and how long that mutex is held (uprobes, 5 s)
  kvprof record -p 1234 --hold 0x55d0c3a2b0c0 --hold-seconds 2   # a heap mutex from report's LOCKS
"""


def add_parser(commands: Any) -> None:
    p = command(commands, "record", HELP, DESCRIPTION, EXAMPLES)
    add_pid(p, "the process to profile")
    add_seconds(p, "-d", "--duration", default=10.0, help="seconds")
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="profile file (.json or .json.gz)")
    add_hz(p)
    add_collectors(p)
    p.add_argument("--stack-storage", type=number(int, 1024, 1 << 20), default=CollectOptions.stack_storage,
                   metavar="N", help="stack ids per stack map (default: %(default)s; raise it when the "
                   "report says stack ids were lost)")  # fmt: skip
    p.add_argument("--max-entries", type=number(int, 1024, 1 << 22), default=CollectOptions.max_entries,
                   metavar="N", help="entries per aggregation map (default: %(default)s; raise it when "
                   "a map was full)")  # fmt: skip
    p.add_argument("--offcpu-hz", type=number(int, 0, 1000), default=CollectOptions.offcpu_hz, metavar="HZ",
                   help="looks a second at each thread of the target for off-CPU stacks and futex "
                   "waits (default: %(default)s; its lock waits timed at its switches in stretches, "
                   "while it has some); 0: time every switch "
                   "instead, exact futex wait counts at a cost at every switch of the machine "
                   "(docs/record.md)")  # fmt: skip
    p.add_argument("--offcpu-sample", type=number(int, 0, 1 << 16), default=CollectOptions.offcpu_sample,
                   metavar="N", help="with --offcpu-hz 0: off-CPU stacks for a random 1 in N context "
                   "switches, scaled by N; "
                   "per-thread off-CPU totals stay exact (default: %(default)s, N follows the switch rate "
                   f"so that each CPU walks about {OFFCPU_WALKS} stacks a second; 1 = every switch: "
                   "docs/record.md gives a stack pair's cost)")  # fmt: skip
    add_inline(p)
    p.add_argument(
        "--backend",
        choices=("bpf", "perf"),
        default="bpf",
        help="bpf (default): every collector; perf: on-CPU stacks only, from `perf record "
        "--call-graph dwarf` (no BPF needed; full stacks through libc)",
    )
    p.add_argument(
        "--flamegraph",
        type=_flamegraph_output,
        metavar="OUT.svg",
        help="also write the on-CPU flame graph (.svg, .folded or .speedscope.json) after recording",
    )
    p.add_argument(
        "--python",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="on-CPU stacks from py-spy, as Python functions with file:line (default: when the "
        "target is CPython); --no-python: BPF's native stacks even then",
    )
    p.add_argument(
        "--native", action="store_true", help="with py-spy: merge C/C++ extension frames into the stacks"
    )
    p.add_argument(
        "--follow-forks",
        action="store_true",
        help="also record the processes the target forks from now on (on-CPU and off-CPU stacks; "
        "until they exec another program); without it a fork is said in the profile",
    )
    p.add_argument(
        "--hold",
        metavar="LOCK",
        default="",
        help="also time every hold of this pthread mutex (a data symbol of the target, or its "
        "address 0x...) with uprobes on glibc's mutex calls, for --hold-seconds: each mutex call "
        'of the target then traps (docs/record.md, "Hold time of one lock")',
    )
    add_seconds(p, "--hold-seconds", type=number(float, 0.1, HOLD_SECONDS_MAX), default=HOLD_SECONDS,
                help="how long --hold's uprobes stay attached, from the start of the recording")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="no banner or progress")
    p.set_defaults(run=_run)


def _flamegraph_output(text: str) -> Path:
    """Checked before recording starts, not after."""
    from kvprof.export import ExportError, format_of

    try:
        format_of(text)
    except ExportError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return Path(text)


def _run(args: argparse.Namespace) -> int:
    return main(options(RecordOptions, args))


class RecordError(Exception):
    """Recording cannot start or go on; the message is one line saying what to do."""


@dataclass
class RecordOptions:
    pid: int
    duration: float | None = 10.0
    output: Path | None = None
    hz: int = HZ
    collectors: tuple[str, ...] = ()
    backend: str = "bpf"
    stack_storage: int = STACK_STORAGE
    max_entries: int = MAX_ENTRIES
    offcpu_sample: int = OFFCPU_SAMPLE
    offcpu_hz: int = OFFCPU_HZ
    inline: bool = INLINE_FRAMES
    interval: float = 1.0
    quiet: bool = False
    flamegraph: Path | None = None  # also write the on-CPU flame graph (.svg/.folded/.speedscope.json)
    python: bool | None = None  # on-CPU stacks from py-spy: None = when the target is CPython
    native: bool = False  # py-spy --native: C frames of extensions merged into the Python stacks
    follow_forks: bool = False  # the target's forked processes too (kvprof.collect.follow)
    hold: str = ""  # time this mutex's holds (kvprof.collect.hold)
    hold_seconds: float = HOLD_SECONDS


def _progress(line: str, final: bool = False) -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r" + line.ljust(78)[:78] + ("\n" if final else ""))
        sys.stderr.flush()
    elif final:
        sys.stderr.write(line + "\n")


def _summary_of(p: Profile) -> str:
    samples = sum(s.count for s in p.oncpu)
    waits = sum(lk.waits for lk in p.locks)
    transfers = sum(c.transfers for c in p.cachelines)
    parts = [f"{samples:,} samples"]
    if "locks" in p.collectors:
        parts.append(f"{waits:,} lock waits")
    if "cachelines" in p.collectors:
        parts.append(f"{transfers:,} transfers")
    if "offcpu" in p.collectors:
        parts.append(f"{len(p.offcpu.futex):,} futex sites")
    return ", ".join(parts)


def default_output(pid: int) -> Path:
    return Path(f"kvprof-{pid}.json.gz")


# how the banner ends: BPF collectors (py-spy may take the on-CPU stacks), or a program alone
_BANNER_END = {
    "bpf": "... Ctrl-C to stop early",
    "pyspy": " with py-spy...",
    "perf": " with perf (cpu-clock, --call-graph dwarf)...",
}


def _collect_options(opts: RecordOptions) -> CollectOptions:
    progress = None if opts.quiet else lambda line: _progress(f"  {line}", final=True)
    return replace(options(CollectOptions, opts), progress=progress)


def record(opts: RecordOptions) -> tuple[Profile, Path, signal.Signals | None]:
    """Records and writes the profile; returns it, where it went, and the signal that
    stopped it early (None: it ran its duration, or until the target exited)."""
    from kvprof.analysis.findings import find
    from kvprof.collect import CollectError
    from kvprof.collect.session import ALL_COLLECTORS, NO_BPF
    from kvprof.system.attach import open_session, pause_on_signals, starved_note, stop_on_signals
    from kvprof.system.debugpkg import names_for, same_root

    collectors = opts.collectors
    if opts.hold:
        collectors = (*(collectors or ALL_COLLECTORS), "hold")
    try:
        session = open_session(opts.pid, collectors, _collect_options(opts))
        if opts.hold:
            _check_hold(opts, session.modules)
    except CollectError as e:
        raise RecordError(str(e)) from None
    bpf = any(module not in NO_BPF for module in session.modules.values())
    out = opts.output or default_output(opts.pid)
    target = session.target
    how_long = "until Ctrl-C" if opts.duration is None else f"for {opts.duration:g} s"
    end = _BANNER_END["bpf" if bpf else session.modules["oncpu"]]
    if not opts.quiet:
        print(f"Profiling {target.comm} {target.pids} {how_long} at {opts.hz} Hz{end}", file=sys.stderr)
    with stop_on_signals(), pause_on_signals(lambda: session):
        profile, stopped = _collect(session, opts, show=bpf and not opts.quiet)
    if profile is None:
        raise RecordError("stopped before anything was collected")
    if stopped is not None:
        profile.status.warnings.append(
            f"stopped early by {stopped.name} after {profile.window.duration_s:.1f} s"
        )
    starved = starved_note()
    if starved:
        profile.status.warnings.append(starved)
    if bpf and not opts.quiet:
        _progress(f"  {profile.window.duration_s:5.1f} s  {_summary_of(profile)}", final=True)
    host_file = same_root(opts.pid)
    for m in profile.missing_symbols:
        m.fix = names_for(m.path, m.module, host_file)
    profile.findings = find(profile)
    profile.save(out)
    return profile, out, stopped


def _check_hold(opts: RecordOptions, modules: dict[str, str]) -> None:
    """--hold's lock and glibc's mutex calls in the target, before anything attaches:
    a CollectError in one line when either is not there."""
    from kvprof.collect import CollectError
    from kvprof.collect.hold import mutex_sites, resolve

    if "hold" not in modules:
        raise CollectError("--hold needs the BPF collectors: drop --backend perf")
    mutex_sites(opts.pid)
    resolve(opts.pid, opts.hold)


def _collect(
    session: Session, opts: RecordOptions, show: bool
) -> tuple[Profile | None, signal.Signals | None]:
    """Attach, collect for opts.duration (the progress shown when `show`) and read the
    profile: (it, the signal that stopped it early or None); None when nothing was."""
    from kvprof.collect import CollectError
    from kvprof.system.attach import end_yield, stopped_by, yield_cpu

    try:
        if show:
            _progress(f"  attaching {len(session.names)} collectors (compiling BPF programs)...")
        session.start()
        yield_cpu()
        if show:  # a line of its own in a log, overwritten on a terminal
            _progress(
                f"  attached {len(session.names)} collectors, collecting", final=not sys.stderr.isatty()
            )
        total = "" if opts.duration is None else f"/{opts.duration:g}"
        for _ in session.run(opts.duration, opts.interval, snapshots=False):
            if show:  # a snapshot when the target died: finish() reads the last
                _progress(f"  {session.elapsed():5.1f}{total} s  collecting")
        end_yield()  # the last read and the profile must end, idle CPU or not
        return session.finish(), None
    except CollectError as e:
        raise RecordError(str(e)) from None
    except KeyboardInterrupt as e:
        end_yield()
        try:
            return session.finish(), stopped_by(e)
        except Exception:  # nothing to keep
            return None, stopped_by(e)
    finally:
        session.close()


def main(opts: RecordOptions) -> int:
    """Exit status: 0 the profile written; 128 + the signal's number (130 SIGINT, 143
    SIGTERM) when one stopped it early and the profile holds what came before; 2 nothing
    written (one line says why)."""
    from kvprof.system.attach import signal_status, stopped_by

    start = time.monotonic()
    try:
        profile, out, stopped = record(opts)
    except (RecordError, OSError) as e:
        return fail("record", str(e))
    except KeyboardInterrupt as e:  # Ctrl-C before the session began: nothing attached yet
        return fail("record", "stopped before anything was attached", signal_status(stopped_by(e)))
    if not opts.quiet:
        note = f" (partial: {profile.status.reason})" if profile.status.partial else ""
        skipped = [f"{n}: {r}" for n, r in profile.status.collectors.items() if not r.startswith("ok")]
        print(f"wrote {out} in {time.monotonic() - start:.1f} s{note}", file=sys.stderr)
        for line in skipped:
            print(f"  {line}", file=sys.stderr)
        print(f"next: kvprof report {out}", file=sys.stderr)
    if opts.flamegraph is not None:
        from kvprof.export import ExportError, export

        try:  # always said, even with --quiet: it names the file written
            print(export(profile, "cpu", opts.flamegraph), file=sys.stderr)
        except ExportError as e:
            return fail("record", f"flame graph: {e}")
    return 0 if stopped is None else signal_status(stopped)
