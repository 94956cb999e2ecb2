"""Inline frames (kvprof/collect/inline.py): the inline chains read from DWARF
agree with binutils' addr2line on every third address of real binaries, and a
hot function inlined at -O2 into its caller shows as `name [inlined]` in a
recording of a real program: in `report`, the folded, SVG and speedscope
exports, pprof (one location, inlined function first, as `go tool pprof`
reads it) and `top`'s stacks view; `--no-inline` leaves it out. kvcached's
lock call-site stacks expand too, and still name the caller past the lock
plumbing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import KVPROF, bpf_unavailable, drive, kvload, kvprof, record, stop_contend, top_app, until

from kvprof.analysis.hotspots import call_site
from kvprof.collect.inline import module_inlines
from kvprof.export.pprof import pprof_message
from kvprof.model.profile import Profile
from kvprof.system.servers import Server, die_with_parent, kvcached_binary

PROGRAM = Path(__file__).parent / "programs" / "inline_hot.c"
GO = shutil.which("go")
ADDR2LINE = shutil.which("addr2line")


def text_range(path: Path) -> range:
    """The addresses of `.text`, as `readelf -S` prints the section."""
    out = subprocess.run(["readelf", "-SW", str(path)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"\s\.text\s+PROGBITS\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)", out)
    assert m is not None, out
    lo = int(m.group(1), 16)
    return range(lo, lo + int(m.group(2), 16))


def addr2line_chains(path: Path, addrs: list[int]) -> dict[int, list[str]]:
    """addr -> the functions inlined there, outermost first, as `addr2line -a -f -i` says
    (it prints the innermost first, then each caller, the out-of-line function last)."""
    out = subprocess.run(
        ["addr2line", "-a", "-f", "-i", "-e", str(path), *(hex(a) for a in addrs)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    chains: dict[int, list[str]] = {}
    names: list[str] = []
    i = 0
    while i < len(out):
        if out[i].startswith("0x"):
            names = chains.setdefault(int(out[i], 16), [])
            i += 1
        else:
            names.append(out[i])  # the function; its file:line follows
            i += 2
    return {a: names[::-1][1:] for a, names in chains.items()}


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("inline") / "inline_hot"
    subprocess.run(["cc", "-O2", "-g", "-o", str(out), str(PROGRAM)], check=True, timeout=60)
    return out


@pytest.mark.skipif(ADDR2LINE is None, reason="no addr2line (binutils): run scripts/provision.sh")
@pytest.mark.parametrize("which", ["kvcached", "inline_hot"])
def test_chains_agree_with_addr2line(which: str, program: Path) -> None:
    """Every third address of kvcached's and the test program's code: the inline chain
    read from DWARF is the one addr2line -i prints, names and order."""
    path = kvcached_binary() if which == "kvcached" else program
    tables = module_inlines(str(path))
    assert tables is not None, f"{path}: no DWARF read"
    addrs = list(text_range(path))[::3]
    reference = addr2line_chains(path, addrs)
    wrong = {hex(a): (tables.chain(a), reference[a]) for a in addrs if tables.chain(a) != reference[a]}
    assert not wrong, f"{len(wrong)} of {len(addrs)} differ, e.g. {list(wrong.items())[:5]}"
    assert any(reference[a] for a in addrs), "no inlined code in the addresses checked"


def test_tables_need_dwarf_and_go_by_build_id(program: Path, tmp_path: Path) -> None:
    """A build without -g gives no inline tables (frames stay as they were), a missing
    file none either; a stripped copy of a build read before shares its tables (same
    build-id, same code), as a debug file found by build-id would."""
    plain = tmp_path / "plain"
    subprocess.run(["cc", "-O2", "-o", str(plain), str(PROGRAM)], check=True, timeout=60)
    assert module_inlines(str(plain)) is None
    assert module_inlines(str(tmp_path / "missing")) is None
    stripped = tmp_path / "stripped"
    subprocess.run(["strip", "-o", str(stripped), str(program)], check=True)
    assert module_inlines(str(stripped)) is module_inlines(str(program)) is not None


_DIE = re.compile(r"^ <\d+><([0-9a-f]+)>: Abbrev Number: \d+ \((DW_TAG_\w+)\)$", re.M)


def inlined_into(path: Path, callee: str) -> bool:
    """Whether the DWARF of `path` has an inlined call of `callee` (readelf's dump: a
    DW_TAG_inlined_subroutine whose abstract origin is the subprogram named `callee`)."""
    dump = subprocess.run(
        ["readelf", "--debug-dump=info", str(path)], capture_output=True, text=True, check=True
    ).stdout
    heads = list(_DIE.finditer(dump))
    dies = [
        (h[1], h[2], dump[h.end() : nxt.start() if nxt else len(dump)])
        for h, nxt in zip(heads, [*heads[1:], None], strict=True)
    ]
    name = re.compile(rf"DW_AT_name\s*:.*\b{callee}$", re.M)
    origins = {off for off, tag, body in dies if tag == "DW_TAG_subprogram" and name.search(body)}
    return any(
        tag == "DW_TAG_inlined_subroutine" and f"DW_AT_abstract_origin: <0x{off}>" in body
        for _, tag, body in dies
        for off in origins
    )


@pytest.fixture
def running(program: Path) -> Iterator[int]:
    """The test program, spinning in its inlined mix_keys, stopped after the test."""
    proc = subprocess.Popen(
        [str(program), "60"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=die_with_parent
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield proc.pid
    finally:
        stop_contend(proc)


def recorded(pid: int, out: Path, *args: str) -> Profile:
    reason = bpf_unavailable()
    if reason:
        pytest.skip(reason)
    done = record(pid, out, "-d", "3", "--collectors", "oncpu", *args)
    assert done.returncode == 0, done.stderr
    return Profile.load(out)


def leaves(profile: Profile) -> dict[tuple[str, ...], int]:
    """The last two frames of each on-CPU stack -> samples."""
    out: dict[tuple[str, ...], int] = {}
    for s in profile.oncpu:
        out[tuple(s.frames[-2:])] = out.get(tuple(s.frames[-2:]), 0) + s.count
    return out


@pytest.mark.bpf
def test_inlined_hot_function_shows_in_every_output(program: Path, running: int, tmp_path: Path) -> None:
    """mix_keys, inlined into hash_round (the DWARF says so), is the hottest leaf as
    `mix_keys [inlined]` under hash_round in the profile, report, folded, SVG,
    speedscope and top; in pprof it is the first Line of hash_round's location."""
    assert inlined_into(program, "mix_keys"), "the compiler did not inline mix_keys"
    path = tmp_path / "p.json.gz"
    profile = recorded(running, path)
    hot = max(leaves(profile).items(), key=lambda kv: kv[1])[0]
    assert hot == ("hash_round", "mix_keys [inlined]"), leaves(profile)
    report = kvprof("report", str(path))
    assert report.returncode == 0 and "mix_keys [inlined]" in report.stdout, report.stdout
    for ending in ("folded", "svg", "speedscope.json"):
        out = tmp_path / f"cpu.{ending}"
        done = kvprof("flamegraph", str(path), "--kind", "cpu", "-o", str(out))
        assert done.returncode == 0, done.stderr
        assert "mix_keys [inlined]" in out.read_text(), ending
    folded = (tmp_path / "cpu.folded").read_text()
    assert re.search(r"(^|;)hash_round;mix_keys \[inlined\] \d+$", folded, re.M), folded
    msg = pprof_message(profile, "cpu")
    names = {f.id: msg.string_table[f.name] for f in msg.function}
    chains = [[names[line.function_id] for line in loc.line] for loc in msg.location]
    assert ["mix_keys", "hash_round"] in chains, chains  # innermost first, one location
    assert not any("[inlined]" in name for name in names.values())


