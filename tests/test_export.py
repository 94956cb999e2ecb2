"""Flame-graph exports from hand-made profiles: folded text, SVG, speedscope, diffs, the CLI.

Golden files: `tests/golden/flame-small.json` (a hand-made profile) and the
folded text each kind and option must give, written by hand
(`flame-small.<kind>[-<prefix>|-<value>].folded`). After a deliberate change
of the output, `KVPROF_REGEN_GOLDEN=1 pytest tests/test_export.py` rewrites
them; review the diff before committing it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import GOLDEN, REPO, SMALL, SVG_NS, kvprof, read_svg

from kvprof.export import KINDS, ExportError, Options, export, format_of, write
from kvprof.export.diff import GREW, SHRANK, diff
from kvprof.export.folded import format_folded, parse_folded
from kvprof.export.frames import APP, HOTSPOT, KERNEL, LIB, Classifier
from kvprof.export.speedscope import SCHEMA
from kvprof.export.stacks import fold, stacks
from kvprof.export.svg import LEGEND_COLOURS, frame_colour
from kvprof.export.tree import Flame
from kvprof.model.profile import CpuStack, Profile, Target, ThreadInfo, Window

REGEN = os.environ.get("KVPROF_REGEN_GOLDEN") == "1"


def small() -> Profile:
    return Profile.load(SMALL)


def profile_of(stacks_and_counts: list[tuple[list[str], int]], tid: int = 1) -> Profile:
    return Profile(
        target=Target(pid=7, comm="kvcached"),
        window=Window(start=1767225600.0, duration_s=1.0),
        hz=99,
        collectors=["oncpu"],
        threads={str(tid): ThreadInfo(name="kv-worker-0")},
        oncpu=[CpuStack(tid, frames, count) for frames, count in stacks_and_counts],
    )


# ---- folded stacks ---------------------------------------------------------------

GOLDEN_CASES = [
    ("cpu", None, None),
    ("cpu", "thread", None),
    ("cpu", "socket", None),
    ("offcpu", None, None),
    ("locks", None, None),
    ("locks", None, "waits"),
    ("locks", "thread", None),
]


@pytest.mark.parametrize(("kind", "prefix", "value"), GOLDEN_CASES)
def test_folded_matches_golden(kind: str, prefix: str | None, value: str | None, tmp_path: Path) -> None:
    """Each kind and option of the hand-made profile folds to exactly the hand-written text."""
    suffix = kind + (f"-{prefix}" if prefix else "") + (f"-{value}" if value else "")
    expected = GOLDEN / f"flame-small.{suffix}.folded"
    out = tmp_path / "out.folded"
    written = write(small(), kind, out, Options(prefix=prefix, value=value))
    if REGEN:
        expected.write_text(out.read_text())
    assert out.read_text() == expected.read_text()
    assert written.stacks == len(expected.read_text().splitlines())


def test_locks_leave_out_futex_waits_the_probes_timed() -> None:
    """Futex waits on a probed lock's word, or at a probed call path, are not counted twice."""
    leaves = {s.frames[-1]: s.value for s in stacks(small(), "locks")}
    # 0x1000 is the topkeys lock's word; 0x9000 waits at items_get, which item_lock's probe covers
    assert "[futex 0x1000]" not in leaves and "[futex 0x9000]" not in leaves
    assert leaves["[futex 0x7f00]"] == 900_000


@pytest.mark.parametrize("kind", KINDS)
def test_folded_round_trip(kind: str) -> None:
    """Folded text parsed back gives the same stacks and values, summing to the profile's total."""
    p = small()
    folded = fold(stacks(p, kind))
    assert parse_folded(format_folded(folded)) == folded
    total = {
        "cpu": sum(s.count for s in p.oncpu),
        "offcpu": sum(s.ns for s in p.offcpu.stacks),
        "locks": sum(lk.wait_ns for lk in p.locks) + 900_000,  # + the one futex wait no probe saw
    }[kind]
    assert sum(parse_folded(format_folded(folded)).values()) == total


def test_round_trip_of_a_large_random_profile() -> None:
    """Thousands of random stacks (frames with spaces, brackets, C++ names) survive the round trip."""
    rng = random.Random(5)
    names = [
        "main",
        "operator new(unsigned long)",
        "ns::Cls<int>::run",
        "[vdso]",
        "libc.so.6+0x1f2e",
        "x_[k]",
    ]
    pairs = [
        ([rng.choice(names) for _ in range(rng.randint(1, 12))], rng.randint(1, 500)) for _ in range(3000)
    ]
    folded = fold(stacks(profile_of(pairs), "cpu"))
    assert parse_folded(format_folded(folded)) == folded


