"""Code without symbols is named by the start of the function its unwind table
(an `.eh_frame` FDE) covers, `memcached+0x187a0`, never by its bare module, in
every view; code no FDE covers stays `module+0xOFF` and the report says so, with
the modules that had no symbols and what would name them; C++ clones
(`.isra.0`, `.constprop.0`) are demangled with the clone kept as a note. With
Debian's stripped memcached under kvload, a stripped build of a test program
and a C++ method GCC 12 -O2 emits only as a clone. The FDE tables the checks
use are read here with pyelftools, not with the readelf that kvprof runs."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import TESTS, kvload, kvprof, record, start_ready, stop_contend

from kvprof.analysis.hotspots import bare, call_site, is_wrapper, match_function, match_lock, normalize
from kvprof.collect.debuginfo import ProcessSymbols
from kvprof.collect.demangle import demangle
from kvprof.collect.plt import plt_name, plt_stubs
from kvprof.collect.unnamed import missing_symbols
from kvprof.collect.unwind import function_start
from kvprof.export.folded import parse_folded
from kvprof.export.pprof import pprof_message
from kvprof.model.profile import CpuStack, Profile, Target
from kvprof.system.servers import Server
from kvprof.tui.data import Sample, Timeline, build_frame, finding_rows, stack_rows
from kvprof.views.report import render_text, to_json

pytest.importorskip("elftools", reason="pyelftools (python3-pyelftools) is missing: run scripts/provision.sh")

MEMCACHED = Path("/usr/bin/memcached")
PROGRAMS = TESTS / "programs"
GXX = shutil.which("g++-12") or shutil.which("g++")
_UNNAMED = re.compile(r"^(?P<module>[^\s;]+)\+0x(?P<offset>[0-9a-f]+)$")


def fde_table(path: Path) -> list[tuple[int, int]]:
    """(start, end) of every FDE of `path`'s .eh_frame, as pyelftools reads them."""
    from elftools.dwarf.callframe import FDE
    from elftools.elf.elffile import ELFFile

    with path.open("rb") as f:
        cfi = ELFFile(f).get_dwarf_info().EH_CFI_entries()
        return sorted(
            (e.header["initial_location"], e.header["initial_location"] + e.header["address_range"])
            for e in cfi
            if isinstance(e, FDE)
        )


def nm_functions(path: Path) -> dict[str, tuple[int, int]]:
    """Function name -> (address, size) as binutils' nm reads the unstripped file."""
    out = subprocess.run(["nm", "-S", str(path)], capture_output=True, text=True, check=True).stdout
    return {p[3]: (int(p[0], 16), int(p[1], 16)) for p in map(str.split, out.splitlines()) if len(p) == 4}


def load_base(pid: int, path: Path) -> int:
    """Where the PIE `path` is mapped in `pid` (its mapping of file offset 0)."""
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        cols = line.split()
        if len(cols) > 5 and cols[5] == str(path) and int(cols[2], 16) == 0:
            return int(cols[0].split("-")[0], 16)
    raise AssertionError(f"{path} is not mapped in {pid}")


@pytest.fixture
def start() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield lambda *argv: start_ready(list(argv), started)
    for proc in started:
        stop_contend(proc)


# ---- names, without BPF -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "shown"),
    [
        ("memcached+0x187a0", "memcached+0x187a0"),
        ("libc.so.6+0x8a2a0", "libc.so.6+0x8a2a0"),
        ("Foo::fingerprint(unsigned long) const [clone .isra.0]", "Foo::fingerprint [clone .isra.0]"),
        (
            "(anonymous namespace)::Table::fingerprint(unsigned long) const [clone .constprop.0]",
            "(anonymous namespace)::Table::fingerprint [clone .constprop.0]",
        ),
        ("Foo::bar() [clone .part.0] [clone .cold]", "Foo::bar [clone .part.0] [clone .cold]"),
        ("ObjectRegistry::onCreateItem(Item const*)", "ObjectRegistry::onCreateItem"),
        ("sync.(*Mutex).Lock", "sync.(*Mutex).Lock"),
        ("handle (server.py:10)", "handle"),
        ("finish_task_switch.isra.0_[k]", "finish_task_switch.isra.0"),
    ],
)
def test_a_frame_keeps_its_function_start_and_clone_note(frame: str, shown: str) -> None:
    """Tables and findings show code without a symbol by its function start, a clone with its note."""
    assert normalize(frame) == shown


