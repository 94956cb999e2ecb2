"""Debug files from a debuginfod server (kvprof.collect.debuginfod): a stripped
program whose only debug file Debian's `debuginfod` serves from a local folder is
named by name in `record`/`report`, the flame graph and `top`, whether the server
is named by DEBUGINFOD_URLS or by a `*.urls` file; with the server stopped the
recording still works and says so; an answer that is not the file asked for is
refused with one line; misses are remembered, limits hold.

Each test keeps kvprof's caches in a folder of its own (XDG_CACHE_HOME), so no
file fetched by an earlier test names anything."""

from __future__ import annotations

import asyncio
import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from support import TESTS, kvprof, start_ready, stop_contend, top_app

from kvprof.collect import debuginfod
from kvprof.collect.unwind import build_id
from kvprof.model.profile import INLINED
from kvprof.system.servers import free_port

pytest.importorskip("elftools", reason="pyelftools (python3-pyelftools) is missing: run scripts/provision.sh")

SOURCE = TESTS / "programs" / "inline_hot.c"
HOT = "hash_round"  # its hot function: no .dynsym entry, only the debug file names it
DECOY = "decoy_named_wrongly"  # its name in another build's debug file


@dataclass
class Served:
    binary: Path  # stripped: no .symtab, no .gnu_debuglink
    bid: str
    debug_dir: Path  # the folder the server scans: the binary's debug file alone
    decoy: Path  # the debug file of another build, whose hot function has another name


