"""Shared fixtures: real servers on free loopback ports, stopped by PID.

`KVCACHED_BIN` selects the binary (the ASan+UBSan build in `make test`); with a
sanitizer build every server is checked at teardown for a clean exit and no
sanitizer report.

`KVPROF_TEST_AGAINST=memcached` makes `kvcached`/`kvcached_factory` start
Debian's memcached instead, translating the flags both have (-t, -m, -c, -I,
-v), so the protocol suites prove they test the protocol and not kvcached's
quirks; tests marked `kvcached_only(reason)` are skipped then, as is any test
that passes a flag only kvcached has.

`wire` opens raw text-protocol connections (every read has a deadline) whose
transcripts are attached to the report of a failing test.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from kvprof.collect.pyspy import binary as pyspy_binary
from kvprof.model.profile import Profile
from kvprof.system.servers import Server, die_with_parent, kvcached_binary, start_kvcached, start_memcached

SANITIZER_REPORT = re.compile(r"ERROR: (Address|Leak)Sanitizer|runtime error:|SUMMARY: \w+Sanitizer")

AGAINST = os.environ.get("KVPROF_TEST_AGAINST", "kvcached")
if AGAINST not in ("kvcached", "memcached"):
    raise pytest.UsageError(f"KVPROF_TEST_AGAINST={AGAINST!r}: use kvcached (default) or memcached")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kvcached_only(reason): pins a kvcached detail memcached does differently; "
        "skipped when KVPROF_TEST_AGAINST=memcached",
    )


def bpf_unavailable() -> str | None:
    """Why BPF tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root to load BPF programs (run `make test` as root or with sudo)"
    try:
        import bcc  # noqa: F401  (distribution package python3-bpfcc)
    except ImportError as e:
        return f"BCC is not importable ({e}): run scripts/provision.sh"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = bpf_unavailable()
    for item in items:
        if reason is not None and "bpf" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))
        only = item.get_closest_marker("kvcached_only")
        if only is not None and AGAINST != "kvcached":
            why = only.args[0] if only.args else only.kwargs.get("reason", "")
            item.add_marker(pytest.mark.skip(reason=f"kvcached only: {why}"))


def _check_clean_exit(server: Server) -> None:
    status = server.stop()
    log = server.log()
    report = SANITIZER_REPORT.search(log)
    assert report is None, f"sanitizer report from {server.argv}:\n{log[-4000:]}"
    assert status == 0, f"{server.argv} exited with {status}:\n{log[-2000:]}"


@pytest.fixture
def kvcached_factory() -> Iterator[Callable[..., Server]]:
    """Start kvcached with extra args; every server is stopped (and checked) at teardown."""
    started: list[Server] = []

    def start(*args: str) -> Server:
        if AGAINST == "memcached":
            server = start_memcached(memcached_args(args))
        else:
            server = start_kvcached(list(args))
        started.append(server)
        return server

    yield start
    errors = []
    for server in started:
        try:
            _check_clean_exit(server)
        except AssertionError as e:
            errors.append(str(e))
        finally:
            server.log_path.unlink(missing_ok=True)
    assert not errors, "\n".join(errors)


def _kilobytes(size: str) -> int:
    """A size as -I takes it (`65536`, `64k`, `1m`) in KB."""
    scale = {"k": 1024, "m": 1024 * 1024}.get(size[-1].lower())
    return (int(size[:-1]) * scale if scale else int(size)) // 1024


