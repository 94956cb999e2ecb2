"""A Go program (tests/programs/gomutex: goroutines fighting over one sync.Mutex), built
with Debian's golang-go with and without `-ldflags=-s`: its functions are named with
their Go symbols from .gopclntab when there is no .symtab, its stacks are complete
(the pc tables stand in for the dropped .debug_frame), its futex waits belong to its
threads, and the profile says that goroutines are multiplexed over those threads."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import KVPROF, REPO, record

from kvprof.collect.elf import ElfFile
from kvprof.collect.gosym import GO_NOTE, read_pclntab
from kvprof.model.profile import Profile

SOURCE = REPO / "tests" / "programs" / "gomutex" / "main.go"


@pytest.fixture(scope="module", params=["stripped", "symtab"])
def go_binary(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gomutex built with `go build` (-ldflags=-s: no .symtab, no DWARF)."""
    if shutil.which("go") is None:
        pytest.skip("no Go toolchain: scripts/provision.sh installs golang-go")
    tmp = tmp_path_factory.mktemp("go")
    out = tmp / f"gomutex-{request.param}"
    flags = ["-ldflags=-s"] if request.param == "stripped" else []
    env = {**os.environ, "GOCACHE": str(tmp / "cache"), "GOPATH": str(tmp / "path"), "GOFLAGS": ""}
    subprocess.run(["go", "build", *flags, "-o", str(out), str(SOURCE)], check=True, timeout=300, env=env,
                   cwd=SOURCE.parent)  # fmt: skip
    return out


def test_pclntab_names(go_binary: Path) -> None:
    """.gopclntab gives the Go names; where .symtab is there too, both agree on main's functions."""
    elf = ElfFile(go_binary)
    tab = read_pclntab(str(go_binary))
    assert tab is not None
    names = {f.start: f.name for f in tab.funcs}
    assert "main.hotSpin" in names.values() and "sync.(*Mutex).lockSlow" in names.values()
    symtab = {s.value: s.name for s in elf.functions() if s.name.startswith("main.")}
    assert (elf.section(".symtab") is None) == go_binary.name.endswith("stripped")
    for addr, name in symtab.items():
        assert names.get(addr) == name


@pytest.fixture
def gomutex(go_binary: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([str(go_binary), "120"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.bpf
def test_go_program_recorded(gomutex: subprocess.Popen[str], tmp_path: Path) -> None:
    """The hot function is main.hotSpin under main.worker and runtime.goexit (a complete
    stack); the futex waits are the Go program's threads'; the profile notes the goroutines."""
    out = tmp_path / "go.json.gz"
    done = record(gomutex.pid, out, "-d", "3", "--collectors", "oncpu,offcpu", timeout=240)
    assert done.returncode == 0, done.stderr
    threads = {int(t) for t in os.listdir(f"/proc/{gomutex.pid}/task")}
    p = Profile.load(out)
    hot = [s for s in p.oncpu if s.frames and s.frames[-1] == "main.hotSpin"]
    assert sum(s.count for s in hot) > sum(s.count for s in p.oncpu) / 4
    # .symtab names the assembly root runtime.goexit.abi0, .gopclntab runtime.goexit
    assert any(s.frames[0].startswith("runtime.goexit") and s.frames[1:3] == ["main.worker", "main.hotSpin"]
               for s in hot)  # fmt: skip
    assert p.offcpu.futex and {w.tid for w in p.offcpu.futex} <= threads
    assert any(f.startswith("runtime.futex") for w in p.offcpu.futex for f in w.frames)
    assert GO_NOTE in p.status.notes
    report = subprocess.run([*KVPROF, "report", str(out)], capture_output=True, text=True, timeout=120)
    assert "main.hotSpin" in report.stdout and "goroutines are multiplexed" in report.stdout
