"""How much CPU `kvprof top` itself uses while it watches a busy kvcached.

Starts kvcached (baseline preset, 2 workers) under kvprof's demo load, runs
`kvprof top -p PID` in a pseudo-terminal (132x40, at top's default interval)
as a user would, waits until every collector is attached, then reads the TUI
process's utime+stime from /proc over --seconds (default 30) and prints it as
a share of one core, with the attach phase (compiling five BPF programs)
shown separately. Needs root. The target: under 10 % of one core. It also
prints the server's ops/s over the same length of time before the TUI started
and while it watched (one pair: a rough figure; bench/overhead.py is the
careful measure of what the collectors cost; `bench/overhead.py --watch
top` measures top itself that way).

With `--view N` it presses N once everything is attached, so the view
measured is that one (7: the Flame view), not Overview.

With `--threads N` the target is tests/programs/lifecycle.c with N threads
(each waking every 50 ms to spin briefly) instead of kvcached: how top copes
with a target of a thousand threads (the target: under 25 % of one core).

    sudo .venv/bin/python bench/top_cpu.py [--seconds 30] [--interval 1] [--view N] [--threads N]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvprof.collect import TOP_INTERVAL_S  # noqa: E402
from kvprof.system import demo  # noqa: E402
from kvprof.system.servers import start_kvcached  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
ATTACHED = "collectors ✓".encode()
VIEW_MARKS = {"5": b"the busiest", "7": b"Enter zoom"}  # what the view draws, to know the key was taken


def ops(server: object) -> int:
    stats = server.stats()  # type: ignore[attr-defined]
    return int(stats["cmd_get"]) + int(stats["cmd_set"])


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class Screen:
    """A pseudo-terminal running one command; its output is read and kept (the last 64 KB)."""

    def __init__(self, argv: list[str], cols: int = 132, rows: int = 40) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True, close_fds=True
        )
        os.close(slave)
        self.tail = b""
        self.seen_attached = threading.Event()
        self.marker = b""  # set_marker(): seen_marker once the output shows it
        self.seen_marker = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self.master], [], [], 0.5)
            if not ready:
                if self.proc.poll() is not None:
                    return
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.tail = (self.tail + chunk)[-65536:]
            if ATTACHED in self.tail:
                self.seen_attached.set()
            if self.marker and self.marker in self.tail:
                self.seen_marker.set()

    def press(self, key: bytes) -> None:
        os.write(self.master, key)

    def stop(self, timeout: float = 10.0) -> float:
        """q, then wait; SIGTERM if it does not go. Returns the seconds it took."""
        t = time.monotonic()
        if self.proc.poll() is None:
            self.press(b"q")
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout)
        self._reader.join(2)
        os.close(self.master)
        return time.monotonic() - t


def start_threads(n: int, tmp: str) -> subprocess.Popen[str]:
    """tests/programs/lifecycle.c with `n` threads (it runs until its stdin closes)."""
    build = REPO / "server" / "build"
    exe = os.path.join(tmp, "lifecycle")
    subprocess.run(
        ["cc", "-O1", "-g", "-fno-omit-frame-pointer", "-pthread", f"-I{build}", "-o", exe,
         str(REPO / "tests" / "programs" / "lifecycle.c"), str(build / "kvs_probes.o")],
        check=True,
    )  # fmt: skip
    proc = subprocess.Popen(
        [exe, "threads", str(n), "3600"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def watch_threads(a: argparse.Namespace) -> int:
    """--threads: top's own CPU on a target of that many threads."""
    with tempfile.TemporaryDirectory() as tmp:
        target = start_threads(a.threads, tmp)
        screen = Screen(
            [sys.executable, "-m", "kvprof.cli", "top", "-p", str(target.pid), "-i", str(a.interval)]
        )
        try:
            # not kvcached: cachelines and requests do not apply, regsample attaches last
            screen.marker = "regsample✓".encode()
            if not screen.seen_marker.wait(120):
                print("top_cpu: the collectors did not all attach within 120 s", file=sys.stderr)
                return 1
            screen.seen_marker.clear()
            screen.tail = b""
            screen.marker = VIEW_MARKS.get(a.view, b"")
            screen.press(a.view.encode())
            if screen.marker and not screen.seen_marker.wait(10):
                print(f"top_cpu: view {a.view} did not show within 10 s", file=sys.stderr)
                return 1
            time.sleep(2.0)
            c0, w0 = cpu_seconds(screen.proc.pid), time.monotonic()
            time.sleep(a.seconds)
            c1, w1 = cpu_seconds(screen.proc.pid), time.monotonic()
            print(f"kvprof top -i {a.interval:g}, view {a.view}, on a target of {a.threads:,} threads")
            print(f"  steady state over {w1 - w0:.0f} s: {c1 - c0:5.2f} s CPU = {(c1 - c0) / (w1 - w0):.1%} "
                  "of one core (target < 25 %)")  # fmt: skip
            return 0
        finally:
            screen.stop()
            assert target.stdin is not None
            target.stdin.close()
            target.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0, help="measuring window (default: 30)")
    ap.add_argument(
        "--interval",
        type=float,
        default=TOP_INTERVAL_S,
        help=f"kvprof top --interval (default: {TOP_INTERVAL_S:g})",
    )
    ap.add_argument("--view", default="1", choices=list("1234567"), help="the view shown (default: 1)")
    ap.add_argument("--threads", type=int, default=0, help="watch a target of N threads, not kvcached")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("top_cpu: needs root (kvprof top loads BPF programs)", file=sys.stderr)
        return 2
    if a.threads:
        return watch_threads(a)
    server = start_kvcached(["--preset", "baseline", "-t", "2"])
    load = demo.start_load(server.address, None)
    screen = None
    try:
        time.sleep(2.0)  # kvload populates its keys first
        o0, t = ops(server), time.monotonic()
        time.sleep(a.seconds)
        alone = (ops(server) - o0) / (time.monotonic() - t)
        argv = [sys.executable, "-m", "kvprof.cli", "top", "-p", str(server.pid), "-i", str(a.interval)]
        t0 = time.monotonic()
        screen = Screen(argv)
        if not screen.seen_attached.wait(120):
            print("top_cpu: the collectors did not all attach within 120 s", file=sys.stderr)
            return 1
        attach_s = time.monotonic() - t0
        attach_cpu = cpu_seconds(screen.proc.pid)
        screen.marker = VIEW_MARKS.get(a.view, b"")
        screen.press(a.view.encode())
        if screen.marker and not screen.seen_marker.wait(10):
            print(f"top_cpu: view {a.view} did not show within 10 s", file=sys.stderr)
            return 1
        time.sleep(2.0)  # the first full intervals after the last attach
        o0, c0, w0 = ops(server), cpu_seconds(screen.proc.pid), time.monotonic()
        time.sleep(a.seconds)
        o1, c1, w1 = ops(server), cpu_seconds(screen.proc.pid), time.monotonic()
        watched = (o1 - o0) / (w1 - w0)
        quit_s = screen.stop()
        share = (c1 - c0) / (w1 - w0)
        print(
            f"kvprof top -p {server.pid} -i {a.interval:g}, view {a.view}, on kvcached (baseline, 2 workers) "
            "under kvload"
        )
        print(f"  attach (5 BPF programs): {attach_s:5.1f} s wall, {attach_cpu:5.1f} s CPU")
        print(
            f"  steady state over {w1 - w0:.0f} s:  {c1 - c0:5.2f} s CPU = {share:.1%} of one core "
            "(target < 10 %)"
        )
        print(
            f"  target: {alone:,.0f} ops/s alone (the {a.seconds:.0f} s before), {watched:,.0f} ops/s "
            f"watched: {watched / alone:.3f}x (one pair, not interleaved: a rough figure)"
        )
        print(f"  q to exit: {quit_s:.2f} s")
        return 0
    finally:
        if screen is not None and screen.proc.poll() is None:
            screen.stop()
        load.stop()
        load.cleanup()
        server.stop()
        server.log_path.unlink(missing_ok=True)


if __name__ == "__main__":
    raise SystemExit(main())
