"""Function names from debug files as perf finds them (build-id, .gnu_debuglink
with its CRC, .gnu_debugdata), glibc's internals named in a real recording,
`doctor` naming the package for a module without debug info, and a target in
its own mount and PID namespace recorded from the host."""

from __future__ import annotations

import lzma
import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import CONTEND_SOURCE, TESTS, kvprof, record, start_ready, stop_contend

from kvprof.collect.debuginfo import Symbols, module_symbols
from kvprof.model.profile import Profile
from kvprof.system.debugpkg import debug_package
from kvprof.system.doctor import check_module

pytest.importorskip("elftools", reason="pyelftools (python3-pyelftools) is missing: run scripts/provision.sh")

GLIBC_LOCK = TESTS / "programs" / "glibc_lock.c"
LIBC = Path("/usr/lib/x86_64-linux-gnu/libc.so.6")
# glibc's functions that take a contended mutex, which only its debug file names
GLIBC_INTERNALS = {"__lll_lock_wait", "__pthread_mutex_unlock_usercnt", "__pthread_mutex_lock_full"}


def _run(*cmd: str | Path) -> None:
    subprocess.run([str(c) for c in cmd], check=True, timeout=60, capture_output=True)


def _nm(path: Path) -> dict[str, int]:
    """name -> address of the file's defined symbols, as binutils' nm reads them."""
    out = subprocess.run(["nm", str(path)], capture_output=True, text=True, timeout=60).stdout
    return {p[2]: int(p[0], 16) for p in (line.split() for line in out.splitlines()) if len(p) == 3}