def test_parse_folded_rejects_a_line_without_a_count() -> None:
    """A line that is not `frames COUNT` is an ExportError naming the line, not a crash."""
    with pytest.raises(ExportError, match="line 2"):
        parse_folded("a;b 3\na;b three\n")


# ---- the layout ---------------------------------------------------------------------


@dataclass
class _Ref:
    value: int = 0
    children: dict[str, _Ref] | None = None


def _reference(
    folded: dict[tuple[str, ...], int], min_value: float
) -> tuple[list[tuple[str, int, int, int]], int]:
    """Boxes (name, depth, start, value) and the pruned count, from an explicit call tree."""
    root = _Ref(0, {})
    for frames, v in folded.items():
        root.value += v
        node = root
        for f in frames:
            assert node.children is not None
            node = node.children.setdefault(f, _Ref(0, {}))
            node.value += v

    def size(n: _Ref) -> int:
        return 1 + sum(size(c) for c in (n.children or {}).values())

    boxes: list[tuple[str, int, int, int]] = []
    pruned = 0

    def walk(name: str, n: _Ref, depth: int, start: int) -> None:
        nonlocal pruned
        boxes.append((name, depth, start, n.value))
        x = start + n.value - sum(c.value for c in (n.children or {}).values())  # own value first
        for cname in sorted(n.children or {}):
            c = (n.children or {})[cname]
            if c.value < min_value:
                pruned += size(c)
            else:
                walk(cname, c, depth + 1, x)
            x += c.value

    walk("all", root, 0, 0)
    return boxes, pruned


frame_names = st.sampled_from(["a", "b", "ab", "a!", "b_[k]", "c", "Z", "a b"])


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.lists(frame_names, min_size=1, max_size=6).map(tuple), st.integers(1, 50), max_size=40
    ),
    st.sampled_from([0, 1, 3, 10, 40]),
)
def test_layout_matches_an_explicit_call_tree(folded: dict[tuple[str, ...], int], min_value: int) -> None:
    """The sorted-stack layout draws and prunes exactly what a call tree would."""
    flame = Flame(folded)
    layout = flame.layout(min_value)
    if not folded:
        assert layout.boxes == [] and layout.total == 0
        return
    boxes, pruned = _reference(folded, min_value)
    assert [(b.name, b.depth, b.start, b.value) for b in layout.boxes] == boxes
    assert layout.pruned == pruned
    for b in layout.boxes:  # every box's value is what its call path adds up to
        assert flame.value_of(flame.path(b)) == b.value


# ---- SVG ------------------------------------------------------------------------------


def test_svg_is_xml_and_every_width_is_proportional(tmp_path: Path) -> None:
    """Each frame's width is its value's share of the width within a pixel, inside its caller."""
    out = tmp_path / "cpu.svg"
    written = write(small(), "cpu", out)
    doc = read_svg(out)
    total, width, x0 = int(doc.attr("total")), float(doc.attr("width")), float(doc.attr("x0"))
    assert total == 14 == written.total and doc.root.attrib["width"] == "1200"
    assert len(doc.frames) == written.frames and doc.attr("pruned") == "0"
    for f in doc.frames:
        assert abs(f.width - f.value / total * width) <= 1.0, f
        assert abs(f.x - (x0 + f.start / total * width)) <= 1.0, f
    rows = {f.y for f in doc.frames}
    for f in doc.frames:  # a callee lies within a frame one row below
        if f.name != "all":
            below = [
                g
                for g in doc.frames
                if g.y == f.y + 16 and g.start <= f.start and f.start + f.value <= g.start + g.value
            ]
            assert len(below) == 1, f
    assert len(rows) == 6  # all + the deepest stack's 5 frames
    (topkeys,) = doc.named("update_topkeys")
    assert topkeys.tip == "5 samples, 35.71%"


