"""Start, stop and query cache servers: kvcached, and memcached as a peer.

Used by the demo, the benchmark harness and the tests. Servers always listen
on loopback; kvcached picks its own free port (`-p 0`) and says which, so
there is no race between choosing a port and binding it. Every server started
here is stopped by its PID.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvprof.collect.server_stats import (
    TargetError as TargetError,  # raised here too: one error type for servers
)
from kvprof.collect.server_stats import stats
from kvprof.system.attach import as_before_yield
from kvprof.system.lab import lab_binary

_LISTENING = re.compile(r"listening on (\S+):(\d+)")


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child: get SIGTERM if the thread that started us dies, so a killed demo
    or test run never leaves a server behind. Own session: a Ctrl-C meant
    for the caller is the caller's to handle, and it stops us by PID."""
    os.setsid()
    as_before_yield()  # not kvprof's idle time once it attached (system.attach.yield_cpu)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def kvcached_binary() -> Path:
    """The kvcached to run (lab_binary)."""
    return lab_binary("kvcached")


def kvload_binary() -> Path:
    """The load generator (lab_binary)."""
    return lab_binary("kvload")


@dataclass
class Process:
    """A child process (a server, a load generator), its output kept in a file."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        """Everything the process wrote to its log so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait, SIGKILL if it did not exit; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@dataclass
class Server(Process):
    """A running server process on host:port, its stderr kept in a file."""

    host: str
    port: int
    name: str
    argv: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stats(self, group: str | None = None, timeout: float = 5.0) -> dict[str, str]:
        return stats(self.host, self.port, group, timeout)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_for_port(host: str, port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TargetError(f"server exited with status {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TargetError(f"server did not listen on {host}:{port} within {timeout:.0f} s")


def start_kvcached(
    args: list[str] | tuple[str, ...] = (),
    binary: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 10.0,
    wrapper: Sequence[str] = (),
) -> Server:
    """Start kvcached on a free loopback port with extra `args`, run by `wrapper`
    (e.g. valgrind and its options) when given; wait until it serves."""
    exe = binary or kvcached_binary()
    fd, log_name = tempfile.mkstemp(prefix="kvcached-", suffix=".log")
    argv = [*wrapper, str(exe), "-l", "127.0.0.1", "-p", "0", *args]
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, preexec_fn=die_with_parent
        )
    server = Server(proc, Path(log_name), "127.0.0.1", 0, "kvcached", argv)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _LISTENING.search(server.log())
        if found:
            server.host, server.port = found.group(1), int(found.group(2))
            _wait_for_port(server.host, server.port, proc, deadline - time.monotonic())
            return server
        if proc.poll() is not None:
            raise TargetError(f"kvcached exited with status {proc.returncode}: {server.log().strip()}")
        time.sleep(0.01)
    server.stop()
    raise TargetError(f"kvcached did not report its port within {timeout:.0f} s")


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for servers that cannot pick their own)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _start_peer(name: str, argv_for: Callable[[str, int], list[str]], timeout: float) -> Server:
    """Start a Debian server that takes its port as a flag on a free loopback port."""
    exe = shutil.which(name)
    if exe is None:
        raise TargetError(f"{name} not found: apt-get install {name}")
    for _ in range(5):
        port = free_port()
        fd, log_name = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
        argv = argv_for(exe, port)
        with os.fdopen(fd, "wb") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=die_with_parent
            )
        server = Server(proc, Path(log_name), "127.0.0.1", port, name, argv)
        try:
            _wait_for_port("127.0.0.1", port, proc, timeout)
            return server
        except TargetError:
            server.stop()  # most likely lost the port to someone else: try another
    raise TargetError(f"{name} could not be started on a free port")


def start_memcached(args: list[str] | tuple[str, ...] = (), timeout: float = 10.0) -> Server:
    """Start Debian's memcached on a free loopback port (a real peer to compare with)."""
    return _start_peer(
        "memcached",
        lambda exe, port: [exe, "-u", "root", "-l", "127.0.0.1", "-p", str(port), "-U", "0", *args],
        timeout,
    )


def start_redis(args: list[str] | tuple[str, ...] = (), timeout: float = 10.0) -> Server:
    """Start Debian's redis-server on a free loopback port, persisting nothing."""
    return _start_peer(
        "redis-server",
        lambda exe, port: [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            *args,
        ],
        timeout,
    )
