"""py-spy as the on-CPU source for CPython targets, next to the BPF off-CPU collector.

The end-to-end test runs tests/programs/pyclient.py (pymemcache against a
real kvcached, one hot function with a distinctive name) and records it with
`kvprof record` as a user would.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import Unprivileged, record

from kvprof.collect import OFFCPU_HZ, CollectOptions
from kvprof.collect.pyspy import READ_TRIES, DumpSampler, PySpyCollector, explain, python_version
from kvprof.collect.pyspy import binary as pyspy_binary
from kvprof.collect.pyspy_output import first_line, parse_raw
from kvprof.collect.thread_sockets import SocketTally
from kvprof.model.profile import Profile, Target
from kvprof.model.topology import Topology
from kvprof.system.servers import Server, die_with_parent

PYCLIENT = Path(__file__).parent / "programs" / "pyclient.py"
HOT = "hammer_kvcached_with_gets"


def hot_lines() -> range:
    """The source lines of the hot function in pyclient.py."""
    tree = ast.parse(PYCLIENT.read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == HOT)
    return range(fn.lineno, (fn.end_lineno or fn.lineno) + 1)


BUSY = "import time\nend = time.time() + 60\nwhile time.time() < end: sum(range(99))"


@pytest.fixture
def busy_python() -> Iterator[subprocess.Popen[bytes]]:
    """A CPython process spinning in <module>; stopped at teardown."""
    proc = subprocess.Popen([sys.executable, "-c", BUSY], preexec_fn=die_with_parent)
    time.sleep(0.3)
    yield proc
    proc.kill()
    proc.wait()


def flaky_pyspy(bin_dir: Path, fails: int) -> dict[str, str]:
    """A `py-spy` first on PATH whose first `fails` dumps and records fail as a
    --nonblocking read that caught the interpreter mid-change does (py-spy's
    own message), and run the real py-spy after that. Each call is logged in
    bin_dir/calls. Returns the environment that puts it first."""
    bin_dir.mkdir()
    wrapper = bin_dir / "py-spy"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'echo "$1" >> "{bin_dir}/calls"\n'
        'case "$1" in dump|record)\n'
        f'  n=$(grep -c "^$1$" "{bin_dir}/calls")\n'
        f'  if [ "$n" -le {fails} ]; then echo "Error: Failed to get stack traces" >&2; exit 1; fi;;\n'
        "esac\n"
        f'exec "{pyspy_binary()}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_transient_pyspy_failures_are_retried_and_counted(
    busy_python: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """py-spy fails its first dump (the start check) and its first record: the
    recording still succeeds, and says it tried twice again."""
    env = flaky_pyspy(tmp_path / "bin", fails=1)
    out = tmp_path / "py.json"
    r = record(busy_python.pid, out, "-d", "1", "--python", "--collectors", "oncpu", env=env, timeout=180)
    assert r.returncode == 0, r.stderr
    calls = (tmp_path / "bin" / "calls").read_text().split()
    assert calls.count("dump") == 2 and calls.count("record") == 2, calls
    p = Profile.load(out)
    assert p.status.collectors["oncpu"].startswith("ok (py-spy"), p.status.collectors
    assert p.status.counters["pyspy.retries"] == 2
    assert sum(s.count for s in p.oncpu) > 0


def test_pyspy_that_never_reads_is_refused(busy_python: subprocess.Popen[bytes], tmp_path: Path) -> None:
    """A target py-spy fails to read every time: refused after READ_TRIES tries, one line."""
    env = flaky_pyspy(tmp_path / "bin", fails=100)
    r = record(
        busy_python.pid,
        tmp_path / "x.json",
        "-d",
        "1",
        "--python",
        "--collectors",
        "oncpu",
        env=env,
        timeout=180,
    )
    assert r.returncode == 2, r.stderr
    comm = Path(f"/proc/{busy_python.pid}/comm").read_text().strip()  # python or python3: how pytest ran
    assert (
        r.stderr.strip()
        == f"kvprof record: py-spy failed on PID {busy_python.pid} ({comm}): Failed to get stack traces"
    )
    calls = (tmp_path / "bin" / "calls").read_text().split()
    assert calls.count("dump") == READ_TRIES and "record" not in calls, calls


def test_dump_sampler_retries_a_transient_failure(
    busy_python: subprocess.Popen[bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live view's first dump fails once: it starts anyway and counts the retry."""
    monkeypatch.setenv("PATH", flaky_pyspy(tmp_path / "bin", fails=1)["PATH"])
    sampler = DumpSampler(busy_python.pid, interval=0.1)
    sampler.start()
    time.sleep(0.5)
    sampler.close()
    p = Profile(target=Target(pid=busy_python.pid))
    sampler.contribute(p)
    assert p.status.counters["pyspy.retries"] == 1
    assert p.status.counters["pyspy.samples"] > 0