def test_svg_colours_by_frame_type_with_a_legend(tmp_path: Path) -> None:
    """Hotspot-catalog frames get the violet legend colour; kernel and library frames their own."""
    out = tmp_path / "cpu.svg"
    write(small(), "cpu", out)
    doc = read_svg(out)
    legend = [el.text for el in doc.root.iter(f"{SVG_NS}text") if el.get("class") == "legend"]
    assert legend == ["kvcached code", "libraries", "kernel", "known hotspot (kvprof catalog)"]
    swatches = [el.get("fill") for el in doc.root.iter(f"{SVG_NS}rect") if el.get("class") == "swatch"]
    assert swatches == [LEGEND_COLOURS[k] for k in (APP, LIB, KERNEL, HOTSPOT)]
    assert doc.named("update_topkeys")[0].fill == frame_colour(HOTSPOT, "update_topkeys")
    assert doc.named("collect_timings")[0].fill == frame_colour(HOTSPOT, "collect_timings")
    assert doc.named("do_syscall_64_[k]")[0].fill == frame_colour(KERNEL, "do_syscall_64_[k]")
    assert doc.named("start_thread")[0].fill == frame_colour(LIB, "start_thread")
    assert doc.named("worker_main")[0].fill == frame_colour(APP, "worker_main")
    assert "On-CPU flame graph: kvcached PID 4242" in doc.text("title")
    assert "14 samples at 99 Hz" in doc.text("subtitle") and "over 2.0 s" in doc.text("subtitle")


KVCACHED = REPO / "server" / "build" / "kvcached"


@pytest.mark.skipif(not KVCACHED.is_file(), reason="needs server/build/kvcached (make -C server)")
def test_frames_of_the_targets_executable_are_its_code() -> None:
    """With the target's binary at hand, its own functions are app code and libc's are not."""
    p = profile_of([(["start_thread"], 1)])
    p.target.exe = str(KVCACHED)
    classify = Classifier(p)
    assert classify("worker_main", 3) == APP and classify("items_get", 3) == APP
    assert classify("start_thread", 1) == LIB and classify("epoll_wait", 3) == LIB
    assert classify("update_topkeys", 4) == HOTSPOT and classify("tcp_sendmsg_[k]", 5) == KERNEL
    assert classify("kvcached+0x1a2b", 3) == APP and classify("libc.so.6+0x99", 3) == LIB


def test_narrow_frames_are_pruned_and_counted(tmp_path: Path) -> None:
    """Frames under 0.1 px (and all they call) are not drawn; the note and data-pruned count them."""
    pairs = [
        (["main", "work", "hot"], 99_980),
        (["main", "work", "hot", "tiny"], 5),
        (["main", "work", "warm"], 10),
    ]
    pairs += [(["main", f"cold{i}", "x", "y"], 1) for i in range(5)]  # 3 frames each, 0.0118 px wide
    out = tmp_path / "pruned.svg"
    written = write(profile_of(pairs), "cpu", out)
    doc = read_svg(out)
    # tiny: 5 / 100,000 * 1180 px = 0.059 px; warm: 0.118 px, kept
    assert sorted(f.name for f in doc.frames) == ["all", "hot", "main", "warm", "work"]
    assert written.pruned == 16 and doc.attr("pruned") == "16"
    assert doc.text("pruned") == "16 frames narrower than 0.1 px not drawn (0.01% of the total)"
    assert "5 frames (16 pruned)" in written.describe()

    write(profile_of(pairs), "cpu", out, Options(min_width=0))
    assert len(read_svg(out).frames) == 21 and read_svg(out).text("pruned") == "no frames pruned"


def test_empty_profile_gives_an_svg_that_says_no_samples(tmp_path: Path) -> None:
    """No stacks of the kind: a valid SVG with "no samples" and no frames, not a crash."""
    out = tmp_path / "empty.svg"
    description = export(profile_of([]), "cpu", out)
    doc = read_svg(out)
    assert doc.frames == [] and doc.attr("total") == "0"
    assert doc.text("empty").startswith("no samples")
    assert description == f"wrote {out}: cpu, no samples, 0 frames (0 pruned)"


# ---- the public interface -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("a.svg", "svg"), ("a.SVG", "svg"), ("a.folded", "folded"), ("a.speedscope.json", "speedscope")],
)
def test_the_extension_chooses_the_format(name: str, fmt: str) -> None:
    """.svg, .folded and .speedscope.json, case-insensitive."""
    assert format_of(name) == fmt


