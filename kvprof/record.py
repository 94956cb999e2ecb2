"""`kvprof record`: attach to a process, collect for a while, write a profile."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kvprof.collect.server_stats import server_stats
from kvprof.model.profile import Profile


class RecordError(Exception):
    """Recording cannot start or go on; the message is one line saying what to do."""


@dataclass
class RecordOptions:
    pid: int
    duration: float | None = 10.0
    output: Path | None = None
    hz: int = 99
    collectors: tuple[str, ...] = ()
    backend: str = "bpf"
    stack_storage: int = 16384
    max_entries: int = 10240
    offcpu_sample: int = 64
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


def _record_perf(opts: RecordOptions) -> Profile:
    """On-CPU stacks only, from perf (no BPF)."""
    import platform

    from kvprof.collect import perf as perf_backend
    from kvprof.collect.session import ALL_COLLECTORS, TargetGone, describe_target
    from kvprof.model.profile import Host, Status, Window
    from kvprof.model.topology import Topology

    try:
        target = describe_target(opts.pid)
    except TargetGone as e:
        raise RecordError(str(e)) from None
    duration = opts.duration or 10.0
    if not opts.quiet:
        print(
            f"Profiling {target.comm} PID {target.pid} for {duration:g} s at {opts.hz} Hz with perf "
            "(cpu-clock, --call-graph dwarf)...",
            file=sys.stderr,
        )
    topology = Topology.read()
    start = time.time()
    try:
        stacks, threads = perf_backend.record(opts.pid, duration, opts.hz, topology)
    except perf_backend.PerfError as e:
        raise RecordError(str(e)) from None
    status = Status(collectors={"oncpu": "ok (perf backend)"})
    for name in ALL_COLLECTORS[1:]:
        status.collectors[name] = "not run: --backend perf takes on-CPU stacks only"
    return Profile(
        target=target,
        host=Host(kernel=platform.release(), cpus=os.cpu_count() or 0, topology=topology.to_dict()),
        window=Window(start=start, duration_s=duration),
        hz=opts.hz,
        collectors=["oncpu"],
        threads=threads,
        oncpu=stacks,
        status=status,
    )


def record(opts: RecordOptions) -> tuple[Profile, Path]:
    """Records and writes the profile; returns it and where it went."""
    from kvprof.collect import CollectError, CollectOptions
    from kvprof.collect.pyspy import for_record, record_alone
    from kvprof.collect.session import ALL_COLLECTORS, Session, TargetGone, alive

    try:  # py-spy takes the on-CPU stacks of a CPython target; BPF the rest
        spy = for_record(opts)
    except CollectError as e:
        raise RecordError(str(e)) from None
    if not _privileged() and (spy is None or spy.bpf_collectors):
        raise RecordError(
            "loading BPF programs needs root (or CAP_BPF and CAP_PERFMON): run it with sudo; "
            "`kvprof doctor` checks the rest"
        )
    out = opts.output or default_output(opts.pid)
    before = server_stats(opts.pid)
    if opts.backend == "perf":
        perf_profile = _record_perf(opts)
        _finish(perf_profile, before, server_stats(opts.pid))
        perf_profile.save(out)
        return perf_profile, out
    if spy is not None and not spy.bpf_collectors:  # py-spy alone: no BPF, no root
        alone = record_alone(spy, opts.duration, opts.quiet)
        _finish(alone, before, server_stats(opts.pid))
        alone.save(out)
        return alone, out
    try:
        collect = CollectOptions(
            hz=opts.hz,
            stack_storage=opts.stack_storage,
            max_entries=opts.max_entries,
            offcpu_sample=opts.offcpu_sample,
            progress=None if opts.quiet else lambda line: _progress(f"  {line}", final=True),
        )
        session = Session(opts.pid, spy.bpf_collectors if spy else opts.collectors or ALL_COLLECTORS, collect)
    except TargetGone as e:
        raise RecordError(str(e)) from None
    except PermissionError:
        raise RecordError(f"PID {opts.pid} is not ours to trace (permission denied reading /proc)") from None
    except CollectError as e:
        raise RecordError(str(e)) from None
    target = session.target
    how_long = "until Ctrl-C" if opts.duration is None else f"for {opts.duration:g} s"
    if not opts.quiet:
        print(
            f"Profiling {target.comm} PID {target.pid} {how_long} at {opts.hz} Hz... Ctrl-C to stop early",
            file=sys.stderr,
        )
    profile: Profile | None = None
    after: dict[str, dict[str, str]] | None = None
    interrupted = False
    try:
        if not opts.quiet:
            _progress(f"  attaching {len(session.names)} collectors (compiling BPF programs)...")
        session.start()
        if spy is not None:
            spy.start()  # sampling once py-spy says so: a PySpyError is a CollectError
        before = server_stats(opts.pid) or before  # the window starts now
        if not opts.quiet:  # a line of its own in a log, overwritten on a terminal
            _progress(
                f"  attached {len(session.names)} collectors, collecting", final=not sys.stderr.isatty()
            )
        total = "" if opts.duration is None else f"/{opts.duration:g}"
        for snap in session.run(opts.duration, opts.interval, snapshots=False):
            if snap is not None:  # the target died: this is the last of it
                profile = snap
            elif not opts.quiet:
                _progress(f"  {session.elapsed():5.1f}{total} s  collecting")
        if profile is None:
            # The target's own counters first, then the maps, the small kvs maps
            # first (Session reads them first): the two windows end within
            # milliseconds, not after seconds of symbolizing stacks.
            after = server_stats(opts.pid)
            profile = session.snapshot()
    except CollectError as e:
        raise RecordError(str(e)) from None
    except KeyboardInterrupt:
        interrupted = True
        try:
            after = server_stats(opts.pid)
            profile = session.snapshot()
        except Exception:  # keep what the last interval gave
            pass
    finally:
        if spy is not None:
            spy.stop()  # the window BPF had, give or take py-spy's start
        if after is None:
            after = server_stats(opts.pid) if alive(opts.pid) else {}  # before detaching: same window
        session.close()
    if spy is not None:
        if profile is not None:
            spy.contribute(profile)
        spy.close()
    if profile is None:
        raise RecordError("stopped before anything was collected")
    if interrupted:
        profile.status.warnings.append(f"stopped early after {profile.window.duration_s:.1f} s")
    if not opts.quiet:
        _progress(f"  {profile.window.duration_s:5.1f} s  {_summary_of(profile)}", final=True)
    _finish(profile, before, after)
    profile.save(out)
    return profile, out


def _finish(profile: Profile, before: dict[str, dict[str, str]], after: dict[str, dict[str, str]]) -> None:
    """The target's own counters around the window, and the findings."""
    for name, group in before.items():
        profile.server_stats["before" if name == "general" else f"before.{name}"] = group
    for name, group in after.items():
        profile.server_stats["after" if name == "general" else f"after.{name}"] = group
    from kvprof.analysis.findings import find

    profile.findings = find(profile)


def main(opts: RecordOptions) -> int:
    start = time.monotonic()
    try:
        profile, out = record(opts)
    except RecordError as e:
        print(f"kvprof record: {e}", file=sys.stderr)
        return 2
    except OSError as e:
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