@pytest.mark.bpf
@pytest.mark.skipif(GO is None, reason="no `go` (Debian golang-go): run scripts/provision.sh")
def test_go_pprof_top_shows_the_inlined_function(running: int, tmp_path: Path) -> None:
    """`go tool pprof -top` on the pprof export shows mix_keys first, marked inline by pprof."""
    path = tmp_path / "p.json.gz"
    recorded(running, path)
    out = tmp_path / "cpu.pb.gz"
    assert kvprof("flamegraph", str(path), "--kind", "cpu", "-o", str(out)).returncode == 0
    top = subprocess.run(
        [GO or "go", "tool", "pprof", "-top", "-sample_index=samples", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert top.returncode == 0, top.stderr
    rows = [line for line in top.stdout.splitlines() if re.match(r"^\s*\d+\s+\S+%", line)]
    assert rows and "mix_keys (inline)" in rows[0], top.stdout  # pprof marks inlined Lines itself


@pytest.mark.bpf
def test_top_stacks_view_and_no_inline(running: int, tmp_path: Path) -> None:
    """top's stacks view lists `mix_keys [inlined]`; with --no-inline the frame is gone
    and its samples are hash_round's own."""
    from textual.widgets import DataTable

    from kvprof.tui.sources import ReplaySource

    path = tmp_path / "p.json.gz"
    recorded(running, path)
    app = top_app(ReplaySource(path), out_dir=tmp_path)

    def stack_rows() -> list[str]:
        table = app.query_one("#stacks-table", DataTable)
        return [" ".join(str(c) for c in table.get_row_at(i)) for i in range(table.row_count)]

    async def script(pilot: object) -> None:
        await pilot.press("2")  # type: ignore[attr-defined]
        assert await until(pilot, lambda: any("mix_keys [inlined]" in r for r in stack_rows())), stack_rows()  # type: ignore[arg-type]

    drive(app, script)
    plain = recorded(running, tmp_path / "plain.json.gz", "--no-inline")
    assert not any(f.endswith("[inlined]") for s in plain.oncpu for f in s.frames)
    assert max(leaves(plain).items(), key=lambda kv: kv[1])[0][-1] == "hash_round", leaves(plain)


@pytest.mark.bpf
def test_lock_call_sites_expand_and_keep_their_caller(
    kvcached_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """kvcached's lock-probe stacks (frame pointers, from the probe in kv_lock_report)
    carry the inlined kv_unlock; the call site named is still update_topkeys, past it."""
    server = kvcached_factory("--preset", "baseline", "-t", "2", "--lock-sample", "1")
    with kvload(server, 30):  # stopped when the recording is done
        profile = recorded(server.pid, tmp_path / "p.json.gz", "--collectors", "locks")
    topkeys = next((lk for lk in profile.locks if lk.name == "topkeys"), None)
    assert topkeys is not None and topkeys.stacks, [lk.name for lk in profile.locks]
    frames = max(topkeys.stacks, key=lambda s: s.waits).frames
    assert "kv_unlock [inlined]" in frames, frames
    assert call_site(frames) == "update_topkeys", frames


def test_no_inline_is_a_flag_of_record_and_top() -> None:
    """--no-inline is offered by record and top (the one default: CollectOptions.inline)."""
    for cmd in ("record", "top"):
        done = subprocess.run([*KVPROF, cmd, "--help"], capture_output=True, text=True, check=False)
        assert "--no-inline" in done.stdout, cmd