@pytest.mark.parametrize("name", ["a.png", "a.json", "svg", ".svg", "a.svg.txt"])
def test_unknown_extension_is_one_readable_line(name: str, tmp_path: Path) -> None:
    """Any other name: ExportError whose message is one line naming the formats."""
    with pytest.raises(ExportError) as e:
        export(small(), "cpu", tmp_path / name)
    assert "\n" not in str(e.value) and ".svg, .folded or .speedscope.json" in str(e.value)
    assert not (tmp_path / name).exists()


def test_unknown_kind_is_one_readable_line(tmp_path: Path) -> None:
    """A kind other than cpu/offcpu/locks: ExportError, one line, nothing written."""
    with pytest.raises(ExportError, match=r"^unknown kind 'memory': choose cpu, offcpu or locks$"):
        export(small(), "memory", tmp_path / "x.svg")
    assert not (tmp_path / "x.svg").exists()


def test_export_returns_one_line_saying_what_was_written(tmp_path: Path) -> None:
    """export() writes the file and describes it: path, kind, amount, frames and pruned."""
    p = small()
    assert (
        export(p, "cpu", tmp_path / "f.svg")
        == f"wrote {tmp_path / 'f.svg'}: cpu, 14 samples, 12 frames (0 pruned)"
    )
    assert (
        export(p, "locks", tmp_path / "l.folded")
        == f"wrote {tmp_path / 'l.folded'}: locks, 2.8 ms in 4 stacks"
    )
    line = export(p, "offcpu", tmp_path / "o.speedscope.json")
    assert line == f"wrote {tmp_path / 'o.speedscope.json'}: offcpu, 5.7 ms, 2 profiles (one per thread)"


# ---- speedscope ------------------------------------------------------------------------


def test_speedscope_has_the_schema_and_one_sampled_profile_per_thread(tmp_path: Path) -> None:
    """$schema, shared frames, one `sampled` profile per thread whose weights add up to its total."""
    out = tmp_path / "cpu.speedscope.json"
    write(small(), "cpu", out)
    doc = json.loads(out.read_text())
    assert doc["$schema"] == SCHEMA == "https://www.speedscope.app/file-format-schema.json"
    frames = [f["name"] for f in doc["shared"]["frames"]]
    profiles = {p["name"]: p for p in doc["profiles"]}
    assert set(profiles) == {"kv-worker-0 (tid 101)", "kv-worker-1 (tid 102)", "tid 103 (tid 103)"}
    for p in profiles.values():
        assert p["type"] == "sampled" and p["unit"] == "none" and p["startValue"] == 0
        assert len(p["samples"]) == len(p["weights"]) and sum(p["weights"]) == p["endValue"]
    w0 = profiles["kv-worker-0 (tid 101)"]
    assert w0["endValue"] == 8 and doc["profiles"][0] is not None
    stacks_w0 = {tuple(frames[i] for i in s): w for s, w in zip(w0["samples"], w0["weights"], strict=True)}
    assert (
        stacks_w0[("start_thread", "worker_main", "process_commands", "collect_timings")] == 4
    )  # root first
    locks = tmp_path / "locks.speedscope.json"
    write(small(), "locks", locks)
    assert {p["unit"] for p in json.loads(locks.read_text())["profiles"]} == {"nanoseconds"}


# ---- diff -------------------------------------------------------------------------------


def test_diff_normalises_by_total() -> None:
    """NEW = BASE with every count doubled: every frame is unchanged."""
    base = small()
    new = small()
    for s in new.oncpu:
        s.count *= 2
    result = diff(base, new, "cpu")
    assert result.grew == result.shrank == 0
    assert all(b.value for b in result.layout.boxes)


def test_diff_colours_what_shrank_blue_and_what_grew_red(tmp_path: Path) -> None:
    """update_topkeys gone from NEW: blue in BASE's shape (--negate); what took its share is red."""
    base, new = small(), small()
    new.oncpu = [s for s in new.oncpu if "update_topkeys" not in s.frames]
    out = tmp_path / "d.svg"
    out.write_text(diff(base, new, "cpu", negate=True, labels=("base", "new")).svg)
    doc = read_svg(out)
    (topkeys,) = doc.named("update_topkeys")
    assert topkeys.cls == "down" and topkeys.fill == SHRANK  # the largest change: full strength
    assert topkeys.tip.startswith("35.71% -> 0.00% of the total (-35.71 points)")
    (timings,) = doc.named("collect_timings")  # 4 of 14 -> 4 of 9
    assert timings.cls == "up" and timings.tip.startswith("28.57% -> 44.44%")
    r, g, b = (int(timings.fill[i : i + 2], 16) for i in (1, 3, 5))
    assert r > g and r > b
    assert doc.text("title") == "Differential on-CPU flame graph: base -> new"

    out.write_text(diff(base, new, "cpu", labels=("base", "new")).svg)  # NEW's shape: no topkeys
    assert read_svg(out).named("update_topkeys") == [] and GREW != SHRANK


