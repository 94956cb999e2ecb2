"""`record --hold LOCK` (kvprof.collect.hold): one mutex's hold times from uprobes on
glibc's mutex calls, for a bounded time; then how ceilings and the what-if read a
hold measured over part of the window (LockHold.window_s)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import KVPROF, TESTS, kvprof, record_args, start_ready

from kvprof.analysis import ceilings, whatif
from kvprof.collect import UPROBE_HIT_NS
from kvprof.model.delta import delta
from kvprof.model.profile import Finding, LockHold, Profile, Target, ThreadHolds, ThreadInfo, Window

HOLD_SOURCE = TESTS / "programs" / "hold.c"
HOLD_NS = 20_000  # the busy-wait inside timed_lock
HOLD_SECONDS = 3


@pytest.fixture(scope="module")
def hold_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("programs") / "hold"
    subprocess.run(["cc", "-O1", "-g", "-pthread", "-o", str(out), str(HOLD_SOURCE)], check=True, timeout=60)
    return out


@pytest.fixture
def holder(hold_binary: Path, started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    return start_ready([hold_binary, str(HOLD_NS)], started)


def _round(proc: subprocess.Popen[bytes], n: int) -> int:
    """Each thread takes timed_lock n times; the acquisitions it counted."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"go {n}\n".encode())
    proc.stdin.flush()
    word, total = proc.stdout.readline().split()
    assert word == b"done"
    return int(total)


def _first_byte(pid: int, function: str) -> int:
    """The first byte of glibc's `function` as process `pid` sees it: 0xcc (int3) while a
    uprobe is on it."""
    from kvprof.collect.hold import mutex_sites

    site = next(s for s in mutex_sites(pid) if s.function == function and not s.retprobe)
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        cols = line.split()
        lo, hi = (int(x, 16) for x in cols[0].split("-"))
        off = int(cols[2], 16)
        if len(cols) > 5 and "x" in cols[1] and off <= site.offset < off + hi - lo:
            with open(f"/proc/{pid}/mem", "rb") as mem:
                mem.seek(lo + site.offset - off)
                return mem.read(1)[0]
    raise AssertionError(f"{function} is not mapped in {pid}")


