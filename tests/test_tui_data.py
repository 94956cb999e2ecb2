"""`kvprof top`'s data layer: windows, rates and rows from profile snapshots, without textual."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import TOP_BASELINE, halved

from kvprof.model.profile import Profile
from kvprof.tui import data
from kvprof.tui.data import Sample, Timeline, build_frame


def fixture() -> Profile:
    return Profile.load(TOP_BASELINE)


def test_data_layer_does_not_import_textual() -> None:
    """The data layer and the sources stay importable (and testable) without textual."""
    code = "import sys, kvprof.tui.data, kvprof.tui.sources; sys.exit('textual' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_windows_are_deltas_with_their_own_duration() -> None:
    """interval = last two samples, total = since start; each with the time it covers."""
    full = fixture()
    tl = Timeline()
    tl.add(Sample(2.5, halved(full)))
    tl.add(Sample(5.0, full))
    windows = tl.windows()
    assert windows is not None
    interval, _recent, total = windows
    assert interval.window.duration_s == pytest.approx(full.window.duration_s / 2, abs=0.002)
    assert total.window.duration_s == full.window.duration_s
    topkeys = next(lk for lk in interval.locks if lk.name == "topkeys")
    whole = next(lk for lk in full.locks if lk.name == "topkeys")
    assert topkeys.waits == whole.waits - whole.waits // 2


def test_reset_starts_the_total_again() -> None:
    """After `r` the total window is empty, then covers only what came after."""
    full = fixture()
    tl = Timeline()
    tl.add(Sample(2.5, halved(full)))
    tl.reset()
    windows = tl.windows()
    assert windows is not None and windows[2].window.duration_s == 0
    tl.add(Sample(5.0, full))
    windows = tl.windows()
    assert windows is not None
    assert windows[2].window.duration_s == pytest.approx(full.window.duration_s / 2, abs=0.002)


def test_ops_per_second_from_the_targets_stats() -> None:
    """ops/s is (cmd_get + cmd_set) between two `stats` readings over the time between them."""
    tl = Timeline()
    tl.add(Sample(1.0, None, {"cmd_get": "1000", "cmd_set": "0"}))
    tl.add(Sample(3.0, None, {"cmd_get": "4000", "cmd_set": "1000"}))
    assert tl.ops_per_s == 2000.0
    assert list(tl.ops) == [2000.0]


def test_findings_name_the_study_spots_with_a_cost_line() -> None:
    """The recorded baseline names topkeys and the shared counters, each with its function
    first, a study spot (starred) first, and each shared line's ceiling on its row."""
    tl = Timeline()
    tl.add(Sample(5.0, fixture()))
    frame = build_frame(tl, "kvcached PID 1", "kvcached", "replay")
    rows = data.finding_rows(frame)
    lines = [r.cost for r in rows]
    assert rows[0].hotspot, lines
    topkeys = [c for c in lines if c.startswith("update_topkeys — topkeys mutex: ")]
    assert topkeys and "wall time waiting" in topkeys[0], lines
    for site in ("on_create_item", "collect_timings", "account_memory"):
        shared = [c for c in lines if c.startswith(f"{site} — shared counter")]
        assert shared and "; ceiling " in shared[0], lines
    assert frame.ceiling.startswith("ceiling "), frame.ceiling


def test_rows_of_every_view() -> None:
    """Each view has rows from the recorded baseline; the per-site and matrix numbers are scaled."""
    tl = Timeline()
    tl.add(Sample(5.0, fixture()))
    frame = build_frame(tl, "t", "c", "replay")
    assert data.stack_rows(frame)[0].self_now > 0
    assert {r.name for r in data.lock_rows(frame)} >= {"topkeys"}
    assert any(s.site == "update_topkeys" for r in data.lock_rows(frame) for s in r.sites)
    lines = {r.site: r for r in data.line_rows(frame)}
    assert {"on_create_item", "collect_timings", "account_memory"} <= set(lines)
    assert lines["account_memory"].writers == 2 and lines["account_memory"].cross_socket_share > 0
    m = data.transfer_matrix(frame)
    assert len(m) == 2 and m[0][1] > 0 and m[1][0] > 0  # the fixture's two (fake) sockets
    assert len(data.line_threads(frame, "account_memory")) == 2
    assert {r.name for r in data.thread_rows(frame)} >= {"kv-worker-0", "kv-worker-1"}
    assert {r.opcode for r in data.request_rows(frame)} >= {"get"}


def test_stack_rows_filter_by_thread() -> None:
    """A thread filter counts only that thread's samples."""
    tl = Timeline()
    tl.add(Sample(5.0, fixture()))
    frame = build_frame(tl, "t", "c", "replay")
    tid = data.thread_choices(frame)[0][0]
    own = {f for s in frame.total.oncpu if str(s.tid) == tid for f in s.frames} if frame.total else set()
    rows = data.stack_rows(frame, tid)
    assert rows and all(r.function in own for r in rows)


def test_a_target_without_kvs_probes_says_which_views_are_unavailable() -> None:
    """No kvs probes: the kvs views say so instead of showing empty tables."""
    p = fixture()
    p.target.kvs_probes = False
    p.locks, p.cachelines, p.requests = [], [], {}
    p.status.collectors = {
        "oncpu": "ok",
        "offcpu": "ok",
        "locks": "not applicable: no kvs probes",
        "cachelines": "not applicable: no kvs probes",
        "requests": "not applicable: no kvs probes",
    }
    tl = Timeline()
    tl.add(Sample(5.0, p, states=dict(p.status.collectors)))
    frame = build_frame(tl, "t", "c", "live")
    assert frame.status.unavailable["lines"] == "no kvs probes: cache-line view unavailable"
    assert frame.status.unavailable["locks"] == "no kvs probes: lock view unavailable"
    assert "stacks" not in frame.status.unavailable


def test_target_exit_sets_the_banner() -> None:
    """A sample that finds the target gone ends the session with a banner; the data stays."""
    tl = Timeline()
    tl.add(Sample(3.0, halved(fixture())))
    tl.add(Sample(6.0, fixture(), alive=False))
    frame = build_frame(tl, "kvcached PID 7", "c", "live")
    assert frame.status.ended.startswith("kvcached PID 7 exited after 6 s")
    assert frame.findings


def test_saved_profile_is_the_total_with_findings_and_stats() -> None:
    """`s` saves the total window with the target's stats around it and fresh findings."""
    tl = Timeline()
    tl.add(Sample(0.0, None, {"cmd_get": "0", "cmd_set": "0"}))
    tl.add(Sample(5.0, fixture(), {"cmd_get": "10", "cmd_set": "0"}))
    p = data.profile_to_save(tl)
    assert p is not None
    assert p.server_stats["before"]["cmd_get"] == "0" and p.server_stats["after"]["cmd_get"] == "10"
    assert any(f.where == "topkeys" for f in p.findings)