# ---- the commands ----------------------------------------------------------------------


def test_cli_flamegraph_writes_each_format(tmp_path: Path) -> None:
    """`kvprof flamegraph FILE --kind K -o OUT` for the three formats; status line on stderr."""
    for name in ("l.svg", "l.folded", "l.speedscope.json"):
        r = kvprof("flamegraph", str(SMALL), "--kind", "locks", "-o", str(tmp_path / name))
        assert r.returncode == 0, r.stderr
        assert r.stderr.startswith(f"wrote {tmp_path / name}: locks, 2.8 ms")
    assert (tmp_path / "l.folded").read_text() == (GOLDEN / "flame-small.locks.folded").read_text()
    r = kvprof("flamegraph", str(SMALL), cwd=tmp_path)  # default name: next to nothing, in the cwd
    assert r.returncode == 0 and (tmp_path / "flame-small.cpu.svg").is_file(), r.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--kind", "memory", "-o", "x.svg"],
            "kvprof flamegraph: unknown kind 'memory': choose cpu, offcpu or locks",
        ),
        (
            ["-o", "x.png"],
            "kvprof flamegraph: x.png: unknown output type; name it .svg, .folded or .speedscope.json",
        ),
        (
            ["--kind", "cpu", "--value", "ns", "-o", "x.svg"],
            "kvprof flamegraph: kind cpu is measured in samples, not 'ns'",
        ),
    ],
)
def test_cli_bad_request_is_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    """A bad kind, extension or value: exactly one line on stderr, status 2, no traceback."""
    r = kvprof("flamegraph", str(SMALL), *args, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr == message + "\n" and r.stdout == ""


def test_cli_empty_profile_warns_and_exits_0(tmp_path: Path) -> None:
    """A profile without stacks: a warning, an SVG that says "no samples", status 0."""
    src = tmp_path / "empty.json"
    profile_of([]).save(src)
    r = kvprof("flamegraph", str(src), "-o", str(tmp_path / "e.svg"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(f"kvprof flamegraph: warning: {src} has no cpu samples")
    assert read_svg(tmp_path / "e.svg").text("empty").startswith("no samples")


def test_cli_bad_profile_is_one_line(tmp_path: Path) -> None:
    """A missing or non-profile file: one line, status 2."""
    (tmp_path / "x.json").write_text("[]")
    for path in (tmp_path / "missing.json", tmp_path / "x.json"):
        r = kvprof("flamegraph", str(path), "-o", str(tmp_path / "o.svg"))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_cli_diff(tmp_path: Path) -> None:
    """`kvprof diff BASE NEW -o OUT.svg` writes the SVG; another extension is one line."""
    new = small()
    new.oncpu = [s for s in new.oncpu if "update_topkeys" not in s.frames]
    new.save(tmp_path / "fixed.json")
    r = kvprof("diff", str(SMALL), str(tmp_path / "fixed.json"), "--negate", "-o", str(tmp_path / "d.svg"))
    assert r.returncode == 0, r.stderr
    assert "cpu diff in BASE's shape" in r.stderr
    doc = read_svg(tmp_path / "d.svg")
    assert doc.named("update_topkeys")[0].cls == "down"
    assert doc.text("title") == "Differential on-CPU flame graph: flame-small -> fixed"
    r = kvprof("diff", str(SMALL), str(SMALL), "-o", str(tmp_path / "d.folded"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "name it .svg" in r.stderr


def test_flamegraph_and_diff_load_neither_bcc_nor_textual(tmp_path: Path) -> None:
    """The export commands run without the BPF or TUI stacks."""
    code = (
        "import sys\n"
        "from kvprof.cli import main\n"
        f"assert main(['flamegraph', {str(SMALL)!r}, '-o', {str(tmp_path / 'a.svg')!r}]) == 0\n"
        f"assert main(['diff', {str(SMALL)!r}, {str(SMALL)!r}, '-o', {str(tmp_path / 'b.svg')!r}]) == 0\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('bcc', 'textual'))\n"
        "assert not loaded, loaded\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