def _wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.bpf
def test_hold_times_a_known_critical_section_for_its_seconds_then_detaches(
    holder: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """Two threads hold timed_lock HOLD_NS each time: every acquisition of the round is
    counted (none of other_lock's), each hold at least the busy-wait less the probes' time
    and not ten times it; after --hold-seconds the uprobes are gone while recording goes
    on, and a later round is not counted; the report's CEILINGS has the lock."""
    out = tmp_path / "hold.json.gz"
    args = ["--hold", "timed_lock", "--hold-seconds", str(HOLD_SECONDS), "-d", str(HOLD_SECONDS + 8)]
    rec = subprocess.Popen([*KVPROF, *record_args(holder.pid, out, *args)], stderr=subprocess.PIPE, text=True)
    try:
        assert rec.stderr is not None
        said = []
        for line in rec.stderr:  # not a terminal: each progress step is a line of its own
            said.append(line)
            if "attached" in line:
                break
        else:
            raise AssertionError(f"record never attached: {''.join(said)}")
        assert _first_byte(holder.pid, "pthread_mutex_lock") == 0xCC  # the probe is on
        counted = _round(holder, 200)
        _wait_for(
            "the uprobes outlived --hold-seconds",
            lambda: _first_byte(holder.pid, "pthread_mutex_lock") != 0xCC,
            HOLD_SECONDS + 10,
        )
        assert rec.poll() is None, "record ended with its uprobes: nothing shows they went first"
        _round(holder, 100)  # after the hold window
        assert rec.wait(60) == 0, rec.stderr.read()
    finally:
        if rec.poll() is None:
            rec.kill()
            rec.wait()
    assert _first_byte(holder.pid, "pthread_mutex_unlock") != 0xCC

    p = Profile.load(out)
    (hold,) = [h for h in p.holds if h.name == "timed_lock"]
    assert hold.acquisitions == counted == 400
    assert sorted(t.acquisitions for t in hold.by_thread.values()) == [200, 200]
    assert 0 < hold.window_s <= HOLD_SECONDS + 0.5
    mean = hold.hold_ns / hold.acquisitions
    assert HOLD_NS - UPROBE_HIT_NS <= mean < 10 * HOLD_NS, mean
    assert hold.min_ns >= HOLD_NS - UPROBE_HIT_NS
    assert any(n.startswith("hold: timed_lock") and "trapped" in n for n in p.status.notes)

    report = kvprof("report", str(out))
    assert report.returncode == 0, report.stderr
    section = report.stdout.split("CEILINGS", 1)[1].split("\n\n", 1)[0]
    assert "timed_lock mutex" in section, section


@pytest.mark.bpf
def test_hold_bad_input_is_one_line_and_attaches_nothing(
    holder: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """An unknown symbol, an unmapped address and a program without glibc's mutexes: one
    line each, exit status 2, no profile, and no uprobe left in the target."""
    static = tmp_path / "static"
    src = tmp_path / "static.c"
    src.write_text("#include <unistd.h>\nint main(void) { pause(); return 0; }\n")
    subprocess.run(["cc", "-static", "-o", str(static), str(src)], check=True, timeout=60)
    alone = subprocess.Popen([str(static)])
    try:
        cases = [
            (holder.pid, "no_such_lock", "no data symbol of that name"),
            (holder.pid, "0x10", "no memory of"),
            (alone.pid, "0x10", "no glibc pthread_mutex_lock"),
        ]
        for pid, lock, says in cases:
            out = tmp_path / "none.json.gz"
            r = kvprof(*record_args(pid, out, "-q", "--hold", lock, "-d", "1"))
            assert r.returncode == 2, r.stderr
            assert r.stderr.count("\n") == 1 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
            assert not out.exists()
    finally:
        alone.kill()
        alone.wait()
    assert _first_byte(holder.pid, "pthread_mutex_lock") != 0xCC


# ---- a hold measured over part of the window, on hand-made profiles ---------------------------------

SECONDS = 10.0


def _profile(window_s: float) -> Profile:
    """A 10 s window of a program with no request counter, one lock held 2 us each of 1,000
    acquisitions a second by two threads, timed for window_s seconds (0: all of them)."""
    p = Profile(Target(pid=1, comm="prog"), window=Window(start=1.0, duration_s=SECONDS))
    p.threads = {t: ThreadInfo(name="prog", cpu_samples=100) for t in ("11", "12")}
    timed = window_s or SECONDS
    n = int(1000 * timed / 2)
    h = LockHold(name="stats_lock", address=0xA0, samples=2 * n, min_ns=1000, window_s=window_s)
    for tid in ("11", "12"):
        h.by_thread[tid] = ThreadHolds(n, n * 2000)
        h.acquisitions += n
        h.hold_ns += n * 2000
    p.holds = [h]
    return p


def test_a_hold_timed_for_part_of_the_window_gives_the_same_ceiling_and_excess() -> None:
    """Timed for 2 s of 10 or for all of them, the same lock has the same ceiling and held
    excess: the rates divide by window_s when it is set; with no request counter, its
    acquisitions a second are the program's ops."""
    part, whole = _profile(2.0), _profile(0.0)
    assert ceilings.counted(part) == pytest.approx((1000.0, "acquisitions of stats_lock"))
    (a,), (b,) = ceilings.lock_ceilings(part, 1000.0), ceilings.lock_ceilings(whole, 1000.0)
    assert a.ceiling_ops_per_s == pytest.approx(b.ceiling_ops_per_s) == pytest.approx(500_000)
    f = Finding(id="futex:0xa0", category="offcpu", severity="info", title="", where="", lock="stats_lock")
    excess = whatif.held_excess(part, f)
    assert excess == pytest.approx(whatif.held_excess(whole, f))
    assert excess["11"] == pytest.approx(500 * 1000 / 1e9)  # 1 us past the shortest, 500 times a second


def test_window_s_is_per_window_and_old_profiles_load() -> None:
    """A snapshot's delta subtracts the seconds timed before its base; a profile written
    before window_s existed loads with 0 (the whole window)."""
    new, old = _profile(2.0), _profile(0.5)
    new.holds[0].interrupted, new.holds[0].interrupted_ns = 3, 3_000_000
    old.holds[0].interrupted, old.holds[0].interrupted_ns = 1, 1_000_000
    d = delta(new, old).holds[0]
    assert d.window_s == pytest.approx(1.5)
    assert (d.interrupted, d.interrupted_ns) == (2, 2_000_000)  # interrupted holds subtract too
    d = new.to_dict()
    for h in d["holds"]:
        del h["window_s"]
    loaded = Profile.from_dict(json.loads(json.dumps(d)))
    assert loaded.holds[0].window_s == 0.0


def test_a_timed_hold_is_per_request_of_its_own_seconds() -> None:
    """The target's counters when the probes went on and off say its requests over the
    seconds timed: a hold timed while the traps slowed the target to a fifth of the
    window's pace is still one acquisition per request, not a fifth of one."""
    p = _profile(2.0)  # 1,000 acquisitions a second while timed
    p.server_stats = {
        "before": {"cmd_get": "0", "cmd_set": "0"},
        "after": {"cmd_get": str(int(5000 * SECONDS)), "cmd_set": "0"},  # 5,000 a second in all
        "hold.before": {"cmd_get": "100", "cmd_set": "0"},
        "hold.after": {"cmd_get": str(100 + 2 * 1000), "cmd_set": "0"},  # 1,000 a second while timed
    }
    (c,) = ceilings.lock_ceilings(p, ceilings.throughput(p))
    assert c.busy_ns_per_op == pytest.approx(2000)  # one 2 us hold per request
    del p.server_stats["hold.before"]
    (c,) = ceilings.lock_ceilings(p, ceilings.throughput(p))
    assert c.busy_ns_per_op == pytest.approx(400)  # the window's pace: a fifth of a hold
