"""What several test modules share: the kvprof command runner, the servers under
test (clean exit, memcached's flags, RSS), the raw wire client (tests/wire_client.py),
kvload under a test, waiting, the probe semaphores and what we hold in the kernel,
the contend workload, running as an unprivileged user, the SVG reader, the
Prometheus exposition parser, the `kvprof top` app and the hand-made profiles.

Test modules and conftest.py import from here; conftest.py holds only the
fixtures and hooks; no test module imports another or conftest.py
(tests/test_layers.py checks it).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ctypes
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest
from wire_client import Value, Wire

from kvprof.collect import CollectOptions
from kvprof.model.profile import (
    CacheLineStat,
    CpuStack,
    FutexWait,
    Host,
    LineThread,
    LockHold,
    LockStack,
    LockStat,
    OffCpu,
    OffCpuStack,
    Profile,
    RequestStat,
    Status,
    Target,
    ThreadHolds,
    ThreadInfo,
    ThreadWaits,
    Window,
)
from kvprof.system.servers import Server, die_with_parent, kvload_binary

if TYPE_CHECKING:
    from textual.pilot import Pilot

    from kvprof.tui.app import TopApp
    from kvprof.tui.sources import Source

REPO = Path(__file__).resolve().parent.parent  # the checkout the tests run from

__all__ = ["Value", "Wire"]  # the wire client, shared from here like everything else

UPROBE_EVENTS = Path("/sys/kernel/tracing/uprobe_events")

TESTS = Path(__file__).resolve().parent
GOLDEN = TESTS / "golden"
FIXTURES = TESTS / "fixtures"
SMALL = GOLDEN / "flame-small.json"  # a hand-made profile for the flame-graph exports
TOP_BASELINE = FIXTURES / "top-baseline.json"  # a recorded kvcached baseline profile

# ---- running kvprof --------------------------------------------------------------------

# `kvprof ...` as a user runs it: this tree's package under the test's interpreter
KVPROF = [sys.executable, "-m", "kvprof"]


def kvprof(
    *args: str, timeout: float = 120, cwd: Path | str = REPO, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `kvprof ARGS` to the end, capturing both streams (never raises on its status)."""
    return subprocess.run(
        [*KVPROF, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env, check=False
    )


def record_args(pid: int, out: Path | str, *args: str) -> list[str]:
    """`record -p PID -o OUT ARGS`: what follows KVPROF for a test that starts record itself."""
    return ["record", "-p", str(pid), "-o", str(out), *args]


def record(
    pid: int, out: Path, *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`kvprof record -p PID -o OUT -q ARGS` to the end."""
    return kvprof(*record_args(pid, out, "-q", *args), timeout=timeout, env=env)


def start_record(pid: int, out: Path | str, *args: str) -> subprocess.Popen[str]:
    """`kvprof record -p PID -o OUT ARGS` started, its stderr piped for the test to read."""
    return subprocess.Popen([*KVPROF, *record_args(pid, out, *args)], stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def reaped(proc: subprocess.Popen[Any]) -> Iterator[subprocess.Popen[Any]]:
    """`proc` for the block; killed and waited for after it if still running (when the block failed)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def thread_nices(pid: int) -> dict[int, int]:
    """tid -> nice of every thread of `pid` (/proc/PID/task/TID/stat)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        out[int(tid)] = int(fields[16])
    return out


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, step: float = 0.05) -> bool:
    """Poll `predicate` until true or `timeout` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


# ---- servers under test ----------------------------------------------------------------

SANITIZER_REPORT = re.compile(r"ERROR: (Address|Leak)Sanitizer|runtime error:|SUMMARY: \w+Sanitizer")


def assert_clean_exit(server: Server) -> None:
    """Stop `server`: it exits 0 and its log holds no sanitizer report."""
    status = server.stop()
    log = server.log()
    report = SANITIZER_REPORT.search(log)
    assert report is None, f"sanitizer report from {server.argv}:\n{log[-4000:]}"
    assert status == 0, f"{server.argv} exited with {status}:\n{log[-2000:]}"


def _kilobytes(size: str) -> int:
    """A size as -I takes it (`65536`, `64k`, `1m`) in KB."""
    scale = {"k": 1024, "m": 1024 * 1024}.get(size[-1].lower())
    return (int(size[:-1]) * scale if scale else int(size)) // 1024


def memcached_args(args: tuple[str, ...] | list[str]) -> list[str]:
    """kvcached flags as memcached's; skips the calling test on a kvcached-only flag."""
    out: list[str] = []
    threads, conns = 4, None
    it = iter(args)
    for flag in it:
        if flag in ("-t", "-m", "-I"):
            value = next(it)
            out += [flag, value]
            if flag == "-t":
                threads = int(value)
            if flag == "-I":
                # memcached refuses an -I below its 512 KB slab chunk limit
                # unless that limit (in KB) comes down with it. 1.6.18
                # segfaults storing small items when the limit is below -I,
                # or when -I is below 128k (seen with 64k and 96k).
                kb = _kilobytes(value)
                if kb < 128:
                    pytest.skip(f"memcached 1.6.18 crashes with -I {value}: use -I 128k or more")
                if kb < 1024:
                    out += ["-o", f"slab_chunk_max={kb}"]
        elif flag == "-c":
            conns = int(next(it))
        elif re.fullmatch(r"-v+", flag):
            out.append(flag)
        else:
            pytest.skip(f"{flag} has no memcached equivalent (KVPROF_TEST_AGAINST=memcached)")
    if conns is not None:
        # memcached 1.6 counts its own descriptors (stdio, listener, 4 per
        # worker) against -c and sets RLIMIT_NOFILE from it; measured on
        # 1.6.18, `-t T -c C` serves C - 8 - 4T clients. Add them back so
        # `-c N` means N clients on both servers.
        out += ["-c", str(conns + 8 + 4 * threads)]
    return out


def vmrss_mb(pid: int) -> float:
    """Resident set size of a process, from /proc/PID/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def sanitized(pid: int) -> bool:
    """True when the process runs with AddressSanitizer."""
    with open(f"/proc/{pid}/maps") as f:
        return any("libasan" in line for line in f)


def bpf_unavailable() -> str | None:
    """Why BPF tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root to load BPF programs (run `make test` as root or with sudo)"
    try:
        import bcc  # noqa: F401  (distribution package python3-bpfcc)
    except ImportError as e:
        return f"BCC is not importable ({e}): run scripts/provision.sh"
    return None


# ---- kvload against a test's server ----------------------------------------------------

# the study's shape with some sets and zipf keys; small batches keep both workers
# meeting on the shared sites
LOAD = ["--num-threads=1", "--connections=8", "--batch-size=8", "--set-pct=20", "--key-dist=zipf:0.99"]


@contextlib.contextmanager
def kvload(server: Server, seconds: float, *extra: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [
            str(kvload_binary()),
            f"--server={server.address}",
            f"--duration={seconds}",
            "--quiet",
            *LOAD,
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.communicate(timeout=30)


# ---- the kvs probes of a running server ------------------------------------------------


@dataclass(frozen=True)
class Note:
    provider: str
    name: str
    location: int
    semaphore: int
    arguments: tuple[str, ...]


def probe_notes(binary: Path) -> list[Note]:
    """Every stapsdt note of `binary`, as `readelf -n` prints them."""
    out = subprocess.run(["readelf", "-n", str(binary)], capture_output=True, text=True, check=True).stdout
    notes = []
    note = re.compile(
        r"Provider: (\S+)\s+Name: (\S+)\s+"
        r"Location: (0x[0-9a-f]+), Base: 0x[0-9a-f]+, Semaphore: (0x[0-9a-f]+)\s+"
        r"Arguments: ?([^\n]*)"
    )
    for m in note.finditer(out):
        args = tuple(m.group(5).split())
        notes.append(Note(m.group(1), m.group(2), int(m.group(3), 16), int(m.group(4), 16), args))
    return notes


def _running_image(pid: int) -> tuple[Path, str]:
    """The process's executable as /proc/PID/exe (readable even if rebuilt since) and its path."""
    exe = Path(f"/proc/{pid}/exe")
    return exe, str(exe.readlink()).removesuffix(" (deleted)")


def _load_base(pid: int) -> int:
    """Where the executable is mapped (its offset-0 mapping); 0 for a non-PIE executable."""
    exe, path = _running_image(pid)
    with exe.open("rb") as f:
        e_type = int.from_bytes(f.read(18)[16:18], "little")
    if e_type == 2:  # ET_EXEC: link-time addresses are run-time addresses
        return 0
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].removesuffix(" (deleted)") == path and int(parts[2], 16) == 0:
            return int(parts[0].split("-")[0], 16)
    raise AssertionError(f"{path} is not mapped in {pid}")


def semaphores(server: Server) -> dict[str, int]:
    """The current value of every kvs probe semaphore in the running server."""
    return pid_semaphores(server.pid)


def pid_semaphores(pid: int) -> dict[str, int]:
    """The current value of every kvs probe semaphore in a running process."""
    base = _load_base(pid)
    values = {}
    with Path(f"/proc/{pid}/mem").open("rb") as mem:
        for n in probe_notes(_running_image(pid)[0]):
            if n.provider == "kvs" and n.name not in values:
                mem.seek(base + n.semaphore)
                values[n.name] = int.from_bytes(mem.read(2), "little")
    return values


def assert_detached(server: Server) -> None:
    """Nothing of ours in uprobe_events, and no kvs semaphore of the server still raised."""
    assert_no_uprobes()
    if server.alive():
        raised = {k: v for k, v in semaphores(server).items() if v}
        assert not raised, f"semaphores still raised after detaching: {raised}"


def assert_no_uprobes() -> None:
    """Nothing of ours in uprobe_events."""
    if UPROBE_EVENTS.exists():
        # BCC names the uprobes it creates through tracefs ..._bcc_<tracer pid>;
        # through the perf uprobe PMU (newer kernels) it creates none there.
        ours = f"bcc_{os.getpid()}"
        left = [line for line in UPROBE_EVENTS.read_text().splitlines() if ours in line]
        assert not left, f"uprobes left behind: {left}"


def worker_tids(server: Server) -> dict[int, int]:
    """tid -> worker index, from the kv-worker-N thread names."""
    out = {}
    for task in Path(f"/proc/{server.pid}/task").iterdir():
        m = re.fullmatch(r"kv-worker-(\d+)", (task / "comm").read_text().strip())
        if m:
            out[int(task.name)] = int(m.group(1))
    return out


def pin_workers(server: Server) -> None:
    """kv-worker-N on CPU N (mod the CPUs there are): a per-thread line then stays on its
    CPU, so what the fixed design still shows is not the scheduler moving threads around."""
    cpus = sorted(os.sched_getaffinity(0))
    for tid in os.listdir(f"/proc/{server.pid}/task"):
        name = Path(f"/proc/{server.pid}/task/{tid}/comm").read_text().strip()
        if name.startswith("kv-worker-"):
            os.sched_setaffinity(int(tid), {cpus[int(name.rsplit("-", 1)[1]) % len(cpus)]})


# ---- what this process holds in the kernel ---------------------------------------------


def our_bpf_fds() -> dict[int, str]:
    """fd -> kind (bpf-prog, bpf-map, perf_event, ...) of this process's BPF and perf fds."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("anon_inode:") and ("bpf" in link or "perf_event" in link):
            out[int(fd)] = link.removeprefix("anon_inode:").strip("[]")
    return out


def prog_ids(fds: dict[int, str]) -> set[int]:
    """The kernel ids of the BPF programs behind these fds."""
    ids = set()
    for fd, kind in fds.items():
        if kind == "bpf-prog":
            for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
                if line.startswith("prog_id:"):
                    ids.add(int(line.split()[1]))
    return ids


_libc = ctypes.CDLL(None, use_errno=True)
_SYS_BPF = 321  # x86_64
_BPF_PROG_GET_FD_BY_ID = 13


def prog_loaded(prog_id: int) -> bool:
    """True while the kernel still has a BPF program with this id."""
    attr = (ctypes.c_uint32 * 4)(prog_id, 0, 0, 0)
    fd = _libc.syscall(_SYS_BPF, _BPF_PROG_GET_FD_BY_ID, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd >= 0:
        os.close(fd)
        return True
    return False


def assert_nothing_left(before: dict[int, str], loaded: set[int]) -> None:
    """No BPF/perf fd beyond those held before, and every program we loaded unloaded."""
    left = {fd: kind for fd, kind in our_bpf_fds().items() if fd not in before}
    assert not left, f"fds still open after close(): {left}"
    deadline = time.monotonic() + 5.0
    while any(prog_loaded(i) for i in loaded) and time.monotonic() < deadline:
        time.sleep(0.05)  # programs are freed after an RCU grace period
    assert not [i for i in loaded if prog_loaded(i)], "BPF programs still loaded after close()"


@contextlib.contextmanager
def collecting(
    pid: int, hz: int = CollectOptions.hz, offcpu_sample: int = 16, offcpu_hz: int = 0
) -> Iterator[tuple[list[Any], set[int]]]:
    """oncpu and offcpu attached to pid; yields them and the program ids they
    loaded; always closes them and checks nothing of ours is left. offcpu times
    every switch (kvprof.collect.offcpu), or with `offcpu_hz` samples the
    threads that many times a second (kvprof.collect.offsample, record's default)."""
    from kvprof.collect.offcpu import OffCpuCollector
    from kvprof.collect.offsample import OffSampleCollector
    from kvprof.collect.oncpu import OnCpuCollector

    before = our_bpf_fds()
    opts = CollectOptions(hz=hz, offcpu_sample=offcpu_sample, offcpu_hz=offcpu_hz)
    offcpu = OffSampleCollector(pid, opts) if offcpu_hz else OffCpuCollector(pid, opts)
    collectors: list[Any] = [OnCpuCollector(pid, opts), offcpu]
    loaded: set[int] = set()
    try:
        for c in collectors:
            assert c.applies() is None
            c.start()
        loaded = prog_ids({fd: k for fd, k in our_bpf_fds().items() if fd not in before})
        assert loaded, "no BPF program fd found while attached"
        yield collectors, loaded
    finally:
        for c in collectors:
            c.close()
    assert_nothing_left(before, loaded)


def snapshot(pid: int, collectors: list[Any]) -> Profile:
    profile = Profile(Target(pid))
    for c in collectors:
        c.contribute(profile)
    return profile


# BPF's own frames and the tracing glue that runs a program (`_einittext` is
# what a program's address resolves to from a stale /proc/kallsyms read).
BPF_FRAME = re.compile(
    r"(bpf_prog_|bpf_trace_run|__bpf_trace_|bpf_overflow_handler|__traceiter_|trace_call_bpf|perf_trace_"
    r"|trace_event_raw_event_|__uprobe_perf_func|uprobe_perf_func|perf_syscall_(enter|exit)|_einittext)"
)


def bpf_frames(profile: Profile) -> dict[str, list[list[str]]]:
    """The stacks of each kind (oncpu, offcpu, futex, locks) with a BPF frame in them."""
    kinds = {
        "oncpu": [s.frames for s in profile.oncpu],
        "offcpu": [s.frames for s in profile.offcpu.stacks],
        "futex": [w.frames for w in profile.offcpu.futex],
        "locks": [s.frames for lk in profile.locks for s in lk.stacks],
    }
    found = {k: [f for f in stacks if any(BPF_FRAME.match(x) for x in f)] for k, stacks in kinds.items()}
    return {k: v for k, v in found.items() if v}


# ---- a known C workload without kvs probes (tests/programs/contend.c) ------------------

CONTEND_SOURCE = TESTS / "programs" / "contend.c"


def start_ready(argv: list[str | Path], started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """Start a program that prints `ready` once set up and runs until its stdin
    closes (contend.c and its kind), added to `started` before it is waited for."""
    proc = subprocess.Popen(
        [str(a) for a in argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=die_with_parent
    )
    started.append(proc)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    return proc


def stop_contend(proc: subprocess.Popen[bytes]) -> None:
    """Close its stdin (it exits on EOF); kill it if it does not."""
    if proc.stdin is not None and not proc.stdin.closed:
        proc.stdin.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


# ---- running as an unprivileged user (65534) -------------------------------------------

NOBODY = 65534


class Unprivileged(NamedTuple):
    """kvprof, kvcached and py-spy copied where user 65534 can read them: the
    tree under test may sit in a folder only its owner can enter (a 0700
    `mktemp -d`, root's home). Its commands run from /, with nothing but this."""

    root: Path
    python: str  # the interpreter behind the venv's, outside the tree
    kvcached: str
    env: dict[str, str]

    def kvprof(self, *args: str) -> list[str]:
        return [self.python, "-m", "kvprof.cli", *args]

    def run(self, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
            env=self.env,
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
        )


# ---- flame-graph SVGs ------------------------------------------------------------------

SVG_NS = "{http://www.w3.org/2000/svg}"


@dataclass
class SvgFrame:
    name: str
    tip: str
    start: int
    value: int
    x: float
    y: float
    width: float
    fill: str
    cls: str


@dataclass
class SvgDoc:
    root: ET.Element
    frames: list[SvgFrame]

    def attr(self, name: str) -> str:
        return self.root.attrib[f"data-{name}"]

    def text(self, element_id: str) -> str:
        for el in self.root.iter(f"{SVG_NS}text"):
            if el.get("id") == element_id:
                return el.text or ""
        raise AssertionError(f"no text element #{element_id}")

    def named(self, name: str) -> list[SvgFrame]:
        return [f for f in self.frames if f.name == name]


def read_svg(path: Path) -> SvgDoc:
    """Parse a kvprof flame-graph SVG (fails the test if it is not well-formed XML)."""
    root = ET.parse(path).getroot()
    group = next(g for g in root.iter(f"{SVG_NS}g") if g.get("id") == "frames")
    frames = []
    for g in group:
        title = g.find(f"{SVG_NS}title")
        rect = g.find(f"{SVG_NS}rect")
        assert title is not None and rect is not None and title.text
        name, _, tip = title.text.partition("\n")
        frames.append(
            SvgFrame(
                name=name,
                tip=tip,
                start=int(g.attrib["data-s"]),
                value=int(g.attrib["data-v"]),
                x=float(rect.attrib["x"]),
                y=float(rect.attrib["y"]),
                width=float(rect.attrib["width"]),
                fill=rect.attrib["fill"],
                cls=g.get("class", ""),
            )
        )
    return SvgDoc(root, frames)


# ---- Prometheus exposition -------------------------------------------------------------


def exposition(families: Any) -> dict[str, list[Any]]:
    """/metrics text of `families` (kvprof.views.metrics.Families), parsed back:
    sample name -> samples."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import CollectorRegistry

    class Static:
        def collect(self) -> Iterator[Any]:
            yield from families.families.values()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Static())
    out: dict[str, list[Any]] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


# ---- `kvprof top` ----------------------------------------------------------------------

FROZEN = 1_800_000_000.0  # the clock of every app built here: the file names it stamps stay fixed


def top_app(
    source: Source | None = None,
    interval: float = 1.0,
    out_dir: Path | str = "/nonexistent",
    baseline: Profile | None = None,
) -> TopApp:
    """The production `kvprof top` app as the tests drive it: over `source` (by default
    the replay of TOP_BASELINE), writing its files into `out_dir`, its clock frozen;
    `baseline` is what the Flame view's diff compares with (top --baseline)."""
    from kvprof.tui.app import TopApp
    from kvprof.tui.sources import ReplaySource

    if source is None:
        source = ReplaySource(TOP_BASELINE)
    return TopApp(source, interval=interval, out_dir=out_dir, clock=lambda: FROZEN, baseline=baseline)


FLAME_VIEW = ("7", "flame")  # the key that shows the Flame view, and its tab


async def until(pilot: Pilot[Any], check: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Let the app run until `check()` holds or `timeout` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        await pilot.pause(0.05)
    return check()


async def first_frame(pilot: Pilot[Any]) -> None:
    """Wait for the app's first frame, as a person would before looking."""
    app = pilot.app
    assert await until(pilot, lambda: app.frames > 0), app.error
    await pilot.pause()


async def show_view(pilot: Pilot[Any], key: str, view: str) -> None:
    """Press `key` once; `view` is then the active tab."""
    from textual.widgets import TabbedContent

    await pilot.press(key)
    await pilot.pause(0.2)
    assert pilot.app.query_one(TabbedContent).active == view


def drive(
    app: TopApp,
    script: Callable[[Pilot[Any]], Awaitable[None]],
    size: tuple[int, int] = (80, 24),
    view: tuple[str, str] | None = None,
) -> None:
    """Run `app` in Textual's test harness at `size`: its first frame, then `view`
    ((key, tab) as FLAME_VIEW) when given, then `script`."""

    async def go() -> None:
        async with app.run_test(size=size) as pilot:
            await first_frame(pilot)
            if view is not None:
                await show_view(pilot, *view)
            await script(pilot)

    asyncio.run(go())


# ---- profiles --------------------------------------------------------------------------


def halved(p: Profile) -> Profile:
    """A cumulative snapshot taken halfway: every count and the window halved."""
    h = copy.deepcopy(p)
    h.window = Window(p.window.start, p.window.duration_s / 2)
    for s in h.oncpu:
        s.count //= 2
    for th in h.threads.values():
        th.cpu_samples //= 2
        th.sockets = {k: v // 2 for k, v in th.sockets.items()}
        th.offcpu_ns //= 2
        th.lock_wait_ns //= 2
    for lk in h.locks:
        lk.waits //= 2
        lk.wait_ns //= 2
        lk.hist_log2_ns = [n // 2 for n in lk.hist_log2_ns]
    for c in h.cachelines:
        c.samples //= 2
        c.transfers //= 2
        c.cross_socket_transfers //= 2
    h.findings = []
    return h


# The hand-made kvcached profiles of test_analysis and test_report: shaped like
# a recording of kvcached -t 2 under kvload, --preset baseline and --preset
# fixed; the rates (operations, topkeys waits and time waiting per second)
# follow the run in docs/demo.md, and the probes are sampled 1 in RATE as
# kvcached --probe-sample samples them.
# tests/golden/report-baseline.txt is the baseline's report, byte for byte.

MAIN, W0, W1 = "4100", "4101", "4102"
DURATION, HZ, RATE = 5.0, 99, 64
TOPKEYS_LOCK = 0x55D0_0000_1000
WORKER = ["start_thread", "worker_main", "ev_run", "conn_on_readable", "process_command"]


def _stacks(tid: str, topkeys: int) -> list[CpuStack]:
    """On-CPU stacks of one worker: mostly socket I/O, plus the four contention sites."""
    t = int(tid)
    get = [*WORKER, "process_get"]
    return [
        CpuStack(t, [*WORKER, "conn_write", "__libc_writev", "tcp_sendmsg_locked_[k]"], 90),
        CpuStack(t, [*WORKER, "conn_read", "__libc_read", "tcp_recvmsg_[k]"], 50),
        CpuStack(t, [*get, "update_topkeys"], topkeys),
        CpuStack(t, [*get, "collect_timings"], 12),
        CpuStack(t, [*get, "item_copy", "on_create_item"], 9),
        CpuStack(t, [*get, "item_copy", "account_memory"], 7),
        CpuStack(t, [*get, "hash_find"], 20),
        CpuStack(t, [*get, "item_copy", "__memmove_avx_unaligned_erms"], 25),
    ]


def _line(
    site: str, line: int, samples: int, transfers: int, cycles: float, tids: list[str]
) -> CacheLineStat:
    """A cache line sampled at `site`, its samples and transfers split evenly over `tids`."""
    per = samples // len(tids)
    return CacheLineStat(
        site=site,
        line=line,
        samples=per * len(tids),
        transfers=transfers,
        cross_socket_transfers=0,
        cycles_mean=cycles,
        cycles_max=int(cycles * 20),
        hist_log2_cycles=[],
        socket_matrix=[[transfers]],
        by_thread={t: LineThread(per, transfers // len(tids), cycles) for t in tids},
    )


def _profile(locks: list[LockStat], lines: list[CacheLineStat], topkeys_cpu: int) -> Profile:
    """A kvcached -t 2 recording with the given lock and cache-line sections."""
    oncpu = _stacks(W0, topkeys_cpu) + _stacks(W1, topkeys_cpu)
    oncpu.append(CpuStack(int(MAIN), ["main", "listener_accept", "accept4"], 2))
    per_thread = {W0: 0, W1: 0, MAIN: 0}
    for s in oncpu:
        per_thread[str(s.tid)] += s.count
    idle = ["start_thread", "worker_main", "ev_run", "epoll_wait", "do_epoll_wait_[k]", "schedule_[k]"]
    return Profile(
        kvprof_version="0.1.0",  # fixed, so the golden reports outlive a version bump
        target=Target(
            pid=int(MAIN),
            comm="kvcached",
            exe="/work/main/server/build/kvcached",
            cmdline=["kvcached", "-p", "0", "-t", "2"],
            kvs_probes=True,
        ),
        host=Host(
            kernel="6.1.0-test",
            cpus=2,
            topology={"0": {"core": 0, "socket": 0, "node": 0}, "1": {"core": 1, "socket": 0, "node": 0}},
        ),
        window=Window(start=1_700_000_000.0, duration_s=DURATION),
        hz=HZ,
        collectors=["oncpu", "offcpu", "locks", "cachelines", "requests"],
        threads={
            MAIN: ThreadInfo(
                name="kvcached",
                cpu_samples=per_thread[MAIN],
                sockets={"0": per_thread[MAIN]},
                stack_quality=0.0,
            ),
            W0: ThreadInfo(
                name="kv-worker-0",
                cpu_samples=per_thread[W0],
                sockets={"0": per_thread[W0]},
                stack_quality=0.02,
            ),
            W1: ThreadInfo(
                name="kv-worker-1",
                cpu_samples=per_thread[W1],
                sockets={"0": per_thread[W1]},
                stack_quality=0.03,
            ),
        },
        oncpu=oncpu,
        offcpu=OffCpu(
            stacks=[
                OffCpuStack(int(W0), idle, 1_500_000_000),
                OffCpuStack(int(W1), idle, 1_400_000_000),
                OffCpuStack(int(MAIN), ["main", "listener_run", "epoll_wait"], 4_900_000_000),
            ],
            futex=[
                FutexWait(
                    int(t),
                    TOPKEYS_LOCK,
                    [*WORKER, "update_topkeys", "kv_lock_contended", "__lll_lock_wait"],
                    30_000,
                    80_000_000,
                )
                for t in (W0, W1)
            ]
            if locks
            else [],
        ),
        locks=locks,
        cachelines=lines,
        requests={
            "get": RequestStat(count=52_000, p50_ns=2_100, p99_ns=41_000),
            "set": RequestStat(count=2_700, p50_ns=3_300, p99_ns=60_000),
        },
        status=Status(
            collectors={"oncpu": "ok", "offcpu": "ok", "locks": "ok", "cachelines": "ok", "requests": "ok"},
            sample_rates={"cmd__start": RATE, "cmd__done": RATE, "atomic__sample": RATE},
        ),
    )


def baseline_profile() -> Profile:
    """kvcached --preset baseline: topkeys waits on both workers, four bouncing counter sites."""
    topkeys = LockStat(
        name="topkeys",
        address=TOPKEYS_LOCK,
        waits=76_000,
        wait_ns=172_000_000,
        max_ns=1_900_000,
        hist_log2_ns=[],
        by_thread={W0: ThreadWaits(39_000, 90_000_000), W1: ThreadWaits(37_000, 82_000_000)},
        stacks=[
            LockStack([*WORKER, "process_get", "update_topkeys", "kv_lock_contended"], 70_000, 160_000_000),
            LockStack([*WORKER, "process_set", "update_topkeys", "kv_lock_contended"], 6_000, 12_000_000),
        ],
    )
    item_lock = LockStat(
        name="item_lock",
        address=0x55D0_0000_8000,
        waits=40,
        wait_ns=600_000,
        max_ns=90_000,
        by_thread={W0: ThreadWaits(22, 300_000), W1: ThreadWaits(18, 300_000)},
        stacks=[LockStack([*WORKER, "process_get", "item_get", "kv_lock_contended"], 40, 600_000)],
    )
    both = [W0, W1]
    # each site updated at docs/demo.md's request rate, sampled 1 in RATE for DURATION;
    # 40 % of the samples find the line on the other CPU
    lines = [
        _line("collect_timings", 0x55D0_0001_0040, 40_000, 16_000, 240.0, both),
        _line("collect_timings", 0x55D0_0001_0080, 15_000, 6_000, 230.0, both),
        _line("on_create_item", 0x55D0_0002_0000, 55_000, 22_000, 260.0, both),
        _line("on_delete_item", 0x55D0_0002_0000, 55_000, 22_000, 250.0, both),
        _line("account_memory", 0x55D0_0003_0000, 110_000, 44_000, 270.0, both),
    ]
    p = _profile([topkeys, item_lock], lines, topkeys_cpu=30)
    # kvcached's lock__hold: the shared topkeys mutex taken by both workers once per request,
    # HOLD_NS each time (the requests' rate of docs/demo.md, sampled 1 in RATE as above)
    p.holds = [_holds("topkeys", TOPKEYS_LOCK, {W0: 27_000 * RATE, W1: 27_700 * RATE})]
    return p


HOLD_NS = 800


def _holds(name: str, address: int, acquisitions: dict[str, int]) -> LockHold:
    by = {tid: ThreadHolds(n, n * HOLD_NS) for tid, n in acquisitions.items()}
    total = sum(acquisitions.values())
    samples = 16 * int(DURATION) * len(by)
    return LockHold(name, address, total, total * HOLD_NS, samples, min_ns=HOLD_NS, by_thread=by)


def fixed_profile() -> Profile:
    """kvcached --preset fixed: no topkeys waits, every counter line written by one thread."""
    lines = []
    for i, site in enumerate(["collect_timings", "on_create_item", "on_delete_item", "account_memory"]):
        for j, tid in enumerate((W0, W1)):
            # per-thread slots: a transfer only when the owner moved to the other CPU
            lines.append(_line(site, 0x55D0_0010_0000 + i * 0x1000 + j * 64, 30_000, 300, 38.0, [tid]))
    p = _profile([], lines, topkeys_cpu=14)
    # one topkeys table and lock per worker: two addresses, one holder each
    p.holds = [_holds("topkeys_thread", 0x55D0_0020_0000 + i * 0x1000, {tid: 27_350 * RATE})
               for i, tid in enumerate((W0, W1))]  # fmt: skip
    return p