@pytest.fixture
def pyclient() -> Iterator[Callable[[Server, float], subprocess.Popen[str]]]:
    """Start pyclient.py against a server; every one is stopped (by PID) at teardown."""
    started: list[subprocess.Popen[str]] = []

    def start(server: Server, seconds: float) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, str(PYCLIENT), server.address, str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent,
        )
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
        proc.communicate(timeout=30)


@pytest.fixture
def idle_python() -> Iterator[subprocess.Popen[bytes]]:
    """A CPython process owned by the test's user that sleeps; stopped at teardown."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=die_with_parent
    )
    yield proc
    proc.terminate()
    proc.wait(30)


def test_parse_raw_keeps_threads_and_frames() -> None:
    """py-spy's raw `--threads` lines become per-thread stacks, root first, with thread names."""
    text = (
        "thread (4242): client-0;worker (pyclient.py:48);hammer (pyclient.py:38) 7\n"
        "thread (4242): client-0;worker (pyclient.py:48);hammer (pyclient.py:38) 2\n"
        "thread (0x7F00AA);<module> (x.py:1) 1\n"
        "garbage\n"
    )
    got = parse_raw(text)
    assert got.names == {4242: "client-0"}
    stacks = {(s.tid, tuple(s.frames)): s.count for s in got.stacks}
    assert stacks == {
        (4242, ("worker (pyclient.py:48)", "hammer (pyclient.py:38)")): 9,
        (0x7F00AA, ("<module> (x.py:1)",)): 1,
    }


def test_errors_become_one_line_with_the_fix() -> None:
    """Each py-spy failure reads as one line that says what to do."""
    pid = os.getpid()
    cases = {
        "Permission Denied: Try running again with elevated permissions": "run kvprof as root",
        "Error: Failed to find python version from target process\n\nStack backtrace:\n": "drop --python",
        "Error: Failed to get process executable name. Check that the process is running.": "no process",
        "Error: Unsupported version of Python: 3.99.0": "pip install -U py-spy",
    }
    for output, fix in cases.items():
        line = explain(output, pid)
        assert fix in line and "\n" not in line, (output, line)
    native = explain("Error: Failed to unwind native stack", pid, native=True)
    assert "drop --native" in native


def test_detects_cpython_by_executable() -> None:
    """This interpreter is CPython; a shell's sleep is not."""
    assert python_version(os.getpid()) is not None
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert python_version(sleeper.pid) is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_socket_split_follows_where_the_thread_was_seen() -> None:
    """A thread seen 3 times on socket 0 and once on 1 gets its samples split 3:1."""
    tally = SocketTally(os.getpid(), Topology())
    tally.seen[7] = Counter({0: 3, 1: 1})
    assert tally.split(7, 100) == {"0": 75, "1": 25}
    assert tally.split(7, 3) == {"0": 2, "1": 1}
    assert tally.split(8, 10) == {}


def test_first_line_is_the_functions() -> None:
    """A line inside a function maps to its first line (as `py-spy record --function`); module code to 1."""
    lines = hot_lines()
    assert first_line(str(PYCLIENT), lines[-1]) == lines[0]
    assert first_line(str(PYCLIENT), 3) == 1
    assert first_line("/nonexistent.py", 42) == 42


def test_dump_sampler_counts_a_busy_thread() -> None:
    """The live source (`py-spy dump` in a loop) counts the busy thread's stack, per thread, as py-spy's."""
    spin = subprocess.Popen([sys.executable, "-c", BUSY], preexec_fn=die_with_parent)
    try:
        time.sleep(0.3)
        assert PySpyCollector(spin.pid, CollectOptions(live=True)).applies() is None
        sampler = DumpSampler(spin.pid, interval=0.1)
        sampler.start()
        time.sleep(1.5)
        sampler.close()
    finally:
        spin.kill()
        spin.wait()
    p = Profile(target=Target(pid=spin.pid))
    sampler.contribute(p)
    assert p.status.collectors["oncpu"].startswith("ok (py-spy dump"), p.status.collectors
    assert sum(s.count for s in p.oncpu) > 0 and p.threads[str(spin.pid)].name == "MainThread"
    assert all(s.frames[-1].startswith("<module> (<string>:") for s in p.oncpu), p.oncpu