def test_catalog_matching_sees_through_clones_and_data_offsets() -> None:
    """A clone of a catalog function is that function; a lock at an offset in its symbol is that lock."""
    assert (h := match_function("update_topkeys.part.0")) is not None and h.id == "topkeys"
    clone = "ObjectRegistry::onCreateItem(Item const*) [clone .isra.0]"
    assert (h := match_function(clone)) is not None and h.id == "item-counter"
    assert match_function("kvcached+0x1a2b") is None
    assert bare("pthread_mutex_lock@plt") == "pthread_mutex_lock" and is_wrapper("pthread_mutex_lock@plt")
    assert (h := match_lock("item_lock+0x8")) is not None and h.id == "item-lock"
    assert bare("memcached+0x187a0") == "memcached" and normalize("memcached+0x187a0") == "memcached+0x187a0"
    stack = ["main", "memcached+0x187a0", "pthread_mutex_lock", "futex_wait_[k]"]
    assert call_site(stack) == "memcached+0x187a0"


@pytest.mark.parametrize(
    "mangled",
    [
        "_ZNK12_GLOBAL__N_15Table11fingerprintEm.isra.0",
        "_ZNK5Table11fingerprintEm.constprop.0",
        "_ZN3Foo3barEv.part.0",
        "_ZN3Foo3barEv.cold",
        "_ZN14ObjectRegistry12onCreateItemEPK4Item",
    ],
)
def test_demangled_as_cxxfilt_with_the_clone_as_a_note(mangled: str) -> None:
    """libstdc++'s demangler, as c++filt prints it: `[clone .isra.0]` kept."""
    reference = subprocess.run(["c++filt", mangled], capture_output=True, text=True, check=True).stdout
    assert demangle(mangled) == reference.strip() != mangled
    if "." in mangled:
        assert demangle(mangled).endswith(f"[clone {mangled[mangled.index('.') :]}]")


def test_not_mangled_names_are_kept() -> None:
    assert demangle("update_topkeys.part.0") == "update_topkeys.part.0"
    assert demangle("_Znot_a_name") == "_Znot_a_name"