def memcached_args(args: tuple[str, ...] | list[str]) -> list[str]:
    """kvcached flags as memcached's; skips the calling test on a kvcached-only flag."""
    out: list[str] = []
    threads, conns = 4, None
    it = iter(args)
    for flag in it:
        if flag in ("-t", "-m", "-I"):
            value = next(it)
            out += [flag, value]
            if flag == "-t":
                threads = int(value)
            if flag == "-I":
                # memcached refuses an -I below its 512 KB slab chunk limit
                # unless that limit (in KB) comes down with it. 1.6.18
                # segfaults storing small items when the limit is below -I,
                # or when -I is below 128k (seen with 64k and 96k).
                kb = _kilobytes(value)
                if kb < 128:
                    pytest.skip(f"memcached 1.6.18 crashes with -I {value}: use -I 128k or more")
                if kb < 1024:
                    out += ["-o", f"slab_chunk_max={kb}"]
        elif flag == "-c":
            conns = int(next(it))
        elif re.fullmatch(r"-v+", flag):
            out.append(flag)
        else:
            pytest.skip(f"{flag} has no memcached equivalent (KVPROF_TEST_AGAINST=memcached)")
    if conns is not None:
        # memcached 1.6 counts its own descriptors (stdio, listener, 4 per
        # worker) against -c and sets RLIMIT_NOFILE from it; measured on
        # 1.6.18, `-t T -c C` serves C - 8 - 4T clients. Add them back so
        # `-c N` means N clients on both servers.
        out += ["-c", str(conns + 8 + 4 * threads)]
    return out


@pytest.fixture
def kvcached(kvcached_factory: Callable[..., Server]) -> Server:
    """One kvcached, 2 workers, default settings."""
    return kvcached_factory("-t", "2")


@pytest.fixture
def memcached_factory() -> Iterator[Callable[..., Server]]:
    """Debian's memcached as a reference peer, stopped at teardown."""
    started: list[Server] = []

    def start(*args: str) -> Server:
        server = start_memcached(list(args))
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
        server.log_path.unlink(missing_ok=True)


class Value(NamedTuple):
    """One VALUE block of a retrieval reply."""

    key: bytes
    flags: int
    data: bytes
    cas: int | None


class Wire:
    """One raw text-protocol connection; every read is bounded by a deadline.

    Everything sent and received is kept as a transcript (`>>>` / `<<<`),
    attached to the report when the test fails.
    """

    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
        self.timeout = timeout
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        self.log: list[tuple[str, bytes]] = []

    def send(self, data: bytes) -> None:
        self.log.append((">>>", data))
        self.sock.sendall(data)

    def send_until_closed(self, data: bytes, chunk: int = 16384) -> bool:
        """Send `data` in chunks; False when the server closed or reset the connection first."""
        self.log.append((">>>", data))
        try:
            for i in range(0, len(data), chunk):
                self.sock.sendall(data[i : i + chunk])
        except (BrokenPipeError, ConnectionResetError):
            self.log.append(("---", b"send failed: closed by server"))
            return False
        return True

    def _recv(self, deadline: float) -> bytes:
        """One recv before the deadline: b"" on EOF, TimeoutError after it."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no reply within {self.timeout} s; unread {self.buf[:200]!r}")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(1 << 20)
        except TimeoutError:
            raise TimeoutError(f"no reply within {self.timeout} s; unread {self.buf[:200]!r}") from None
        self.log.append(("<<<", chunk) if chunk else ("---", b"EOF"))
        return chunk

    def read_until(self, terminator: bytes, timeout: float | None = None) -> bytes:
        """Everything up to and including `terminator` (the rest stays buffered)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while (i := self.buf.find(terminator)) < 0:
            chunk = self._recv(deadline)
            if not chunk:
                raise ConnectionError(f"closed before {terminator!r}; unread {self.buf[:200]!r}")
            self.buf += chunk
        end = i + len(terminator)
        out, self.buf = self.buf[:end], self.buf[end:]
        return out

    def read_exactly(self, n: int, timeout: float | None = None) -> bytes:
        deadline = time.monotonic() + (timeout or self.timeout)
        while len(self.buf) < n:
            chunk = self._recv(deadline)
            if not chunk:
                raise ConnectionError(f"closed after {len(self.buf)} of {n} bytes")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def line(self, timeout: float | None = None) -> bytes:
        return self.read_until(b"\r\n", timeout)

    def call(self, data: bytes, terminator: bytes = b"\r\n") -> bytes:
        """Send `data`, return the reply up to `terminator`."""
        self.send(data)
        return self.read_until(terminator)

    def values(self, command: bytes) -> list[Value]:
        """Send a retrieval command; parse its VALUE blocks by length up to END."""
        self.send(command)
        found = []
        while (line := self.line()) != b"END\r\n":
            parts = line.split()
            if not parts or parts[0] != b"VALUE" or len(parts) not in (4, 5):
                raise AssertionError(f"expected VALUE or END, got {line!r}")
            data = self.read_exactly(int(parts[3]) + 2)
            if not data.endswith(b"\r\n"):
                raise AssertionError(f"value of {parts[1]!r} not followed by CRLF: {data[-10:]!r}")
            cas = int(parts[4]) if len(parts) == 5 else None
            found.append(Value(parts[1], int(parts[2]), data[:-2], cas))
        return found

    def get(self, key: bytes) -> bytes | None:
        """The value stored under `key`, or None."""
        found = self.values(b"get " + key + b"\r\n")
        assert len(found) <= 1 and all(v.key == key for v in found), found
        return found[0].data if found else None

    def pending(self, wait: float = 0.2) -> bytes:
        """Whatever arrives within `wait` seconds (b"" when the server stays silent)."""
        deadline = time.monotonic() + wait
        try:
            while chunk := self._recv(deadline):
                self.buf += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        out, self.buf = self.buf, b""
        return out

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True when the server closes (or resets) the connection within `timeout`."""
        deadline = time.monotonic() + timeout
        try:
            while chunk := self._recv(deadline):
                self.buf += chunk
        except TimeoutError:
            return False
        except ConnectionResetError:
            self.log.append(("---", b"RST"))
        return True

    def drain(self, timeout: float = 5.0) -> bytes:
        """Half-close (the server sees EOF) and return all it sends until it closes."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # already reset by the server
        self.log.append(("---", b"SHUT_WR"))
        if not self.closed_by_peer(timeout):
            raise TimeoutError(f"connection still open {timeout} s after EOF; got {self.buf[:200]!r}")
        out, self.buf = self.buf, b""
        return out

    def close(self) -> None:
        self.sock.close()

    def transcript(self, limit: int = 200) -> str:
        lines = []
        for direction, data in self.log[-limit:]:
            shown = data if len(data) <= 300 else data[:300] + b"...(%d bytes)" % len(data)
            lines.append(f"{direction} {shown!r}")
        return "\n".join(lines)