@pytest.fixture(scope="module")
def glibc_lock(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/programs/glibc_lock.c, built with -g."""
    out = tmp_path_factory.mktemp("debuginfo") / "glibc_lock"
    _run("cc", "-O1", "-g", "-pthread", "-o", out, GLIBC_LOCK)
    return out


@pytest.fixture
def start() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start a program that prints `ready` and runs until its stdin closes; all stopped at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def run(*argv: str | Path) -> subprocess.Popen[bytes]:
        return start_ready(list(argv), started)

    yield run
    for proc in started:
        stop_contend(proc)


def _libc_debug_file() -> Path | None:
    syms = module_symbols(str(LIBC))
    return Path(syms.debug_file) if syms.source == "build-id" else None


# ---- finding the debug file ---------------------------------------------------------------


def test_build_id_debug_file_names_glibc_internals() -> None:
    """With libc6-dbg, libc's functions that .dynsym lacks are named from its build-id debug file."""
    debug = _libc_debug_file()
    if debug is None:
        pytest.skip("libc6-dbg is not installed (scripts/provision.sh installs it)")
    assert str(debug).startswith("/usr/lib/debug/.build-id/")
    at = _nm(debug)["__lll_lock_wait"]
    syms = module_symbols(str(LIBC))
    assert syms.full and syms.function(at + 4) == (at, syms.function(at)[1], "__lll_lock_wait")  # type: ignore[index]
    assert syms.function(_nm(debug)["___pthread_mutex_lock"])[2] == "pthread_mutex_lock"  # type: ignore[index]


def test_debuglink_is_read_only_with_a_matching_crc(glibc_lock: Path, tmp_path: Path) -> None:
    """A stripped binary finds its debug file through .gnu_debuglink in .debug/; a
    debug file whose CRC32 differs (another build) is not used."""
    good, other = tmp_path / "good", tmp_path / "other"
    for where in (good, other):
        (where / ".debug").mkdir(parents=True)
        _run("objcopy", "--only-keep-debug", glibc_lock, where / ".debug" / "glibc_lock.debug")
    debug = good / ".debug" / "glibc_lock.debug"
    _run("objcopy", "--strip-all", f"--add-gnu-debuglink={debug}", glibc_lock, good / "glibc_lock")
    shutil.copy(good / "glibc_lock", other / "glibc_lock")
    with (other / ".debug" / "glibc_lock.debug").open("ab") as f:
        f.write(b"another build")
    worker = _nm(glibc_lock)["worker"]
    syms = module_symbols(str(good / "glibc_lock"))
    assert (syms.source, syms.debug_file) == ("debuglink", str(debug))
    assert syms.function(worker)[2] == "worker"  # type: ignore[index]
    syms = module_symbols(str(other / "glibc_lock"))
    assert syms.source == "dynsym" and syms.function(worker) is None


def test_minidebuginfo_names_static_functions(glibc_lock: Path, tmp_path: Path) -> None:
    """.gnu_debugdata (an xz-compressed ELF with a .symtab, as Fedora ships) names what .dynsym lacks."""
    mini = tmp_path / "mini"
    _run("objcopy", "--only-keep-debug", glibc_lock, mini)
    xz = tmp_path / "mini.xz"
    xz.write_bytes(lzma.compress(mini.read_bytes()))
    stripped = tmp_path / "glibc_lock"
    _run("objcopy", "--strip-all", f"--add-section=.gnu_debugdata={xz}", glibc_lock, stripped)
    syms = module_symbols(str(stripped))
    assert syms.source == "gnu_debugdata"
    assert syms.function(_nm(glibc_lock)["worker"])[2] == "worker"  # type: ignore[index]


# ---- doctor ---------------------------------------------------------------------------------


def test_doctor_names_the_debug_package() -> None:
    """glibc's debug info is Debian's libc6-dbg; another package's is <package>-dbgsym."""
    if shutil.which("dpkg-query") is None:
        pytest.skip("not a Debian system (no dpkg-query)")
    assert debug_package(str(LIBC)) == "libc6-dbg"
    check = check_module("libc.so.6", str(LIBC), Symbols(source="dynsym"), True)
    assert check.status == "warn" and check.fix == "apt-get install libc6-dbg"
    zlib = next(Path("/usr/lib/x86_64-linux-gnu").glob("libz.so.1.*"), None)
    if zlib is not None:
        assert debug_package(str(zlib)) == "zlib1g-dbgsym"


def test_doctor_says_a_module_has_no_debug_info(
    glibc_lock: Path, tmp_path: Path, start: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """A stripped binary whose .gnu_debuglink names a file that is not there: doctor -p
    warns about that module with the fix, and says where libc's names come from."""
    gone = tmp_path / "gone.debug"
    _run("objcopy", "--only-keep-debug", glibc_lock, gone)
    stripped = tmp_path / "stripped_lock"
    _run("objcopy", "--strip-all", f"--add-gnu-debuglink={gone}", glibc_lock, stripped)
    gone.unlink()
    proc = start(stripped, "60")
    r = kvprof("doctor", "-p", str(proc.pid))
    assert r.returncode == 0, r.stderr
    lines = re.sub(r"\n {6}(?!fix:)", " ", r.stdout).splitlines()  # a check's wrapped lines as one
    mine = [line for line in lines if line.startswith("warn  debug info: stripped_lock:")]
    assert len(mine) == 1 and "no debug file" in mine[0], r.stdout
    fix = lines[lines.index(mine[0]) + 1].strip()
    assert fix.startswith("fix:") and "-g" in fix, r.stdout
    if _libc_debug_file() is not None:
        libc = "ok    debug info: libc.so.6: function names from build-id"
        assert any(line.startswith(libc) for line in lines), r.stdout


# ---- real recordings ------------------------------------------------------------------------


@pytest.mark.bpf
def test_glibc_lock_is_named_inside_glibc(
    glibc_lock: Path, tmp_path: Path, start: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """A mutex contended inside glibc: its futex waits stop in __lll_lock_wait under
    pthread_mutex_lock, and the lock word's writers in the cache-line table are
    glibc's functions by name, none `libc.so.6+0x...`."""
    if _libc_debug_file() is None:
        pytest.skip("libc6-dbg is not installed (scripts/provision.sh installs it)")
    proc = start(glibc_lock, "60")
    out = tmp_path / "lock.json"
    r = record(proc.pid, out, "-d", "4", "--collectors", "oncpu,offcpu,regsample")
    assert r.returncode == 0, r.stderr
    p = Profile.load(out)
    waits = [f.frames for f in p.offcpu.futex if f.waits]
    assert any(f[-3:] == ["worker", "pthread_mutex_lock", "__lll_lock_wait"] for f in waits), waits[:5]
    functions = Counter(s.function for s in p.addresses.samples if s.symbol == "lock")
    assert functions and not [f for f in functions if f.startswith("libc.so.6+")], functions
    assert set(functions) <= {"pthread_mutex_lock", "pthread_mutex_unlock", *GLIBC_INTERNALS}, functions
    named = {f for s in p.oncpu for f in s.frames}
    assert named & GLIBC_INTERNALS, sorted(named)


@pytest.mark.bpf
def test_a_target_in_its_own_namespaces_is_recorded_from_the_host(
    tmp_path: Path, start: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """A program in its own mount and PID namespace, its binary on a tmpfs only it
    sees: `record -p HOSTPID` names its hot function with complete stacks, and the
    profile and report give its PID in its own namespace."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare (util-linux)")
    binary = tmp_path / "contend"
    _run("cc", "-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", binary, CONTEND_SOURCE)
    box = tmp_path / "box"
    box.mkdir()
    inside = f"mount -t tmpfs tmpfs {box} && cp {binary} {box}/contend && exec {box}/contend 60"
    proc = start("unshare", "--mount", "--pid", "--fork", "--kill-child", "sh", "-c", inside)
    pid = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
    assert os.readlink(f"/proc/{pid}/exe") == f"{box}/contend" and not (box / "contend").exists()
    out = tmp_path / "box.json"
    r = record(pid, out, "-d", "3", "--collectors", "oncpu,offcpu")
    assert r.returncode == 0, r.stderr
    p = Profile.load(out)
    assert p.target.ns_pid == 1
    hot = [s for s in p.oncpu if s.frames[-1] == "spin_hot_function"]
    assert sum(s.count for s in hot) > sum(s.count for s in p.oncpu) / 2, p.oncpu[:5]
    assert all(s.frames[:3] == ["clone3", "start_thread", "hot_main"] for s in hot), hot[:3]
    if _libc_debug_file() is not None:  # glibc's internals named through the target's root
        waits = [f.frames for f in p.offcpu.futex if f.waits]
        assert any(f[-2:] == ["pthread_mutex_lock", "__lll_lock_wait"] for f in waits), waits[:5]
    report = kvprof("report", str(out))
    assert f"PID {pid} (1 in its namespace)" in report.stdout.splitlines()[0], report.stdout[:300]
