"""Flame graphs of a real recording: kvcached (baseline, then fixed) under kvload,
`kvprof record --flamegraph` with real BPF, then `kvprof flamegraph` and `kvprof diff`
on the two profiles, as a user would run them.

The load is kvload's study shape with uniform keys and 5 % sets, so that the
item and LRU locks stay quiet and the topkeys mutex is the contended one, as
in the study. Two busy cores shared with other work can keep the two workers
from ever meeting on the mutex for a while: then the baseline recording is
taken again (three tries), since a profile without the contention cannot
show it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import SvgDoc, SvgFrame, kvload, kvprof, read_svg, record

from kvprof.analysis.hotspots import is_wrapper
from kvprof.export.diff import SAME_BELOW
from kvprof.export.frames import HOTSPOT
from kvprof.export.svg import frame_colour
from kvprof.model.profile import Profile
from kvprof.system.servers import Server

HOTSPOTS = ("collect_timings", "update_topkeys", "on_create_item", "on_delete_item", "account_memory")
QUIET_ITEM_LOCKS = ("--key-dist=uniform", "--set-pct=5")  # after support.LOAD: these win


def _topkeys_waits(p: Profile) -> int:
    return sum(lk.waits for lk in p.locks if lk.name == "topkeys")


def _record(start: Callable[..., Server], preset: str, tmp_path: Path, tries: int) -> tuple[Path, Path]:
    server = start("-t", "2", "--preset", preset)
    out, svg = tmp_path / f"{preset}.json.gz", tmp_path / f"{preset}-cpu.svg"
    with kvload(server, 120, *QUIET_ITEM_LOCKS) as kv:
        time.sleep(0.5)
        for _ in range(tries):
            r = record(server.pid, out, "-d", "2", "--hz", "499", "--collectors", "oncpu,offcpu,locks",
                       "--flamegraph", str(svg))  # fmt: skip
            assert r.returncode == 0, r.stderr
            assert f"wrote {svg}: cpu, " in r.stderr  # said even with -q
            if _topkeys_waits(Profile.load(out)):
                break
        kv.send_signal(signal.SIGTERM)
    server.stop()
    return out, svg


def _kvprof(*args: str) -> None:
    r = kvprof(*args, timeout=60)
    assert r.returncode == 0, r.stderr


def _caller(doc: SvgDoc, f: SvgFrame) -> SvgFrame | None:
    """The frame one row below `f` whose span holds it."""
    for g in doc.frames:
        if g.y == f.y + 16 and g.start <= f.start and f.start + f.value <= g.start + g.value:
            return g
    return None


def _lock_leaves(doc: SvgDoc) -> list[SvgFrame]:
    return [f for f in doc.frames if f.name.startswith(("[lock ", "[futex "))]


def _call_sites(doc: SvgDoc) -> list[SvgFrame]:
    """Under each `[lock ...]` / `[futex ...]` leaf, the first frame that is not lock plumbing."""
    sites = []
    for leaf in _lock_leaves(doc):
        site = _caller(doc, leaf)
        while site is not None and is_wrapper(site.name):
            site = _caller(doc, site)
        assert site is not None, leaf
        sites.append(site)
    return sites


def _under(doc: SvgDoc, f: SvgFrame, name: str) -> bool:
    """Whether a frame named `name` is among f's callers."""
    caller = _caller(doc, f)
    while caller is not None and caller.name != name:
        caller = _caller(doc, caller)
    return caller is not None


def _on_topkeys_mutex(frames: list[str]) -> bool:
    """An off-CPU stack that waited for a lock under update_topkeys."""
    return "update_topkeys" in frames and any(
        "lll_lock_wait" in f for f in frames[frames.index("update_topkeys") + 1 :]
    )


def _is_blue(f: SvgFrame) -> bool:
    r, _, b = (int(f.fill[i : i + 2], 16) for i in (1, 3, 5))
    return f.cls == "down" and b > r