def _run(*cmd: str | Path) -> None:
    subprocess.run([str(c) for c in cmd], check=True, timeout=60, capture_output=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Served:
    """tests/programs/inline_hot.c built with -g, its debug file split off, then stripped."""
    d = tmp_path_factory.mktemp("debuginfod")
    full, decoy = d / "served_hot.full", d / "decoy.full"
    _run("cc", "-O1", "-g", "-o", full, SOURCE)
    _run("cc", "-O1", "-g", f"-D{HOT}={DECOY}", "-o", decoy, SOURCE)
    (d / "served").mkdir()
    _run("objcopy", "--only-keep-debug", full, d / "served" / "served_hot.debug")
    _run("objcopy", "--only-keep-debug", decoy, d / "decoy.debug")
    _run("objcopy", "--strip-all", full, d / "served_hot")
    bid = build_id(str(d / "served_hot"))
    assert bid and bid != build_id(str(d / "decoy.debug"))
    return Served(d / "served_hot", bid, d / "served", d / "decoy.debug")


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


class Debuginfod:
    """Debian's `debuginfod -F` serving one folder on a free port, stopped by PID.
    (Its 0.188 has no option to listen on 127.0.0.1 alone; it is asked there.)"""

    def __init__(self, folder: Path, bid: str, work: Path) -> None:
        exe = shutil.which("debuginfod")
        if exe is None:
            pytest.skip("Debian's debuginfod is not installed (scripts/provision.sh installs it)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "DEBUGINFOD_URLS"}  # no upstream servers
        self.log = (work / f"debuginfod-{self.port}.log").open("w")
        db = work / f"db-{self.port}.sqlite"
        argv = [exe, "-F", "-d", str(db), "-p", str(self.port), "-t", "0", "-g", "0", str(folder)]
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=work)
        deadline = time.monotonic() + 30  # until its scan of the folder found the file
        while _status(f"{self.url}/buildid/{bid}/debuginfo") != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(
                    f"debuginfod did not serve {bid}: {Path(self.log.name).read_text()[-2000:]}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def server(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Debuginfod]:
    srv = Debuginfod(served.debug_dir, served.bid, tmp_path_factory.mktemp("debuginfod-server"))
    yield srv
    srv.stop()


@pytest.fixture
def target(served: Served) -> Iterator[subprocess.Popen[bytes]]:
    """The stripped program running its hot loop until the test ends."""
    started: list[subprocess.Popen[bytes]] = []
    yield start_ready([served.binary, "120"], started)
    for proc in started:
        stop_contend(proc)


def _env(tmp_path: Path, **extra: str | None) -> dict[str, str]:
    """The tests' environment with kvprof's caches in `tmp_path`, `extra` set (None: unset)."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    for k, v in extra.items():
        env.pop(k, None) if v is None else env.__setitem__(k, v)
    return env


@dataclass
class Seen:
    record: str  # record's stderr
    report: str
    folded: str


def _record_and_read(pid: int, tmp_path: Path, env: dict[str, str]) -> Seen:
    out = tmp_path / "p.json.gz"
    rec = kvprof("record", "-p", str(pid), "-d", "2", "-o", str(out), timeout=180, env=env)
    assert rec.returncode == 0 and "Traceback" not in rec.stderr, rec.stderr
    report = kvprof("report", str(out), env=env)
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr
    folded = tmp_path / "cpu.folded"
    fg = kvprof("flamegraph", str(out), "--kind", "cpu", "-o", str(folded), env=env)
    assert fg.returncode == 0, fg.stderr
    return Seen(rec.stderr, report.stdout, folded.read_text())


def _hot_frames(folded: str) -> list[str]:
    """The leaf function of each folded stack (what was inlined into it aside), most samples first."""
    rows = [line.rsplit(" ", 1) for line in folded.splitlines() if line.strip()]
    rows.sort(key=lambda r: -int(r[1]))
    return [[f for f in r[0].split(";") if not f.endswith(INLINED)][-1] for r in rows]


def _assert_named(seen: Seen, url: str) -> None:
    assert f"from {url}" in seen.record, seen.record  # the progress line of the fetch
    assert re.search(rf"^\s+[\d.]+\s+[\d.]+\s+{HOT}$", seen.report, re.M), seen.report  # TOP FUNCTIONS
    assert f"hot function {HOT}" in seen.report, seen.report  # its finding
    assert _hot_frames(seen.folded)[0] == HOT, seen.folded[:2000]


# ---- named by the server -----------------------------------------------------------


@pytest.mark.bpf
def test_debuginfod_urls_names_the_stripped_function(
    served: Served, server: Debuginfod, target: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """DEBUGINFOD_URLS names the server: the report, the flame graph and the record's
    progress name the hot function, and the file is kept in the user's cache."""
    seen = _record_and_read(target.pid, tmp_path, _env(tmp_path, DEBUGINFOD_URLS=server.url))
    _assert_named(seen, server.url)
    assert (tmp_path / "cache" / "kvprof" / "debuginfod" / f"{served.bid}.debug").is_file()


@pytest.mark.bpf
def test_a_urls_file_names_the_server(
    served: Served, server: Debuginfod, target: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """No DEBUGINFOD_URLS (sudo drops it): the server named in a *.urls file of the
    folder kvprof reads (/etc/debuginfod, here another) names the function as well."""
    urls = tmp_path / "urls"
    urls.mkdir()
    (urls / "local.urls").write_text(f"{server.url}\n")
    (urls / "ignored.txt").write_text("http://127.0.0.1:1\n")  # only *.urls files count
    env = _env(tmp_path, DEBUGINFOD_URLS=None, KVPROF_DEBUGINFOD_DIR=str(urls))
    seen = _record_and_read(target.pid, tmp_path, env)
    _assert_named(seen, server.url)
    doctor = kvprof("doctor", env=env)
    assert f"info debuginfod: asks {server.url} (from {urls}/*.urls)" in " ".join(doctor.stdout.split())


@pytest.mark.bpf
def test_a_stopped_server_is_said_and_the_report_still_works(
    served: Served, target: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """The server stopped: record and report work, say the server did not answer, and
    name the hot code after the module (no name comes from anywhere)."""
    stopped = Debuginfod(served.debug_dir, served.bid, tmp_path)
    stopped.stop()
    start = time.monotonic()
    seen = _record_and_read(target.pid, tmp_path, _env(tmp_path, DEBUGINFOD_URLS=stopped.url))
    print(f"record, report and flame graph in {time.monotonic() - start:.1f} s")
    line = f"{stopped.url} did not answer (Connection refused)"
    assert f"{line}: no debug file for served_hot" in seen.record, seen.record
    assert f"WARNING: debuginfod: {line}: no debug file for served_hot" in " ".join(seen.report.split())
    assert HOT not in seen.report + seen.folded
    assert re.fullmatch(r"served_hot\+0x[0-9a-f]+", _hot_frames(seen.folded)[0]), seen.folded[:2000]


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the class's `body` (HTTP `code`), its length said unless
    `pace`, the seconds between pieces of 100 bytes; notes the paths asked."""

    body = b""
    code = 200
    pace = 0.0
    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.asked.append(self.path)
        if self.code != 200:
            self.send_error(self.code)
            return
        self.send_response(200)
        if not self.pace:
            self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        for at in range(0, len(self.body), 100 if self.pace else len(self.body) or 1):
            self.wfile.write(self.body[at : at + (100 if self.pace else len(self.body))])
            self.wfile.flush()
            time.sleep(self.pace)

    def log_message(self, *args: object) -> None:
        pass


Answering = Callable[..., tuple[str, list[str]]]


@pytest.fixture
def answering() -> Iterator[Answering]:
    """answering(body, code=200, pace=0.0): a server on 127.0.0.1 that answers every
    request with `body` (_Answers); its URL and the paths it was asked for. Stopped at teardown."""
    started: list[http.server.ThreadingHTTPServer] = []

    def start(body: bytes, code: int = 200, pace: float = 0.0) -> tuple[str, list[str]]:
        asked: list[str] = []
        handler = type("Answers", (_Answers,), {"body": body, "code": code, "pace": pace, "asked": asked})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}", asked

    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()


@pytest.mark.bpf
@pytest.mark.parametrize("answer", ["another build's debug file", "a truncated ELF file"])
def test_an_answer_of_another_build_id_is_refused(
    answer: str,
    served: Served,
    target: subprocess.Popen[bytes],
    answering: Answering,
    tmp_path: Path,
) -> None:
    """A server that answers with the debug file of another build (whose hot function
    has another name), or with a truncated ELF file: refused with one line, no name
    taken from it, no traceback."""
    decoy = served.decoy.read_bytes()
    url, _ = answering(decoy if answer.startswith("another") else decoy[:300])
    seen = _record_and_read(target.pid, tmp_path, _env(tmp_path, DEBUGINFOD_URLS=url))
    refused = [line for line in seen.record.splitlines() if "refused" in line]
    other = answer.startswith("another")
    why = (
        f"its build-id is {build_id(str(served.decoy))}, not {served.bid}"
        if other
        else "it is not a readable ELF"
    )
    assert len(refused) == 1, seen.record
    assert f"refused the debug file of served_hot from {url}: {why}" in refused[0], seen.record
    assert DECOY not in seen.report + seen.folded and HOT not in seen.report + seen.folded
    assert "WARNING: debuginfod: refused the debug file of served_hot" in seen.report
    assert not (tmp_path / "cache" / "kvprof" / "debuginfod" / f"{served.bid}.debug").exists()


# ---- top ------------------------------------------------------------------------------


@pytest.mark.bpf
def test_top_names_the_function_from_the_server(
    served: Served,
    server: Debuginfod,
    target: subprocess.Popen[bytes],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`kvprof top` live on the stripped program: its findings name the hot function
    the server's debug file names."""
    from textual.widgets import Static

    from kvprof.collect import debuginfo
    from kvprof.tui.sources import LiveSource
    from kvprof.tui.widgets import OverviewPanel

    monkeypatch.setenv("DEBUGINFOD_URLS", server.url)
    monkeypatch.setattr(debuginfod, "CACHE_DIR", tmp_path / "debuginfod")
    monkeypatch.setattr(debuginfo, "CACHE_DIR", tmp_path / "symbols")
    debuginfod.forget()
    source = LiveSource(target.pid)
    app = top_app(source)
    seen: list[str] = []

    async def go() -> None:
        async with app.run_test(size=(132, 40)) as pilot:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(c.startswith(HOT) for c in seen):
                seen[:] = [r.cost for r in app.query_one(OverviewPanel).rows.values()]
                await pilot.pause(0.2)
            status = str(app.query_one("#status", Static).render())
            assert any(c.startswith(f"{HOT} — on the stack") for c in seen), (seen, status)
            await pilot.press("q")

    try:
        asyncio.run(go())
        app.wait_closed()
        while source.attaching():  # BCC crashes when two threads compile at once (the next test's)
            time.sleep(0.1)
    finally:
        debuginfod.forget()
    assert (tmp_path / "debuginfod" / f"{served.bid}.debug").is_file()


# ---- the client alone: servers, misses, limits ------------------------------------------------


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """kvprof.collect.debuginfod in this process, with its cache in `tmp_path`; its cache folder."""
    monkeypatch.setattr(debuginfod, "CACHE_DIR", tmp_path / "debuginfod")
    debuginfod.forget()
    yield tmp_path / "debuginfod"
    debuginfod.forget()


def test_the_system_urls_files_count_where_the_login_script_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/etc/debuginfod/*.urls name servers only where /etc/profile.d/debuginfod.sh copies
    them into DEBUGINFOD_URLS at login (Debian installs it only when its question was
    answered yes); DEBUGINFOD_URLS, even empty, decides alone; only http(s) URLs count."""
    folder, script = tmp_path / "etc-debuginfod", tmp_path / "debuginfod.sh"
    folder.mkdir()
    (folder / "elfutils.urls").write_text("https://debuginfod.example.org/ file:///etc\n")
    monkeypatch.setattr(debuginfod, "URLS_DIR", str(folder))
    monkeypatch.setattr(debuginfod, "PROFILE_SCRIPT", str(script))
    monkeypatch.delenv("DEBUGINFOD_URLS")
    urls, why = debuginfod.servers()
    assert urls == [] and f"but no {script} puts them in DEBUGINFOD_URLS" in why, why
    script.write_text("")
    assert debuginfod.servers() == (["https://debuginfod.example.org"], f"{folder}/*.urls")
    monkeypatch.setenv("DEBUGINFOD_URLS", "")
    assert debuginfod.servers()[0] == []
    monkeypatch.setenv("DEBUGINFOD_URLS", "http://a:1 http://b:2/")
    assert debuginfod.servers() == (["http://a:1", "http://b:2"], "DEBUGINFOD_URLS")


def test_a_miss_is_remembered(
    served: Served, client: Path, answering: Answering, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build-id the server does not have is asked for once: a later kvprof (the
    process's state forgotten) does not ask again within MISS_S, and says so."""
    url, asked = answering(b"", 404)
    monkeypatch.setenv("DEBUGINFOD_URLS", url)
    assert debuginfod.debug_file(served.bid, "served_hot") is None
    debuginfod.forget()
    assert debuginfod.debug_file(served.bid, "served_hot") is None
    _, notes = debuginfod.said()
    assert asked == [f"/buildid/{served.bid}/debuginfo"]
    assert len(notes) == 1 and f"{url} has none" in notes[0] and "not asked again until" in notes[0], notes


def test_limits_of_size_and_time(
    served: Served, client: Path, answering: Answering, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer larger than MAX_BYTES is refused, whether its length is said or not; a
    server that accepts the connection and never answers is given up after REQUEST_S, one
    that sends slowly at the fetches' deadline (TOTAL_S): both said as not answering."""
    debug = (served.debug_dir / "served_hot.debug").read_bytes()
    monkeypatch.setattr(debuginfod, "MAX_BYTES", 1000)
    for pace in (0.0, 0.001):  # Content-Length says it, or the bytes read do
        debuginfod.forget()
        url, _ = answering(debug, pace=pace)
        monkeypatch.setenv("DEBUGINFOD_URLS", url)
        assert debuginfod.debug_file(served.bid, "served_hot") is None
        warnings, _ = debuginfod.said()
        assert len(warnings) == 1 and "more than the 1.0 kB kvprof takes" in warnings[0], warnings
    monkeypatch.setattr(debuginfod, "MAX_BYTES", 1 << 20)

    debuginfod.forget()
    monkeypatch.setattr(debuginfod, "REQUEST_S", 0.5)
    with socket.socket() as mute:  # listens, never accepts nor answers
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        monkeypatch.setenv("DEBUGINFOD_URLS", f"http://127.0.0.1:{mute.getsockname()[1]}")
        start = time.monotonic()
        assert debuginfod.debug_file("ab" * 20, "mute") is None
        took = time.monotonic() - start
    warnings, _ = debuginfod.said()
    assert took < 5 and len(warnings) == 1 and "did not answer (timed out)" in warnings[0], (took, warnings)

    debuginfod.forget()
    monkeypatch.setattr(debuginfod, "TOTAL_S", 1.0)
    url, _ = answering(debug, pace=0.2)  # 100 bytes every 0.2 s: each read in time, the whole never
    monkeypatch.setenv("DEBUGINFOD_URLS", url)
    start = time.monotonic()
    assert debuginfod.debug_file(served.bid, "served_hot") is None
    took = time.monotonic() - start
    warnings, _ = debuginfod.said()
    assert took < 3 and len(warnings) == 1 and "did not answer (not sent within 1 s)" in warnings[0], (
        took,
        warnings,
    )
    assert not list(client.glob("*.tmp")) and not (client / f"{served.bid}.debug").exists()
