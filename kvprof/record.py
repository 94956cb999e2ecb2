"""`kvprof record`: attach to a process, collect for a while, write a profile."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kvprof.collect import HZ, MAX_ENTRIES, OFFCPU_SAMPLE, STACK_STORAGE
from kvprof.model.profile import Profile


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
    interval: float = 1.0
    quiet: bool = False
    flamegraph: Path | None = None  # also write the on-CPU flame graph (.svg/.folded/.speedscope.json)
    python: bool | None = None  # on-CPU stacks from py-spy: None = when the target is CPython
    native: bool = False  # py-spy --native: C frames of extensions merged into the Python stacks


def _privileged() -> bool:
    return os.geteuid() == 0


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


def record(opts: RecordOptions) -> tuple[Profile, Path]:
    """Records and writes the profile; returns it and where it went."""
    from kvprof.analysis.findings import find
    from kvprof.collect import CollectError, CollectOptions
    from kvprof.collect.session import ALL_COLLECTORS, NO_BPF, Session, TargetGone

    try:
        session = Session(
            opts.pid,
            opts.collectors or ALL_COLLECTORS,
            CollectOptions(
                hz=opts.hz,
                stack_storage=opts.stack_storage,
                max_entries=opts.max_entries,
                offcpu_sample=opts.offcpu_sample,
                progress=None if opts.quiet else lambda line: _progress(f"  {line}", final=True),
                backend=opts.backend,
                python=opts.python,
                native=opts.native,
            ),
        )
    except TargetGone as e:
        raise RecordError(str(e)) from None
    except PermissionError:
        raise RecordError(
            f"PID {opts.pid} is not ours to trace (permission denied reading /proc): "
            "run kvprof as root (sudo)"
        ) from None
    except CollectError as e:
        raise RecordError(str(e)) from None
    bpf = [n for n, module in session.modules.items() if module not in NO_BPF]
    if bpf and not _privileged():
        raise RecordError(
            "loading BPF programs needs root (or CAP_BPF and CAP_PERFMON): run it with sudo; "
            "`kvprof doctor` checks the rest"
        )
    out = opts.output or default_output(opts.pid)
    target = session.target
    how_long = "until Ctrl-C" if opts.duration is None else f"for {opts.duration:g} s"
    end = _BANNER_END["bpf" if bpf else session.modules["oncpu"]]
    if not opts.quiet:
        print(f"Profiling {target.comm} PID {target.pid} {how_long} at {opts.hz} Hz{end}", file=sys.stderr)
    profile: Profile | None = None
    interrupted = False
    try:
        if bpf and not opts.quiet:
            _progress(f"  attaching {len(session.names)} collectors (compiling BPF programs)...")
        session.start()
        if bpf and not opts.quiet:  # a line of its own in a log, overwritten on a terminal
            _progress(
                f"  attached {len(session.names)} collectors, collecting", final=not sys.stderr.isatty()
            )
        total = "" if opts.duration is None else f"/{opts.duration:g}"
        for _ in session.run(opts.duration, opts.interval, snapshots=False):
            if bpf and not opts.quiet:  # a snapshot when the target died: finish() reads the last
                _progress(f"  {session.elapsed():5.1f}{total} s  collecting")
        profile = session.finish()
    except CollectError as e:
        raise RecordError(str(e)) from None
    except KeyboardInterrupt:
        interrupted = True
        try:
            profile = session.finish()
        except Exception:  # nothing to keep
            pass
    finally:
        session.close()
    if profile is None:
        raise RecordError("stopped before anything was collected")
    if interrupted:
        profile.status.warnings.append(f"stopped early after {profile.window.duration_s:.1f} s")
    if bpf and not opts.quiet:
        _progress(f"  {profile.window.duration_s:5.1f} s  {_summary_of(profile)}", final=True)
    profile.findings = find(profile)
    profile.save(out)
    return profile, out


def main(opts: RecordOptions) -> int:
    start = time.monotonic()
    try:
        profile, out = record(opts)
    except (RecordError, OSError) as e:
        print(f"kvprof record: {e}", file=sys.stderr)
        return 2
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
            print(f"kvprof record: flame graph: {e}", file=sys.stderr)
            return 2
    return 0
