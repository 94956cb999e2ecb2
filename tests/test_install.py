"""kvprof as a tool installed on a machine that is not its repository's: the wheel
`pip wheel` builds carries every file kvprof loads; installed into a fresh venv
made with --system-site-packages (Debian's BCC) and run from `/` with the checkout
hidden under an empty tmpfs in a private mount namespace, `doctor`, `record` (on
Debian's memcached and on kvcached from `make install`, every collector attached),
`report`, `flamegraph` and `top` work; and `record` started in the background of a
script, SIGINT ignored as the shell leaves it, stops on SIGINT and writes what it has.

The fresh venv gets the wheel with `pip install --no-deps --no-index`: its PyPI
dependencies (textual, rich, pyperf, ...) are copied from the test's own venv into
the test's folder and put on its path by a .pth file, so the test needs no network
and no pip download, and the checkout (where that venv lives) can still be hidden.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from support import KVPROF, REPO, bpf_unavailable, kvload, wait_until

from kvprof import __version__
from kvprof.collect import PROBE_FILES, PROBES_DIR
from kvprof.model.profile import Profile
from kvprof.system.servers import Server, free_port, start_kvcached, start_memcached

SOURCES = ("pyproject.toml", "README.md", "kvprof")  # what `pip wheel` reads of the checkout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kvprof's wheel, built offline by the test venv's pip and setuptools from a copy of
    the checkout's sources (setuptools' build/ in the checkout could hold stale files)."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-q", "-w", str(root / "dist"), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (found,) = (root / "dist").glob("kvprof-*.whl")
    return found


def test_probe_files_are_every_program_and_header() -> None:
    """PROBE_FILES (what doctor checks) names every program and header of kvprof/probes/."""
    on_disk = {p.name for p in PROBES_DIR.iterdir() if p.name.endswith((".bpf.c", ".h"))}
    assert sorted(on_disk) == sorted(PROBE_FILES)


def test_the_wheel_holds_every_file_kvprof_loads(wheel: Path) -> None:
    """Every program and header of kvprof/probes/, the kvs provider and the hotspot catalog."""
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f"kvprof/probes/{n}" for n in (*PROBE_FILES, "kvs.d")} | {"kvprof/analysis/hotspots.toml"}
    assert not wanted - names, sorted(wanted - names)


# ---- installed, with the checkout hidden ------------------------------------------------


def _dependencies() -> list[importlib.metadata.Distribution]:
    """kvprof's run-time requirements, and theirs, that this venv (not the system) holds."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [Requirement(r) for r in importlib.metadata.requires("kvprof") or []]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            dist = importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if dist.metadata["Name"] in found:
            continue
        found[dist.metadata["Name"]] = dist
        todo += [Requirement(r) for r in dist.requires or []]
    venv = Path(sys.prefix).resolve()
    return [d for d in found.values() if venv in Path(str(d.locate_file(""))).resolve().parents]


def _copy_dependencies(site: Path, bin_dir: Path) -> None:
    for dist in _dependencies():
        for file in dist.files or []:
            source = Path(str(dist.locate_file(file)))
            parts = Path(file).parts
            dest = bin_dir / parts[-1] if ".." in parts and "bin" in parts else site / file
            if source.is_file():
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest)


