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

Only fixtures and pytest hooks live here; the helpers behind them, and
everything a test module imports, are in tests/support.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import (
    CONTEND_SOURCE,
    REPO,
    Unprivileged,
    Wire,
    assert_clean_exit,
    bpf_unavailable,
    memcached_args,
    sanitized,
    start_ready,
    stop_contend,
    vmrss_mb,
)

from kvprof.collect.pyspy import binary as pyspy_binary
from kvprof.system.servers import Server, kvcached_binary, start_kvcached, start_memcached

# No test asks a debuginfod server but those of tests/test_debuginfod.py, which name
# their own: a machine whose /etc/debuginfod/*.urls names Debian's would otherwise fetch
# debug files for every stripped program recorded, and names would depend on the network.
os.environ["DEBUGINFOD_URLS"] = ""

AGAINST = os.environ.get("KVPROF_TEST_AGAINST", "kvcached")
if AGAINST not in ("kvcached", "memcached"):
    raise pytest.UsageError(f"KVPROF_TEST_AGAINST={AGAINST!r}: use kvcached (default) or memcached")


def pytest_configure(config: pytest.Config) -> None:
    # Tests stop the commands they start with SIGINT, as Ctrl-C does. A suite started
    # in the background by a shell without job control (`make test &`, nohup) inherits
    # SIGINT ignored, and an ignored signal stays ignored across exec: every child would
    # then ignore it too. A handler is not inherited: children start with the default.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config.addinivalue_line(
        "markers",
        "kvcached_only(reason): pins a kvcached detail memcached does differently; "
        "skipped when KVPROF_TEST_AGAINST=memcached",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = bpf_unavailable()
    for item in items:
        if reason is not None and "bpf" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))
        only = item.get_closest_marker("kvcached_only")
        if only is not None and AGAINST != "kvcached":
            why = only.args[0] if only.args else only.kwargs.get("reason", "")
            item.add_marker(pytest.mark.skip(reason=f"kvcached only: {why}"))


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
            assert_clean_exit(server)
        except AssertionError as e:
            errors.append(str(e))
        finally:
            server.log_path.unlink(missing_ok=True)
    assert not errors, "\n".join(errors)


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


_WIRES = pytest.StashKey[list[Wire]]()


@pytest.fixture
def wire(request: pytest.FixtureRequest) -> Iterator[Callable[..., Wire]]:
    """Open raw connections: `wire(server)`; closed at teardown, transcripts kept for failures."""
    opened: list[Wire] = []
    request.node.stash[_WIRES] = opened

    def connect(server: Server, timeout: float = 5.0) -> Wire:
        w = Wire(server, timeout)
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


@pytest.fixture
def assert_rss_bounded() -> Callable[[Server, float], None]:
    """Check `server`'s VmRSS stays under its item limit plus 40 MB of overhead."""

    def check(server: Server, limit_mb: float) -> None:
        # ASan keeps freed memory in a quarantine (256 MB by default) and
        # shadow pages on top: there the bound only catches runaway growth.
        slack = 40 + (512 if sanitized(server.pid) else 0)
        rss = vmrss_mb(server.pid)
        assert rss <= limit_mb + slack, f"{server.name} VmRSS {rss:.1f} MB > {limit_mb} + {slack} MB"

    return check


# ---- a known C workload without kvs probes (tests/programs/contend.c) ----------


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
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """A list for the test programs a test starts (support.start_ready): each one is
    stopped at teardown, by closing its stdin (support.stop_contend)."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        stop_contend(proc)


@pytest.fixture
def contend(
    contend_binary: Path, started: list[subprocess.Popen[bytes]]
) -> Callable[[], subprocess.Popen[bytes]]:
    """Start the contend program (runs until its stdin closes); every one is stopped at teardown."""

    def start() -> subprocess.Popen[bytes]:
        return start_ready([contend_binary, "60"], started)

    return start


# ---- running as an unprivileged user (65534) ---------------------------------


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
