"""`kvprof report` and `kvprof top` show the same numbers for the same window."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from support import baseline_profile

from kvprof.analysis.tables import seconds
from kvprof.model.profile import Profile
from kvprof.tui import data
from kvprof.tui.data import Frame, Sample, Timeline, build_frame
from kvprof.views.report import to_json

FIXTURES = Path(__file__).parent / "fixtures"
PROFILES = {
    "top-baseline": lambda: Profile.load(FIXTURES / "top-baseline.json"),
    "false-share": lambda: Profile.load(FIXTURES / "false-share.json"),
    "hand-made": baseline_profile,
    "unknown-length": lambda: unknown_length(baseline_profile()),
}


def unknown_length(p: Profile) -> Profile:
    """A window whose length was not recorded: both views read its rates as counts (1 s)."""
    p.window.duration_s = 0.0
    return p


def one_window(p: Profile) -> tuple[dict[str, Any], Frame]:
    """The report's tables of `p`, and top's frame whose three windows are all `p`."""
    tl = Timeline()
    tl.add(Sample(p.window.duration_s, p))
    frame = build_frame(tl, "t", "c", "replay")
    assert frame.interval is p and frame.recent is p and frame.total is p
    return to_json(p, top=1000)["tables"], frame


@pytest.mark.parametrize("name", PROFILES)
def test_locks_agree(name: str) -> None:
    """Each lock's waits/s and wait ms/s, its busiest call site and its threads agree."""
    tables, frame = one_window(PROFILES[name]())
    top = [
        (r.name, r.waits_per_s, r.wait_ms_per_s, r.max_ms, r.threads, r.call_site)
        for r in data.lock_rows(frame)
    ]
    report = [
        (r["name"], r["waits_per_s"], r["wait_ms_per_s"], r["max_ms"], r["threads"], r["call_site"])
        for r in tables["locks"]
    ]
    assert top == report
    for r in data.lock_rows(frame):
        if r.sites:
            assert r.sites[0].site == r.call_site
            assert sum(s.waits for s in r.sites) == r.waits


@pytest.mark.parametrize("name", PROFILES)
def test_cache_lines_agree(name: str) -> None:
    """Top's per-site rows are the sums of the report's per-line rows."""
    tables, frame = one_window(PROFILES[name]())
    by_site: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in tables["cachelines"]:
        by_site[r["site"]].append(r)
    top = {r.site: r for r in data.line_rows(frame)}
    assert set(top) == {site for site, rows in by_site.items() if sum(r["samples"] for r in rows)}
    for site, r in top.items():
        lines = by_site[site]
        assert r.lines == len(lines)
        assert r.samples == sum(x["samples"] for x in lines)
        assert r.updates_per_s == pytest.approx(sum(x["updates_per_s"] for x in lines))
        assert r.transfers_per_s == pytest.approx(sum(x["transfers_per_s"] for x in lines))
        assert r.writers == max(x["writers"] for x in lines)
    assert data.transfer_matrix(frame) == tables["socket_matrix"]


@pytest.mark.parametrize("name", PROFILES)
def test_threads_agree(name: str) -> None:
    """Each thread's samples, CPU share, lock and off-CPU time and stack quality agree."""
    p = PROFILES[name]()
    tables, frame = one_window(p)
    report = {r["tid"]: r for r in tables["threads"]}
    top = data.thread_rows(frame)
    assert {r.tid for r in top} == set(report)
    dur = seconds(p)
    for r in top:
        want = report[r.tid]
        assert (r.name, r.samples, r.cpu_share) == (want["name"], want["samples"], want["cpu_share"])
        assert (r.lock_wait_ms, r.offcpu_ms) == (want["lock_wait_ms"], want["offcpu_ms"])
        assert r.lock_wait_share == pytest.approx(want["lock_wait_ms"] / 1e3 / dur)
        assert r.offcpu_share == pytest.approx(want["offcpu_ms"] / 1e3 / dur)
        assert r.stack_quality == want["stack_quality"]
        assert ",".join(f"{s}:{n}" for s, n in sorted(r.sockets.items())) == want["sockets"]


@pytest.mark.parametrize("name", PROFILES)
def test_requests_agree(name: str) -> None:
    """Each opcode's sampled count and percentiles agree."""
    tables, frame = one_window(PROFILES[name]())
    top = [(r.opcode, r.samples, r.p50_us, r.p99_us) for r in data.request_rows(frame)]
    assert top == [(r["opcode"], r["count"], r["p50_us"], r["p99_us"]) for r in tables["requests"]]


@pytest.mark.parametrize("name", PROFILES)
def test_functions_agree(name: str) -> None:
    """Each function's self and total share agree, and so does its catalog mark."""
    tables, frame = one_window(PROFILES[name]())
    top = {r.function: r for r in data.stack_rows(frame, limit=10_000)}
    assert tables["functions"]
    for r in tables["functions"]:
        row = top[r["function"]]
        assert (row.self_all, row.total_all, row.hotspot) == (r["self_share"], r["total_share"], r["hotspot"])
        assert (row.self_now, row.total_now) == (row.self_all, row.total_all)
