"""Run `kvprof top`: check what can be checked before the screen is taken, then the app.

Everything that can fail with a plain message (not root, no BCC, no such
process, an unreadable profile, kvcached not built) fails here, on the
terminal as it is, with the command that helps; the app starts only after.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvprof.collect import HZ, INLINE_FRAMES, TOP_INTERVAL_S
from kvprof.model.profile import Profile, ProfileError

if TYPE_CHECKING:
    from kvprof.tui.sources import Source

TERMINAL_CHECK_S = 1.0  # how often top looks whether its terminal is still there
LOAD_WAIT_S = 20.0  # --demo: start the load after this long even if attaching is not done
DOCTOR_HINT = "`kvprof doctor` checks the kernel, BPF, headers and tracefs and says what to fix"


@dataclass
class TopOptions:
    pid: int | None = None
    demo: bool = False
    replay: Path | None = None
    hz: int = HZ
    interval: float = TOP_INTERVAL_S
    collectors: tuple[str, ...] = ()
    inline: bool = INLINE_FRAMES
    output_dir: Path = Path(".")
    baseline: Path | None = None  # the Flame view's diff compares with it


def _fail(message: str, hint: bool = False) -> int:
    from kvprof.commands import fail

    status = fail("top", message)
    if hint:
        print(f"  {DOCTOR_HINT}", file=sys.stderr)
    return status


def main(opts: TopOptions) -> int:
    """Exit status: 0 quit with q, or the target exited; 128 + the signal's number when
    SIGINT, SIGTERM or SIGHUP ended it; 2 it could not start (one line says why)."""
    from kvprof.system.attach import signal_status, stop_on_signals, stopped_by

    try:
        with stop_on_signals(signal.SIGHUP):  # until the app takes them over (TopApp.on_mount)
            status = _main(opts)
    except KeyboardInterrupt as e:  # before the app took them, or while it started
        status = signal_status(stopped_by(e))
    if opts.replay is None:
        # Everything is detached and every server we started is stopped by now. What is
        # left is the interpreter's teardown, where libbcc's LLVM destructors take most
        # of a second (docs/top.md), or a compile that close() chose not to wait for
        # (see LiveSource.close): skip both.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _main(opts: TopOptions) -> int:
    from kvprof.tui.sources import LiveSource, ReplaySource

    baseline = None
    if opts.baseline is not None:
        try:
            baseline = Profile.load(opts.baseline)
        except ProfileError as e:
            return _fail(str(e))
    source: Source
    if opts.replay is not None:
        try:
            source = ReplaySource(opts.replay)
        except ProfileError as e:
            return _fail(str(e))
        return _run(source, opts, baseline)
    from kvprof.system.attach import bpf_unavailable

    why = bpf_unavailable()
    if why is not None:
        return _fail(why, hint=True)
    if opts.demo:
        return _demo(opts, baseline)
    assert opts.pid is not None
    from kvprof.collect import CollectError

    try:
        source = LiveSource(opts.pid, opts.hz, opts.collectors, opts.inline, yield_cpu=True)
    except CollectError as e:  # before the screen is taken
        return _fail(str(e))
    return _run(source, opts, baseline)


def _demo(opts: TopOptions, baseline: Profile | None) -> int:
    from kvprof.system import demo
    from kvprof.system.servers import TargetError, kvload_binary, start_kvcached
    from kvprof.tui.sources import LiveSource

    try:
        kvload_binary()
        server = start_kvcached(["--preset", "baseline", "-t", "2"])
    except TargetError as e:
        return _fail(str(e))
    failed: list[str] = []
    done = threading.Event()
    source = LiveSource(server.pid, opts.hz, opts.collectors, opts.inline, yield_cpu=True)
    source.start()

    def run_load() -> None:
        # Compiling a BPF program takes seconds of CPU; on a small machine saturated by
        # the load it takes twice as long. The load starts once the lock and cache-line
        # programs are attached (or after LOAD_WAIT_S), so the spots are named sooner.
        # This thread lives until the end: kvload dies with the thread that started it.
        source.wait_attached(("locks", "cachelines"), LOAD_WAIT_S)
        if done.is_set() or source.stopped():
            return
        try:
            load = demo.start_load(server.address, None)
        except (TargetError, OSError) as e:
            failed.append(str(e))
            return
        done.wait()
        load.stop()
        load.cleanup()

    loader = threading.Thread(target=run_load, name="kvprof-demo-load")
    loader.start()
    print(
        f"kvprof top --demo: kvcached PID {server.pid} on {server.address} (baseline, 2 workers); "
        f"kvload starts once the kvs probes are attached",
        file=sys.stderr,
    )
    try:
        status = _run(source, opts, baseline, cleanup=server.stop)
    finally:
        source.close()
        done.set()
        loader.join()
        code = server.stop()
        if code == 0:
            server.log_path.unlink(missing_ok=True)
        else:
            print(f"kvprof top: kvcached exited with {code}; its log: {server.log_path}", file=sys.stderr)
    if failed:
        return _fail(f"kvload did not start: {failed[0]}")
    return status


def _terminal_gone() -> bool:
    """Whether the terminal on stdin or stdout has gone away: a pseudo-terminal whose
    other end was closed shows as '/dev/pts/N (deleted)'."""
    for fd in (0, 1):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").endswith(" (deleted)"):
                return True
        except OSError:
            return True
    return False


def _watch_terminal(source: Source, cleanup: Callable[[], object] | None) -> None:
    """End kvprof when its terminal goes away without a SIGHUP (a pseudo-terminal that
    was not its controlling terminal): Textual then spins on the dead terminal and
    never returns. Detach, stop what --demo started, and exit."""
    while not _terminal_gone():
        time.sleep(TERMINAL_CHECK_S)
    try:
        source.close()
        if cleanup is not None:
            cleanup()
    finally:
        os._exit(1)


def _run(
    source: Source, opts: TopOptions, baseline: Profile | None, cleanup: Callable[[], object] | None = None
) -> int:
    from kvprof.system.attach import pause_on_signals, signal_status

    app = None
    try:
        source.start()  # attaching takes seconds: begin before Textual loads and sets up the screen
        from kvprof.tui.app import TopApp

        threading.Thread(
            target=_watch_terminal, args=(source, cleanup), name="kvprof-tty", daemon=True
        ).start()
        app = TopApp(
            source, interval=opts.interval, out_dir=opts.output_dir, handle_signals=True, baseline=baseline
        )
        with pause_on_signals(lambda: getattr(source, "session", None)):  # a live source's
            app.run()
    finally:
        if app is not None:
            app.wait_closed()
        else:
            source.close()
    for path in app.written:
        print(f"kvprof top: wrote {path}", file=sys.stderr)
    if app.frame is not None and app.frame.status.ended:
        print(f"kvprof top: {app.frame.status.ended.split(':', 1)[0]}", file=sys.stderr)
    return 0 if app.stopped_by is None else signal_status(app.stopped_by)