_WIRES = pytest.StashKey[list[Wire]]()


@pytest.fixture
def wire(request: pytest.FixtureRequest) -> Iterator[Callable[..., Wire]]:
    """Open raw connections: `wire(server)`; closed at teardown, transcripts kept for failures."""
    opened: list[Wire] = []
    request.node.stash[_WIRES] = opened

    def connect(server: Server, timeout: float = 5.0) -> Wire:
        w = Wire(server.host, server.port, timeout)
        opened.append(w)
        return w

    yield connect
    for w in opened:
        w.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    wires = item.stash.get(_WIRES, [])
    if report.failed and report.when == "call" and wires:
        for n, w in enumerate(wires):
            if w.log:
                report.sections.append((f"wire {n} transcript", w.transcript()))


def vmrss_mb(pid: int) -> float:
    """Resident set size of a process, from /proc/PID/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _sanitized(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return any("libasan" in line for line in f)


@pytest.fixture
def assert_rss_bounded() -> Callable[[Server, float], None]:
    """Check `server`'s VmRSS stays under its item limit plus 40 MB of overhead."""

    def check(server: Server, limit_mb: float) -> None:
        # ASan keeps freed memory in a quarantine (256 MB by default) and
        # shadow pages on top: there the bound only catches runaway growth.
        slack = 40 + (512 if _sanitized(server.pid) else 0)
        rss = vmrss_mb(server.pid)
        assert rss <= limit_mb + slack, f"{server.name} VmRSS {rss:.1f} MB > {limit_mb} + {slack} MB"

    return check


# ---- a known C workload without kvs probes (tests/programs/contend.c) ----------

CONTEND_SOURCE = Path(__file__).parent / "programs" / "contend.c"