@pytest.mark.bpf
def test_record_python_client_names_its_hot_function(
    kvcached_factory: Callable[..., Server],
    pyclient: Callable[[Server, float], subprocess.Popen[str]],
    tmp_path: Path,
) -> None:
    """pymemcache client: its hot function tops the Python stacks, with file:line; BPF adds off-CPU, futex."""
    server = kvcached_factory("-t", "2")
    client = pyclient(server, 90)
    out = tmp_path / "py.json"
    # off-CPU as sampled by default: its threads looked at OFFCPU_HZ times a second
    r = record(client.pid, out, "-d", "3", timeout=180)
    client.terminate()
    assert r.returncode == 0, r.stderr
    p = Profile.load(out)
    assert p.status.sample_rates["offcpu_hz"] == OFFCPU_HZ, p.status.sample_rates
    assert p.status.collectors["oncpu"].startswith("ok (py-spy"), p.status.collectors
    assert p.status.collectors["offcpu"] == "ok", p.status.collectors
    assert {"oncpu", "offcpu"} <= set(p.collectors)
    assert p.status.counters["pyspy.samples"] > 0 and "pyspy.errors" in p.status.counters

    self_time: Counter[str] = Counter()
    for s in p.oncpu:
        self_time[s.frames[-1].split(" (")[0]] += s.count
    assert self_time.most_common(1)[0][0] == HOT, self_time.most_common(5)
    lines = {
        int(f.rsplit(":", 1)[1].rstrip(")"))
        for s in p.oncpu
        for f in s.frames
        if f.startswith(f"{HOT} (") and "pyclient.py:" in f
    }
    assert lines and lines <= set(hot_lines()), (lines, hot_lines())

    names = {info.name for info in p.threads.values() if info.cpu_samples}
    assert "client-0" in names, names  # Python's thread name, from py-spy
    assert sum(s.ns for s in p.offcpu.stacks) > 0  # waits for the server's replies
    assert any(fw.waits for fw in p.offcpu.futex)  # the main thread's timed join
    assert server.stats()["cmd_get"] != "0"


@pytest.mark.bpf
def test_top_live_source_takes_python_stacks_from_py_spy(
    kvcached_factory: Callable[..., Server], pyclient: Callable[[Server, float], subprocess.Popen[str]]
) -> None:
    """`kvprof top -p PID` on a CPython process: the on-CPU view is py-spy's
    Python stacks (the hot function on top), off-CPU comes from BPF."""
    from kvprof.tui.sources import LiveSource

    server = kvcached_factory("-t", "1")
    client = pyclient(server, 90)
    source = LiveSource(client.pid, collectors=("oncpu", "offcpu"))
    source.start()
    try:
        assert source.wait_attached(("oncpu", "offcpu"), timeout=60), source.states
        source.poll()  # the session's "ok", detailed by the collector's part of the profile
        assert source.states["oncpu"].startswith("ok (py-spy"), source.states
        top = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and top != HOT:
            time.sleep(1.0)
            (sample,) = source.poll()
            if sample.profile is None or not sample.profile.oncpu:
                continue
            self_time: Counter[str] = Counter()
            for s in sample.profile.oncpu:
                self_time[s.frames[-1].split(" (")[0]] += s.count
            top = self_time.most_common(1)[0][0]
        assert top == HOT, self_time.most_common(5)
        assert sample.profile is not None and "offcpu" in sample.profile.collectors
    finally:
        source.close()
        client.terminate()
    assert source.states["oncpu"].startswith("ok (py-spy")


def test_python_on_a_non_python_pid_is_one_line(kvcached: Server, tmp_path: Path) -> None:
    """--python on kvcached: one readable line, exit 2, nothing written."""
    out = tmp_path / "x.json"
    r = record(kvcached.pid, out, "--python", "--collectors", "oncpu", "-d", "1", timeout=180)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a CPython process" in lines[0], r.stderr
    assert "drop --python" in lines[0]
    assert not out.exists()


def test_python_without_permission_is_one_line(
    idle_python: subprocess.Popen[bytes], unprivileged: Unprivileged
) -> None:
    """py-spy as nobody on root's Python: one readable line naming the fix, exit 2."""
    r = unprivileged.run(
        unprivileged.kvprof(
            "record", "-p", str(idle_python.pid), "-o", "/dev/null", "-q", "--python", "--collectors", "oncpu"
        )
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "permission denied" in lines[0] and "root" in lines[0], r.stderr
