"""Targets whose threads and processes come and go (tests/programs/lifecycle.c, built
with the kvs probes so that its semaphores are raised while kvprof is attached):
1,000 threads, short-lived threads, a target that forks (followed or said) and one
that execs during `record`. Each recording ends cleanly, leaves no uprobe and no
raised semaphore behind, and its profile says what happened."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import (
    KVPROF,
    REPO,
    assert_no_uprobes,
    pid_semaphores,
    reaped,
    record,
    record_args,
    show_view,
    top_app,
    until,
    wait_until,
)
from textual.widgets import DataTable

from kvprof.analysis.tables import THREAD_ROWS
from kvprof.collect import OFFCPU_HZ, OFFCPU_LOOKS
from kvprof.collect.debuginfo import ProcessSymbols
from kvprof.model.profile import Profile
from kvprof.tui.sources import LiveSource
from kvprof.tui.widgets import Line

pytestmark = pytest.mark.bpf

SOURCE = REPO / "tests" / "programs" / "lifecycle.c"
SERVER_BUILD = REPO / "server" / "build"


@pytest.fixture(scope="module")
def lifecycle_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/programs/lifecycle.c with the kvs probes (server/build's kvs.h and kvs_probes.o)."""
    if not (SERVER_BUILD / "kvs_probes.o").exists():
        pytest.skip("server/build/kvs_probes.o missing: run `make build`")
    out = tmp_path_factory.mktemp("programs") / "lifecycle"
    subprocess.run(
        ["cc", "-O1", "-g", "-fno-omit-frame-pointer", "-pthread", f"-I{SERVER_BUILD}", "-o", str(out),
         str(SOURCE), str(SERVER_BUILD / "kvs_probes.o")],
        check=True,
        timeout=60,
    )  # fmt: skip
    return out