@dataclass
class Installed:
    root: Path
    venv: Path
    prefix: Path  # `make install PREFIX=`: kvcached, kvload, kvprof-atomics in prefix/bin

    def env(self) -> dict[str, str]:
        path = f"{self.venv / 'bin'}:{self.prefix / 'bin'}:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        return {"PATH": path, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "xterm-256color"}

    def hidden(self, *argv: str, cover: Path = REPO) -> list[str]:
        """argv run from / in a mount namespace of its own where `cover` is an empty tmpfs."""
        script = 'mount -t tmpfs tmpfs "$1" && shift && cd / && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(cover), *argv]

    def run(self, *argv: str, timeout: float = 120, cover: Path = REPO) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.hidden(*argv, cover=cover), capture_output=True, text=True, timeout=timeout, env=self.env()
        )


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    why = bpf_unavailable()
    if why is not None:
        pytest.skip(why)
    if shutil.which("unshare") is None:
        pytest.skip("no unshare (util-linux)")
    root = tmp_path_factory.mktemp("installed")
    venv = root / "venv"
    subprocess.run(
        ["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120
    )
    pip = [
        str(venv / "bin" / "pip"),
        "install",
        "--no-deps",
        "--no-index",
        "--disable-pip-version-check",
        "-q",
    ]
    done = subprocess.run([*pip, str(wheel)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (site,) = (venv / "lib").glob("python3*/site-packages")
    deps = root / "deps"
    _copy_dependencies(deps, venv / "bin")
    (site / "kvprof-test-deps.pth").write_text(f"{deps}\n")
    prefix = root / "prefix"
    made = subprocess.run(
        ["make", "-s", "-C", str(REPO / "server"), "install", f"PREFIX={prefix}"],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    yield Installed(root, venv, prefix)


def test_the_checkout_is_hidden_and_kvprof_is_the_wheels(installed: Installed) -> None:
    """The test's own premise: inside, the checkout is empty and kvprof comes from the venv."""
    code = "import kvprof, os, sys; print(kvprof.__file__); print(os.listdir(sys.argv[1]))"
    done = installed.run(str(installed.venv / "bin" / "python"), "-c", code, str(REPO))
    assert done.returncode == 0, done.stderr
    where, listing = done.stdout.splitlines()
    assert where.startswith(str(installed.venv)) and listing == "[]"


def test_doctor(installed: Installed) -> None:
    """doctor passes, its BPF programs found in the installed package."""
    done = installed.run("kvprof", "doctor")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"BPF programs: {len(PROBE_FILES)} files in {installed.venv}" in " ".join(done.stdout.split())


def test_doctor_fails_without_the_bpf_programs(installed: Installed) -> None:
    """With the package's kvprof/probes/ emptied, doctor FAILs and says what is missing."""
    (probes,) = installed.venv.glob("lib/python3*/site-packages/kvprof/probes")
    done = installed.run("kvprof", "doctor", cover=probes)
    assert done.returncode == 1, done.stdout + done.stderr
    text = " ".join(done.stdout.split())
    assert f"FAIL BPF programs: {len(PROBE_FILES)} of kvprof's files missing from {probes}" in text


def _record(installed: Installed, pid: int, out: Path, seconds: str) -> Profile:
    done = installed.run("kvprof", "record", "-p", str(pid), "-d", seconds, "-o", str(out), timeout=180)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    profile = Profile.load(out)
    assert profile.kvprof_version == __version__
    return profile


def test_record_memcached(installed: Installed, tmp_path: Path) -> None:
    """Debian's memcached: the generic collectors attach; the kvs ones say why not."""
    with start_memcached() as server:
        profile = _record(installed, server.pid, tmp_path / "memcached.json.gz", "2")
    states = profile.status.collectors
    assert states["oncpu"] == "ok" and states["offcpu"] == "ok", states
    assert states["locks"].startswith("not applicable: no kvs probes"), states


@pytest.fixture(scope="module")
def kvcached_profile(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recording of kvcached as `make install` put it, under load."""
    out = tmp_path_factory.mktemp("kvcached") / "kvcached.json.gz"
    server: Server = start_kvcached(["-t", "2"], binary=installed.prefix / "bin" / "kvcached")
    with server, kvload(server, 60):
        _record(installed, server.pid, out, "3")
    return out


def test_record_kvcached_attaches_every_collector(kvcached_profile: Path) -> None:
    """kvcached from `make install`: every collector attached, the kvs ones too, with data."""
    profile = Profile.load(kvcached_profile)
    assert profile.target.kvs_probes
    states = profile.status.collectors
    assert set(states) >= {"oncpu", "offcpu", "locks", "cachelines", "requests", "regsample"}, states
    assert all(s == "ok" for s in states.values()), states
    assert profile.requests and profile.cachelines and profile.oncpu


def test_report(installed: Installed, kvcached_profile: Path) -> None:
    """report names the version that recorded the profile, in text and in --json."""
    text = installed.run("kvprof", "report", str(kvcached_profile))
    assert text.returncode == 0, text.stderr
    assert f"recorded by: kvprof {__version__}" in text.stdout and "FINDINGS" in text.stdout
    data = installed.run("kvprof", "report", str(kvcached_profile), "--json")
    assert data.returncode == 0, data.stderr
    assert json.loads(data.stdout)["kvprof_version"] == __version__


def test_flamegraph(installed: Installed, kvcached_profile: Path, tmp_path: Path) -> None:
    """flamegraph writes an SVG with kvcached's worker frames."""
    out = tmp_path / "cpu.svg"
    done = installed.run("kvprof", "flamegraph", str(kvcached_profile), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_text().lstrip().startswith("<?xml") and "worker_main" in out.read_text()


def _tmux(socket: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(("end", "expected"), [("q", 0), ("SIGINT", 130)])
def test_top_in_tmux(installed: Installed, tmp_path: Path, end: str, expected: int) -> None:
    """top on kvcached in a 100x30 tmux pane: every collector attached, then `q` quits it
    with status 0, or a SIGINT (not a key: raw mode) with status 130."""
    if shutil.which("tmux") is None:
        pytest.skip("no tmux (scripts/provision.sh installs it)")
    socket, status = f"kvprof-install-{os.getpid()}", tmp_path / "status"
    server = start_kvcached(["-t", "2"], binary=installed.prefix / "bin" / "kvcached")
    with server, kvload(server, 60):
        env = [f"{k}={v}" for k, v in installed.env().items()]
        argv = shlex.join(["env", *env, *installed.hidden("kvprof", "top", "-p", str(server.pid))])
        _tmux(socket, "new-session", "-d", "-x", "100", "-y", "30", f"{argv}; echo $? >{status}")
        try:
            shown = wait_until(lambda: "collectors ✓" in _tmux(socket, "capture-pane", "-p").stdout, 90)
            screen = _tmux(socket, "capture-pane", "-p").stdout
            assert shown, screen
            assert "kvcached PID" in screen and "live" in screen, screen
            if end == "q":
                _tmux(socket, "send-keys", "q")
            else:  # the pane's shell runs kvprof as its one child (env, unshare and sh exec it)
                shell = _tmux(socket, "display-message", "-p", "#{pane_pid}").stdout.strip()
                (child,) = Path(f"/proc/{shell}/task/{shell}/children").read_text().split()
                os.kill(int(child), signal.SIGINT)
            ended = wait_until(lambda: status.exists() and status.read_text().strip() != "", 30)
            assert ended, _tmux(socket, "capture-pane", "-p").stdout
            assert status.read_text().strip() == str(expected)
        finally:
            _tmux(socket, "kill-server")


# ---- started in the background of a script ---------------------------------------------


def _in_the_background(args: str, pid: int, ready: str, log: Path) -> tuple[int, float]:
    """`kvprof ARGS &` in `bash -c` (SIGINT ignored, as a shell leaves a background job),
    sent SIGINT once its log says `ready`: (its exit status, seconds it took to end)."""
    assert _background_ignores_sigint(), "bash did not start its job with SIGINT ignored: nothing to test"
    pid_file = log.with_suffix(".pid")
    script = f"{' '.join(KVPROF)} {args} 2>{log} & echo $! >{pid_file}; wait $!"
    shell = subprocess.Popen(["bash", "-c", script, "bash", str(pid)], cwd=REPO)
    try:
        said = wait_until(lambda: log.exists() and ready in log.read_text(), 90)
        assert said, log.read_text() if log.exists() else "no log"
        os.kill(int(pid_file.read_text()), signal.SIGINT)
        sent = time.monotonic()
        status = shell.wait(50)  # well inside the 60 s or more it was asked for
        return status, time.monotonic() - sent
    finally:
        if shell.poll() is None:
            shell.kill()
            shell.wait()


def test_record_in_the_background_stops_on_sigint(tmp_path: Path) -> None:
    """`kvprof record -p PID -d 60 &` stops soon after a SIGINT, exits 130 and writes what
    it collected, marked as stopped early."""
    why = bpf_unavailable()
    if why is not None:
        pytest.skip(why)
    out, log = tmp_path / "bg.json.gz", tmp_path / "record.log"
    with start_memcached() as server:
        status, took = _in_the_background(f"record -p $1 -d 60 -o {out}", server.pid, "collecting", log)
    assert status == 130, log.read_text()
    assert took < 30, f"stopped {took:.1f} s after SIGINT"
    with gzip.open(out, "rt") as f:
        warnings = json.load(f)["status"]["warnings"]
    assert any(w.startswith("stopped early by SIGINT") for w in warnings), warnings


def test_exporter_in_the_background_stops_on_sigint(tmp_path: Path) -> None:
    """`kvprof exporter -p PID &` detaches on a SIGINT and exits 0, its normal end."""
    why = bpf_unavailable()
    if why is not None:
        pytest.skip(why)
    log = tmp_path / "exporter.log"
    with start_memcached() as server:
        args = f"exporter -p $1 --listen 127.0.0.1:{free_port()}"
        status, took = _in_the_background(args, server.pid, "SIGTERM or Ctrl-C detaches", log)
    assert status == 0, log.read_text()
    assert took < 30, f"stopped {took:.1f} s after SIGINT"
    assert "kvprof exporter: detached after" in log.read_text()


def _background_ignores_sigint() -> bool:
    """Whether `bash -c` starts a background job with SIGINT ignored (its SigIgn mask)."""
    line = subprocess.run(
        ["bash", "-c", "grep ^SigIgn: /proc/self/status & wait"], capture_output=True, text=True, timeout=10
    ).stdout
    return bool(int(line.split()[1], 16) >> (signal.SIGINT - 1) & 1)