@pytest.mark.bpf
def test_flame_graphs_of_kvcached_baseline_and_fixed(
    kvcached_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """Baseline cpu SVG names the sampled hotspots in the hotspot colour; its locks SVG draws
    update_topkeys's waits on the topkeys mutex as measured; baseline -> fixed colours them blue."""
    base, base_svg = _record(kvcached_factory, "baseline", tmp_path, tries=3)
    fixed, _ = _record(kvcached_factory, "fixed", tmp_path, tries=1)
    p_base, p_fixed = Profile.load(base), Profile.load(fixed)
    assert _topkeys_waits(p_base), "no contended topkeys waits in 3 recordings of baseline under load"
    assert _topkeys_waits(p_fixed) == 0  # per-thread tables: the design has no shared mutex

    # cpu: the SVG record wrote holds every sample; drawn with no pruning, every
    # hotspot function sampled is named, with its samples, in the hotspot colour
    assert int(read_svg(base_svg).attr("total")) == sum(s.count for s in p_base.oncpu)
    _kvprof("flamegraph", str(base), "--min-width", "0", "-o", str(tmp_path / "cpu.svg"))
    doc = read_svg(tmp_path / "cpu.svg")
    sampled = {h: sum(s.count for s in p_base.oncpu if h in s.frames) for h in HOTSPOTS}
    sampled = {h: n for h, n in sampled.items() if n}
    assert sampled, "no hotspot function sampled at all"
    for name, count in sampled.items():
        frames = doc.named(name)
        assert sum(f.value for f in frames) == count, name
        assert all(f.fill == frame_colour(HOTSPOT, name) for f in frames), name

    # locks: update_topkeys is drawn as a waiting call site of the topkeys mutex, by name,
    # as wide as the waits the recording measured there. How it ranks against the item
    # locks of items_get moves with the machine's load, so the drawing is checked against
    # the profile, not against a ranking.
    _kvprof("flamegraph", str(base), "--kind", "locks", "--min-width", "0", "-o", str(tmp_path / "locks.svg"))
    locks_doc = read_svg(tmp_path / "locks.svg")
    drawn = sum(
        leaf.value
        for leaf, site in zip(_lock_leaves(locks_doc), _call_sites(locks_doc), strict=True)
        if leaf.name == "[lock topkeys]" and site.name == "update_topkeys"
    )
    topkeys_stacks = [ls for lk in p_base.locks if lk.name == "topkeys" for ls in lk.stacks]
    measured = sum(ls.wait_ns for ls in topkeys_stacks if "update_topkeys" in ls.frames)
    assert drawn == measured > 0, (drawn, measured)

    # diff, locks: fixed has no topkeys waits, so in baseline's shape they are all blue,
    # but a stack whose share was under SAME_BELOW (one sampled short wait beside far
    # longer ones, as a run beside other load can draw), which is grey.
    # The diffs are drawn with no pruning: a short window's waits may be narrower than
    # the default's 0.1 px, beside the epoll waits in particular.
    unpruned = ("--negate", "--min-width", "0")
    _kvprof("diff", str(base), str(fixed), "--kind", "locks", *unpruned, "-o", str(tmp_path / "dl.svg"))
    diff_doc = read_svg(tmp_path / "dl.svg")
    topkeys = diff_doc.named("update_topkeys") + diff_doc.named("[lock topkeys]")
    locks_total = int(diff_doc.attr("total"))  # --negate: baseline's shape and total
    assert any(_is_blue(f) for f in topkeys), [(f.name, f.cls, f.tip) for f in topkeys]
    for f in topkeys:
        assert f.cls == "same" if f.value / locks_total < SAME_BELOW else _is_blue(f), (f.name, f.cls, f.tip)

    # diff, off-CPU: baseline's threads slept on the topkeys mutex (a futex wait under
    # update_topkeys), fixed's cannot (it has no mutex there). Shares of all off-CPU
    # time are small and move with the machine's load, so only the wait on the mutex
    # is checked: it is gone in fixed, whatever its share was in baseline.
    assert not [s.frames for s in p_fixed.offcpu.stacks if _on_topkeys_mutex(s.frames)]
    _kvprof("diff", str(base), str(fixed), "--kind", "offcpu", *unpruned, "-o", str(tmp_path / "do.svg"))
    off_doc = read_svg(tmp_path / "do.svg")
    waits = [f for f in off_doc.frames if "lll_lock_wait" in f.name and _under(off_doc, f, "update_topkeys")]
    if any(_on_topkeys_mutex(s.frames) for s in p_base.offcpu.stacks):
        assert waits, "baseline's waits on the topkeys mutex are not drawn"
    base_ns = sum(s.ns for s in p_base.offcpu.stacks)
    for f in waits:
        assert f.tip.endswith(" -> 0 ns"), f.tip  # fixed: none
        assert f.cls == ("same" if f.value / base_ns < SAME_BELOW else "down"), f.tip

    # diff, cpu: a few hundred samples a side make small shares noisy, so here the
    # colour of every hotspot frame is checked against its own change of share,
    # computed from its exact sample counts
    _kvprof("diff", str(base), str(fixed), "--negate", "-o", str(tmp_path / "dc.svg"))
    cpu_doc = read_svg(tmp_path / "dc.svg")
    base_total, fixed_total = sum(s.count for s in p_base.oncpu), sum(s.count for s in p_fixed.oncpu)
    for name in sampled:
        for f in cpu_doc.named(name):
            in_fixed = int(f.tip.rsplit(" -> ", 1)[1].split()[0].replace(",", ""))
            delta = in_fixed / fixed_total - f.value / base_total
            want = "same" if abs(delta) < SAME_BELOW else "down" if delta < 0 else "up"
            assert f.cls == want, (name, f.tip)