@pytest.fixture(scope="session")
def contend_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/programs/contend.c built with frame pointers into a tmp dir."""
    out = tmp_path_factory.mktemp("programs") / "contend"
    subprocess.run(
        ["cc", "-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", str(out), str(CONTEND_SOURCE)],
        check=True,
        timeout=60,
    )
    return out


@pytest.fixture
def contend(contend_binary: Path) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start the contend program (runs until its stdin closes); every one is stopped at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [str(contend_binary), "60"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            preexec_fn=die_with_parent,
        )
        started.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        return proc

    yield start
    for proc in started:
        stop_contend(proc)


def stop_contend(proc: subprocess.Popen[bytes]) -> None:
    """Close its stdin (it exits on EOF); kill it if it does not."""
    if proc.stdin is not None and not proc.stdin.closed:
        proc.stdin.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def pin_workers(server: Server) -> None:
    """kv-worker-N on CPU N (mod the CPUs there are): a per-thread line then stays on its
    CPU, so what the fixed design still shows is not the scheduler moving threads around."""
    cpus = sorted(os.sched_getaffinity(0))
    for tid in os.listdir(f"/proc/{server.pid}/task"):
        name = Path(f"/proc/{server.pid}/task/{tid}/comm").read_text().strip()
        if name.startswith("kv-worker-"):
            os.sched_setaffinity(int(tid), {cpus[int(name.rsplit("-", 1)[1]) % len(cpus)]})


# BPF's own frames and the tracing glue that runs a program (`_einittext` is
# what a program's address resolves to from a stale /proc/kallsyms read).
BPF_FRAME = re.compile(
    r"(bpf_prog_|bpf_trace_run|__bpf_trace_|bpf_overflow_handler|__traceiter_|trace_call_bpf|perf_trace_"
    r"|trace_event_raw_event_|__uprobe_perf_func|uprobe_perf_func|perf_syscall_(enter|exit)|_einittext)"
)


def bpf_frames(profile: Profile) -> dict[str, list[list[str]]]:
    """The stacks of each kind (oncpu, offcpu, futex, locks) with a BPF frame in them."""
    kinds = {
        "oncpu": [s.frames for s in profile.oncpu],
        "offcpu": [s.frames for s in profile.offcpu.stacks],
        "futex": [w.frames for w in profile.offcpu.futex],
        "locks": [s.frames for lk in profile.locks for s in lk.stacks],
    }
    found = {k: [f for f in stacks if any(BPF_FRAME.match(x) for x in f)] for k, stacks in kinds.items()}
    return {k: v for k, v in found.items() if v}


# ---- running as an unprivileged user (65534) ---------------------------------

REPO = Path(__file__).resolve().parent.parent
NOBODY = 65534


class Unprivileged(NamedTuple):
    """kvprof, kvcached and py-spy copied where user 65534 can read them: the
    tree under test may sit in a folder only its owner can enter (a 0700
    `mktemp -d`, root's home). Its commands run from /, with nothing but this."""

    root: Path
    python: str  # the interpreter behind the venv's, outside the tree
    kvcached: str
    env: dict[str, str]

    def kvprof(self, *args: str) -> list[str]:
        return [self.python, "-m", "kvprof.cli", *args]

    def run(self, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
            env=self.env,
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
        )


@pytest.fixture(scope="session")
def unprivileged() -> Iterator[Unprivileged]:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a command as another user")
    root = Path(tempfile.mkdtemp(prefix="kvprof-nobody-"))  # pytest's own tmp dirs are 0700
    try:
        shutil.copytree(
            REPO / "kvprof", root / "lib" / "kvprof", ignore=shutil.ignore_patterns("__pycache__")
        )
        (root / "bin").mkdir()
        for exe in (kvcached_binary(), Path(pyspy_binary())):
            shutil.copy2(exe, root / "bin" / exe.name)
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        env = {
            "PATH": f"{root / 'bin'}:/usr/bin:/bin",
            "PYTHONPATH": str(root / "lib"),
            "PYTHONDONTWRITEBYTECODE": "1",
            "LANG": "C.UTF-8",
        }
        yield Unprivileged(root, python, str(root / "bin" / "kvcached"), env)
    finally:
        shutil.rmtree(root, ignore_errors=True)