@pytest.fixture
def lifecycle(lifecycle_binary: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start `lifecycle ARGS` (it prints "ready"); each one is stopped (stdin closed) at teardown."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [str(lifecycle_binary), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    yield start
    for proc in started:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _leaves(p: Profile) -> dict[str, set[int]]:
    """The tids whose on-CPU stacks pass through each function."""
    out: dict[str, set[int]] = {}
    for s in p.oncpu:
        for f in s.frames:
            out.setdefault(f, set()).add(s.tid)
    return out


def _report(path: Path) -> str:
    done = subprocess.run([*KVPROF, "report", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_thousand_threads(lifecycle: Callable[..., subprocess.Popen[str]], tmp_path: Path) -> None:
    """1,000 threads: record works, sees hundreds of them, and the report's thread tables are capped
    with a line that sums up the rest. The off-CPU looks take a slice of the threads each time, in
    turn: no more samples than the slices hold, and hundreds of threads sampled asleep."""
    proc = lifecycle("threads", "1000", "120")
    out = tmp_path / "t.json.gz"
    done = record(proc.pid, out, "-d", "3", timeout=240)
    assert done.returncode == 0, done.stderr
    p = Profile.load(out)
    assert len(p.threads) > 500
    assert "spin_worker" in _leaves(p)
    counters = p.status.counters
    assert 0 < counters["offcpu.samples"] <= counters["offcpu.looks"] * (OFFCPU_LOOKS // OFFCPU_HZ), counters
    seen = {s.tid for s in p.offcpu.stacks if not s.placeless()}
    assert len(seen) > 300, len(seen)
    text = _report(out)
    assert "more threads" in text
    assert len(text.splitlines()) < 300
    assert not [line for line in text.splitlines() if len(line) > 80]
    assert_no_uprobes()
    assert not any(pid_semaphores(proc.pid).values())


def test_threads_come_and_go(lifecycle: Callable[..., subprocess.Popen[str]], tmp_path: Path) -> None:
    """Short-lived threads: their samples are kept after they exit, and the profile says
    threads came and went."""
    proc = lifecycle("churn", "120")
    out = tmp_path / "c.json.gz"
    done = record(proc.pid, out, "-d", "3", timeout=240)
    assert done.returncode == 0, done.stderr
    p = Profile.load(out)
    short = _leaves(p).get("spin_short", set())
    assert short and all(not Path(f"/proc/{proc.pid}/task/{tid}").exists() for tid in short)
    assert any(n.startswith("threads came and went") for n in p.status.notes), p.status.notes
    assert "threads came and went" in _report(out)


def _record_fork(proc: subprocess.Popen[str], out: Path, *args: str) -> tuple[Profile, int]:
    """Record the fork program; a long-lived child is forked once attached: (profile, its pid)."""
    rec = subprocess.Popen([*KVPROF, *record_args(proc.pid, out, "-d", "4", *args)], stderr=subprocess.PIPE,
                           text=True)  # fmt: skip
    with reaped(rec):
        assert rec.stderr is not None
        for line in rec.stderr:
            if "collecting" in line:
                break
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("long\n")
        proc.stdin.flush()
        child = int(proc.stdout.readline().split()[1])
        rest = rec.stderr.read()
        assert rec.wait(timeout=240) == 0, rest
    return Profile.load(out), child


def test_fork_not_followed(lifecycle: Callable[..., subprocess.Popen[str]], tmp_path: Path) -> None:
    """A target that forks, recorded without --follow-forks: the children's work is not in the
    profile, the profile says they were not followed, and a child forked while the probes were
    attached has its semaphores back at 0 once kvprof is gone."""
    proc = lifecycle("fork", "120")
    p, child = _record_fork(proc, tmp_path / "f.json.gz")
    frames = _leaves(p)
    assert "spin_parent" in frames and "spin_child" not in frames
    assert any("not followed" in n and "--follow-forks" in n for n in p.status.notes), p.status.notes
    assert_no_uprobes()
    assert Path(f"/proc/{child}").exists()
    assert not any(pid_semaphores(child).values())
    assert not any(pid_semaphores(proc.pid).values())


def test_fork_followed(lifecycle: Callable[..., subprocess.Popen[str]], tmp_path: Path) -> None:
    """With --follow-forks the children's stacks are in the profile under their own ids (not the
    parent's threads), named with the target's symbols, and the profile says they were followed."""
    proc = lifecycle("fork", "120")
    p, child = _record_fork(proc, tmp_path / "f.json.gz", "--follow-forks")
    frames = _leaves(p)
    assert "spin_child" in frames and "spin_parent" in frames
    assert not frames["spin_child"] & frames["spin_parent"]
    assert proc.pid not in frames["spin_child"]
    assert any("followed" in n and "not followed" not in n for n in p.status.notes), p.status.notes
    assert_no_uprobes()
    assert not any(pid_semaphores(child).values())


def test_exec_ends_the_recording(lifecycle: Callable[..., subprocess.Popen[str]], tmp_path: Path) -> None:
    """A target that execs during `record`: the recording ends there with a line that says so,
    the profile is partial with that reason and keeps the stacks from before the exec, named;
    nothing stays attached and the new program's semaphores are at 0."""
    proc = lifecycle("exec", "120")
    out = tmp_path / "e.json.gz"
    rec = subprocess.Popen(
        [*KVPROF, *record_args(proc.pid, out, "-d", "60")], stderr=subprocess.PIPE, text=True
    )
    with reaped(rec):
        assert rec.stderr is not None and proc.stdin is not None
        for line in rec.stderr:
            if "collecting" in line:
                break
        assert wait_until(lambda: Path(f"/proc/{proc.pid}/task").exists(), 1)
        subprocess.run(["sleep", "2"], check=True)  # samples before the exec
        proc.stdin.write("exec\n")
        proc.stdin.flush()
        rest = rec.stderr.read()
        assert rec.wait(timeout=120) == 0, rest
    assert "exec'd" in rest and "partial" in rest
    p = Profile.load(out)
    assert p.status.partial and "exec'd" in p.status.reason
    assert p.window.duration_s < 60
    assert "spin_before_exec" in _leaves(p)
    assert "exec'd" in _report(out)
    assert_no_uprobes()
    assert wait_until(lambda: "spin" in Path(f"/proc/{proc.pid}/cmdline").read_text(), 5)
    assert not any(pid_semaphores(proc.pid).values())


def _runtime_address(pid: int, binary: Path, function: str) -> int:
    """Where `function` of the PIE `binary` is in process `pid` now (nm's address + load base)."""
    nm = subprocess.run(["nm", str(binary)], capture_output=True, text=True, check=True).stdout
    vaddr = next(int(line.split()[0], 16) for line in nm.splitlines() if line.endswith(f" T {function}"))
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        cols = line.split()
        if cols[-1] == str(binary) and int(cols[2], 16) == 0:
            return int(cols[0].split("-")[0], 16) + vaddr
    raise AssertionError(f"{binary} is not mapped in {pid}")


def test_names_from_before_an_exec_survive_reading_the_maps_after_it(
    lifecycle: Callable[..., subprocess.Popen[str]], lifecycle_binary: Path
) -> None:
    """Stacks taken before an exec are named after it, though the mappings were read
    again meanwhile (a stack from after the exec missed them): the race that named
    them `lifecycle+0x...` when `record` read its maps late on a loaded machine."""
    proc = lifecycle("exec", "120")
    assert proc.stdin is not None
    names = ProcessSymbols(proc.pid)
    names.refresh()
    before = _runtime_address(proc.pid, lifecycle_binary, "spin_before_exec")
    proc.stdin.write("exec\n")
    proc.stdin.flush()
    assert wait_until(lambda: "spin" in Path(f"/proc/{proc.pid}/cmdline").read_text(), 5)
    after = _runtime_address(proc.pid, lifecycle_binary, "spin_after_exec")
    assert names.function_name(after + 1) == "spin_after_exec"  # a miss: the maps are read again
    assert names.function_name(before + 1) == "spin_before_exec"


def test_top_on_thousand_threads(lifecycle: Callable[..., subprocess.Popen[str]]) -> None:
    """`kvprof top` on 1,000 threads keeps refreshing, and its Threads view shows the busiest
    THREAD_ROWS with the rest summed in its head line; q detaches everything."""

    proc = lifecycle("threads", "1000", "120")
    source = LiveSource(proc.pid)
    app = top_app(source)
    seen: dict[str, object] = {}

    async def go() -> None:
        async with app.run_test(size=(132, 40)) as pilot:
            assert await until(pilot, lambda: app.frames > 0, 120)
            await show_view(pilot, "5", "threads")
            head = app.query_one("#threads-head", Line)
            assert await until(pilot, lambda: "more threads" in str(head.render()), 120)
            drawn = app.frames
            assert await until(pilot, lambda: app.frames >= drawn + 2, 10)  # still refreshing
            seen["rows"] = app.query_one("#threads-table", DataTable).row_count
            await pilot.press("q")

    asyncio.run(go())
    app.wait_closed()
    while source.attaching():
        time.sleep(0.1)
    assert seen["rows"] == THREAD_ROWS
    assert_no_uprobes()