def test_function_start_is_the_covering_fde_of_debian_memcached() -> None:
    """Every address inside an FDE of the stripped memcached maps to that FDE's start; a gap to None."""
    if not MEMCACHED.is_file():
        pytest.skip("Debian's memcached is not installed: run scripts/provision.sh")
    table = fde_table(MEMCACHED)
    assert len(table) > 100
    for lo, hi in table:
        for pc in {lo, (lo + hi) // 2, hi - 1}:
            assert function_start(str(MEMCACHED), pc) == lo, hex(pc)
    gaps = [hi for (_, hi), (lo, _) in itertools.pairwise(table) if hi < lo]
    assert gaps and all(function_start(str(MEMCACHED), pc) is None for pc in gaps)


@pytest.mark.parametrize("binary", [MEMCACHED, Path("/usr/bin/sysbench"), Path("/usr/bin/redis-server")])
def test_plt_stubs_are_named_as_objdump_names_them(binary: Path) -> None:
    """A stripped binary's PLT stubs are `name@plt` at the addresses `objdump -d` gives them,
    and an address inside a stub is named by it, not by the FDE of the whole .plt."""
    if not binary.is_file():
        pytest.skip(f"{binary} is not installed: run scripts/provision.sh")
    out = subprocess.run(
        ["objdump", "-d", "-j", ".plt", "-j", ".plt.sec", str(binary)], capture_output=True, text=True
    )
    labels = (re.match(r"^([0-9a-f]+) <(.+@plt)>:$", line) for line in out.stdout.splitlines())
    reference = {int(m[1], 16): m[2] for m in labels if m}
    stubs = plt_stubs(str(binary))
    assert len(stubs) > 50 and {lo: name for lo, _, name in stubs} == reference
    lo, hi, name = stubs[len(stubs) // 2]
    assert plt_name(str(binary), lo + 5) == name and plt_name(str(binary), hi) != name


def stripped_build(tmp: Path, keep_unwind: bool) -> tuple[Path, dict[str, tuple[int, int]]]:
    """tests/programs/inline_hot.c built -O2, stripped (and without .eh_frame unless
    `keep_unwind`), with the unstripped build's function addresses."""
    full = tmp / "inline_hot.full"
    subprocess.run(["cc", "-O2", "-o", str(full), str(PROGRAMS / "inline_hot.c")], check=True, timeout=60)
    out = tmp / ("hot_fde" if keep_unwind else "hot_nofde")
    drop = [] if keep_unwind else ["--remove-section=.eh_frame", "--remove-section=.eh_frame_hdr"]
    subprocess.run(["strip", *drop, "-o", str(out), str(full)], check=True, timeout=60)
    return out, nm_functions(full)


@pytest.mark.parametrize("keep_unwind", [True, False])
def test_a_stripped_program_is_named_by_its_function_starts(
    tmp_path: Path, start: Callable[..., subprocess.Popen[bytes]], keep_unwind: bool
) -> None:
    """Without symbols an address inside hash_round is `prog+0x<hash_round>`, as nm of the
    unstripped build says; without .eh_frame it is its own offset, and the profile and
    report say it lies outside any function of the unwind table, and what would name it."""
    binary, funcs = stripped_build(tmp_path, keep_unwind)
    assert not nm_functions(binary)
    proc = start(binary, "60")
    addr, size = funcs["hash_round"]
    inside = addr + size // 2
    names = ProcessSymbols(proc.pid)
    names.refresh()
    name = names.function_name(load_base(proc.pid, binary) + inside)
    assert name == f"{binary.name}+0x{(addr if keep_unwind else inside):x}"
    assert names.module_function_name(str(binary), inside) == name  # as `--backend perf` asks
    profile = Profile(Target(pid=proc.pid, comm=binary.name), oncpu=[CpuStack(proc.pid, [name], 10)])
    (missing,) = missing_symbols(proc.pid, profile)
    assert (missing.module, missing.path, missing.names) == (binary.name, str(binary), "dynsym")
    assert (missing.functions, missing.outside_unwind) == ((1, []) if keep_unwind else (0, [name]))
    missing.fix = "FIX"
    profile.missing_symbols = [missing]
    text = render_text(profile)
    assert f"no symbols: {binary.name}" in text and "For names: FIX" in text.replace("\n    ", " ")
    assert ("outside any function" in text) is not keep_unwind
    (shown,) = to_json(profile)["missing_symbols"]
    assert shown["cpu_share"] == 1.0 and shown["outside_unwind"] == missing.outside_unwind


# ---- with BPF: Debian's memcached, a C++ clone ------------------------------------------------


def module_names(p: Profile) -> set[str]:
    names = {m.module for m in p.missing_symbols}
    return names | {Path(p.target.exe).name, "libc.so.6", "libevent-2.1.so.7.0.1", "libevent-2.1.so.7"}


def all_frames(p: Profile) -> set[str]:
    frames = {f for s in p.oncpu for f in s.frames} | {f for s in p.offcpu.stacks for f in s.frames}
    frames |= {f for w in p.offcpu.futex for f in w.frames}
    return frames | {a.function for a in p.addresses.samples}


def assert_nothing_named_after_a_module(p: Profile, report: dict, text: str, folded: set[str]) -> None:
    """No frame, table row, finding or flame-graph frame is a bare module name."""
    modules = module_names(p)
    assert not (all_frames(p) & modules), sorted(all_frames(p) & modules)
    assert not (folded & modules), sorted(folded & modules)
    rows = report["tables"]
    assert not {r["function"] for r in rows["functions"]} & modules
    assert not {r["call_site"] for r in rows["locks"]} & modules
    for f in report["findings"]:
        assert f["where"] not in modules and not set(f["sites"]) & modules, f["title"]
        assert not any(f["title"].endswith(f" {m}") or f" {m} " in f["title"] for m in modules), f["title"]
    table = text.split("TOP FUNCTIONS", 1)[1].split("\n\n")[0].splitlines()[3:]
    shown = [line.split(None, 2)[2].removesuffix(" *") for line in table if not line.startswith("  *")]
    assert not set(shown) & modules and len(shown) == len(set(shown)), shown


def folded_frames(profile_file: Path, tmp: Path, kind: str) -> tuple[set[str], Counter[str]]:
    """The frames of `kvprof flamegraph --kind KIND -o X.folded`, and its leaves by value."""
    out = tmp / f"{kind}.folded"
    done = kvprof("flamegraph", str(profile_file), "--kind", kind, "-o", str(out))
    assert done.returncode == 0, done.stderr
    frames: set[str] = set()
    leaves: Counter[str] = Counter()
    for stack, n in parse_folded(out.read_text()).items():
        frames |= set(stack)
        leaves[stack[-1]] += n
    return frames, leaves


def record_memcached(server: Server, out: Path, *args: str) -> Profile:
    """`kvprof record -d 5 ARGS` of memcached under kvload: 4 connections x 32 in flight,
    5 % sets, 10,000 keys."""
    load = ("--connections=4", "--batch-size=32", "--set-pct=5", "--num-items=10000", "--key-dist=uniform")
    with kvload(server, 25, *load):
        done = record(server.pid, out, "-d", "5", *args, timeout=300)
    assert done.returncode == 0, done.stderr
    return Profile.load(out)


def memcached_functions(profile: Profile) -> Counter[str]:
    """memcached's frames without a symbol, by on-CPU samples; each is an FDE's start (pyelftools)."""
    starts = {lo for lo, _ in fde_table(MEMCACHED)}
    ours: Counter[str] = Counter()
    for s in profile.oncpu:
        for f in s.frames:
            if (m := _UNNAMED.match(f)) and m["module"] == "memcached":
                assert int(m["offset"], 16) in starts, f
                ours[f] += s.count
    assert len(ours) >= 5, ours  # memcached's own code ran, in several functions
    return ours


@pytest.mark.bpf
def test_debian_memcached_is_named_by_function_starts_in_every_view(
    memcached_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """Debian's stripped memcached -t 4 under kvload: its code is named by FDE starts (pyelftools'
    table) in the profile, report, --json and flame graphs; one function is one row; the
    report names the module without symbols and its debug package and debuginfod."""
    if not MEMCACHED.is_file():
        pytest.skip("Debian's memcached is not installed: run scripts/provision.sh")
    out = tmp_path / "memcached.json.gz"
    profile = record_memcached(memcached_factory("-t", "4"), out)
    ours = memcached_functions(profile)
    (mc,) = [m for m in profile.missing_symbols if m.module == "memcached"]
    assert mc.path == str(MEMCACHED) and mc.names in ("none", "dynsym") and mc.functions >= len(ours)
    assert mc.outside_unwind == [] and "memcached-dbgsym" in mc.fix and "DEBUGINFOD_URLS" in mc.fix
    text = kvprof("report", str(out)).stdout
    report = json.loads(kvprof("report", "--json", str(out)).stdout)
    folded = set()
    for kind in ("cpu", "offcpu"):
        folded |= folded_frames(out, tmp_path, kind)[0]
    assert_nothing_named_after_a_module(profile, report, text, folded)
    assert "no symbols: memcached" in text and "memcached-dbgsym" in text.replace("\n    ", " ")
    assert {m["module"] for m in report["missing_symbols"]} >= {"memcached"}
    # the samples of one function are one row: its function start, as in the folded leaves
    top = max(ours, key=lambda f: ours[f])
    assert sum(r["function"] == top for r in report["tables"]["functions"]) == 1
    assert sum(line.endswith(f"  {top}") for line in text.splitlines()) == 1


@pytest.mark.bpf
@pytest.mark.skipif(shutil.which("perf") is None, reason="no perf (linux-perf): run scripts/provision.sh")
def test_perf_backend_names_debian_memcached_by_function_starts(
    memcached_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """--backend perf names memcached's code without symbols by the same FDE starts."""
    if not MEMCACHED.is_file():
        pytest.skip("Debian's memcached is not installed: run scripts/provision.sh")
    profile = record_memcached(memcached_factory("-t", "4"), tmp_path / "perf.json", "--backend", "perf")
    assert profile.status.collectors["oncpu"] == "ok (perf backend)"
    memcached_functions(profile)
    assert "memcached" not in all_frames(profile)


def build_clone(tmp: Path) -> Path:
    if GXX is None:
        pytest.skip("no g++ (Debian's g++-12): run scripts/provision.sh")
    out = tmp / "clone_method"
    cmd = [GXX, "-O2", "-o", str(out), str(PROGRAMS / "clone_method.cpp")]
    subprocess.run(cmd, check=True, timeout=120)
    return out


@pytest.mark.bpf
def test_a_cpp_clone_is_demangled_in_every_view(
    tmp_path: Path, start: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """The method GCC 12 -O2 emits only as `...fingerprintEm.constprop.0` (nm says so) is shown
    `(anonymous namespace)::Table::fingerprint(unsigned long) const [clone .constprop.0]` in
    the profile, the report, --json, the folded flame graph, pprof and top's tables."""
    binary = build_clone(tmp_path)
    clones = [n for n in nm_functions(binary) if "fingerprint" in n]
    assert clones and all(re.search(r"\.(isra|constprop)\.\d+$", n) for n in clones), clones
    proc = start(binary, "60")
    out = tmp_path / "clone.json"
    done = record(proc.pid, out, "-d", "3")
    assert done.returncode == 0, done.stderr
    full = demangle(clones[0])
    assert full.startswith("(anonymous namespace)::Table::fingerprint(unsigned long) const [clone .")
    short = normalize(full)  # what tables show: no parameters, the clone's note kept
    assert short.endswith("]") and "[clone ." in short
    profile = Profile.load(out)
    frames = all_frames(profile)
    assert full in frames and not [f for f in frames if f.startswith("_Z")]
    text = kvprof("report", str(out)).stdout
    report = json.loads(kvprof("report", "--json", str(out)).stdout)
    assert short in text and "_Z" not in text
    assert report["tables"]["functions"][0]["function"] == full
    assert any(f["where"] == short for f in report["findings"]), [f["where"] for f in report["findings"]]
    frames, leaves = folded_frames(out, tmp_path, "cpu")
    assert leaves.most_common(1)[0][0] == full and not [f for f in frames if f.startswith("_Z")]
    msg = pprof_message(profile, "cpu")
    names = {msg.string_table[f.name] for f in msg.function}
    assert full in names and not [n for n in names if n.startswith("_Z")]
    tl = Timeline()
    tl.add(Sample(profile.window.duration_s, profile))
    frame = build_frame(tl, "t", "c", "replay")
    assert stack_rows(frame)[0].function == full
    assert any(r.where == short for r in finding_rows(frame))
