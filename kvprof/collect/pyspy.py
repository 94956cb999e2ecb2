"""Python-level stacks from py-spy, for CPython targets: the on-CPU collector the
session picks for a CPython process (or with --python), in place of BPF's.

BPF sees a CPython process as `_PyEval_EvalFrameDefault` all the way down;
py-spy reads the interpreter's own frames from outside the process, so the
frames are Python functions with file:line. py-spy is a subprocess here, not
a library, and it stays out of the BPF collectors' way: it takes the on-CPU
stacks while the BPF collectors take off-CPU and futex waits (and the kvs
probes, should the target carry them).

- `PySpyCollector`: the collector (kvprof/collect/__init__.py's contract, name
  "oncpu"): a `PySpyRecorder` for a recording, a `DumpSampler` for a live view
  (opts.live). It says in `status.collectors["oncpu"]` that py-spy produced the
  stacks, with the share of samples py-spy failed to take (`pyspy.samples`,
  `pyspy.errors`).
- `PySpyRecorder`: `py-spy record --format raw --nonblocking --threads` for a
  recording window (stopped with SIGINT, as Ctrl-C would, so it writes what it
  has): its stacks come once, at the end (reads_once).
- `DumpSampler`: `py-spy dump --json` in a loop, for a live view (`kvprof
  top`): cumulative stacks at every read.

py-spy's output is read in pyspy_output.py; on which socket a thread ran, which
py-spy does not say, in thread_sockets.py.

--nonblocking: py-spy does not pause the target to read it, so a sample may
catch a stack mid-change and fail (an error) or be slightly off; pausing would
cost the target a stop per sample per thread. py-spy cannot unwind native
frames without stopping the target, so `--native` samples it paused (the
cost `native` buys; `_sampling_flags`).

py-spy's failures (no permission, not a CPython process, an unsupported
Python, a failed native merge) become a PySpyError whose message is one line
that says what to do. Any other failure of one read ("Failed to get stack
traces": a --nonblocking read that caught the interpreter mid-change) is
transient: the start check, the start of `py-spy record` and each dump of the
live view try it again, up to READ_TRIES times in a row, and count the tries
(`pyspy.retries`); only a target py-spy cannot read at all is refused.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from kvprof.collect import HZ, CollectError, CollectOptions, programs
from kvprof.collect.pyspy_output import DumpThread, Stacks, parse_dump, parse_raw
from kvprof.collect.thread_sockets import SocketTally
from kvprof.model.profile import CpuStack, Profile, ThreadInfo
from kvprof.model.topology import Topology

# what the process's executable or libraries look like when it is CPython
_PYTHON_EXE = re.compile(r"^python(\d+(\.\d+)?)?[dmu]*$")
_LIBPYTHON = re.compile(r"/libpython(\d+\.\d+)[dmu]*\.so")
_SUMMARY = re.compile(r"Samples: (\d+) Errors: (\d+)")
_STARTED = "Sampling process"
WARN_ERROR_RATE = 0.01  # above this share of failed samples, the profile says so
READ_TRIES = 5  # a read failing this many times in a row is not transient
RETRY_PAUSE_S = 0.1
# what py-spy says (any of the words, in lower case) -> what to do
_KNOWN = (
    (
        ("permission denied", "operation not permitted"),
        "py-spy may not read {who}'s memory (permission denied): run kvprof as root (sudo), "
        "or as the user who owns the process with kernel.yama.ptrace_scope=0",
    ),
    (("failed to get process executable name", "no such process"), "no process with PID {pid} (it exited?)"),
    (
        ("failed to find python version", "failed to find a python interpreter"),
        "{who} is not a CPython process py-spy can read ({first}): drop --python to take its stacks with BPF",
    ),
)


class PySpyError(CollectError):
    """py-spy cannot profile the target; the message is one line that says what to do.
    A CollectError: py-spy stands in for the on-CPU collector. `transient`: the
    failure of one read, worth trying again."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def binary() -> str:
    """The py-spy executable: on PATH, or next to this Python (a venv's bin/)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    raise PySpyError("py-spy is not installed: `pip install py-spy` (a dependency of kvprof's package)")


@functools.cache
def version() -> str:
    """py-spy's version ("0.4.3"), or "" when it cannot say."""
    try:
        out = subprocess.run([binary(), "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError, PySpyError):
        return ""
    return out.split()[-1] if out.split() else ""


def python_version(pid: int) -> str | None:
    """The CPython version a process runs ("3.11", or "" when only the name says
    python), or None when it does not look like CPython: the executable is
    named python*, or a libpython is mapped (an embedded interpreter)."""
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return None
    exe = exe.removesuffix(" (deleted)")
    try:
        with open(f"/proc/{pid}/maps") as f:
            lib = _LIBPYTHON.search(f.read())
    except OSError:
        lib = None
    if lib is not None:
        return lib.group(1)
    m = _PYTHON_EXE.match(exe)
    if m is None:
        return None
    return m.group(1) if m.group(1) and "." in m.group(1) else ""


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def explain(output: str, pid: int, native: bool = False) -> str:
    """py-spy's error output as one line that says what to do."""
    return _explain(output, pid, native)[0]


def _error(output: str, pid: int, native: bool) -> PySpyError:
    return PySpyError(*_explain(output, pid, native))


def _explain(output: str, pid: int, native: bool) -> tuple[str, bool]:
    """explain(), and whether the failure is transient (none of the known causes)."""
    text = output.strip()
    comm = _comm(pid)
    who = f"PID {pid} ({comm})" if comm else f"PID {pid}"
    lowered = text.lower()
    first = next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Error:")),
        text.splitlines()[0] if text else "no output",
    )
    for words, fix in _KNOWN:
        if any(w in lowered for w in words):
            return fix.format(who=who, pid=pid, first=first), False
    if "unsupported" in lowered and "python" in lowered:
        return (
            f"py-spy cannot read the Python in {who} ({first}): upgrade py-spy (`pip install -U py-spy`)",
            False,
        )
    if native and ("native" in lowered or "unwind" in lowered):
        return f"py-spy could not merge native frames for {who} ({first}): drop --native", False
    return f"py-spy failed on {who}: {first}", True


def _sampling_flags(native: bool) -> list[str]:
    # py-spy refuses --native with --nonblocking: native unwinding needs the threads stopped
    return ["--native"] if native else ["--nonblocking"]


def _dump(pid: int, native: bool, timeout: float, *flags: str) -> tuple[str, int]:
    """`py-spy dump` of `pid`, tried again on a transient failure: its stdout and
    how many tries failed first, or PySpyError with the fix."""
    argv = [binary(), "dump", *_sampling_flags(native), *flags, "-p", str(pid)]
    for failed in range(READ_TRIES):
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise PySpyError(f"py-spy did not read PID {pid} within {timeout:g} s: try again") from None
        if done.returncode == 0:
            return done.stdout, failed
        error = _error(done.stderr + done.stdout, pid, native)
        if not error.transient or failed == READ_TRIES - 1:
            raise error
        time.sleep(RETRY_PAUSE_S)
    raise AssertionError("unreachable")


def check(pid: int, native: bool = False, timeout: float = 20.0) -> tuple[str, int]:
    """Reads the target's stacks once (`py-spy dump`); returns its Python line
    ("Python v3.11.2 (/usr/bin/python3.11)") and the failed tries before it,
    PySpyError when py-spy cannot."""
    out, retries = _dump(pid, native, timeout)
    return next((ln.strip() for ln in out.splitlines() if ln.startswith("Python v")), ""), retries


# ---- py-spy record, py-spy dump ---------------------------------------------------------------


def _fill(
    profile: Profile,
    stacks: Stacks,
    tally: SocketTally | None,
    what: str,
    samples: int,
    errors: int,
    hz: int,
    failed: str = "",
    retries: int = 0,
) -> None:
    """Puts py-spy's stacks into `profile` as its on-CPU section and says so in
    status.collectors["oncpu"]: "ok (`what`; N of M samples failed (x %))"."""
    profile.oncpu = [CpuStack(s.tid, list(s.frames), s.count) for s in stacks.stacks]
    per_thread: Counter[int] = Counter()
    for s in stacks.stacks:
        per_thread[s.tid] += s.count
    for tid, n in per_thread.items():
        info = profile.threads.setdefault(str(tid), ThreadInfo())
        info.name = stacks.names.get(tid) or info.name  # the Python name (`client-1`) over the OS one
        info.cpu_samples = n
        info.sockets = tally.split(tid, n) if tally is not None else {}
    if "oncpu" not in profile.collectors:
        profile.collectors.insert(0, "oncpu")
    profile.hz = hz
    total = samples + errors
    rate = errors / total if total else 0.0
    detail = f"; {errors:,} of {total:,} samples failed ({rate:.1%})" if errors else ""
    profile.status.collectors["oncpu"] = f"failed: {failed}" if failed else f"ok ({what}{detail})"
    profile.status.counters["pyspy.samples"] = samples
    profile.status.counters["pyspy.errors"] = errors
    profile.status.counters["pyspy.retries"] = retries  # failed reads tried again (check, start, dumps)
    if rate > WARN_ERROR_RATE:
        profile.status.warnings.append(
            f"py-spy: {errors:,} of {total:,} samples failed ({rate:.1%}): the target's stacks changed "
            "while being read (--nonblocking); a lower --hz gives fewer"
        )


class PySpyRecorder:
    """`py-spy record` over a recording window, as kvprof record's on-CPU source.

    spy = PySpyRecorder(pid, hz=HZ)
    spy.check()          # PySpyError now rather than after the BPF compile
    spy.start()          # sampling from here
    ...
    spy.stop()
    spy.contribute(profile)
    """

    def __init__(
        self, pid: int, hz: int = HZ, native: bool = False, topology: Topology | None = None
    ) -> None:
        self.pid, self.hz, self.native = pid, hz, native
        self.topology = topology or Topology.read()
        self.python = ""  # "Python v3.11.2 (...)", from check()
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._tally = SocketTally(pid, self.topology)
        self._result: tuple[Stacks, int, int] | None = None
        self.error = ""
        self.retries = 0  # transient failures tried again

    @property
    def _out(self) -> Path:
        assert self._dir is not None
        return Path(self._dir.name) / "pyspy.raw"

    @property
    def _log(self) -> Path:
        assert self._dir is not None
        return Path(self._dir.name) / "pyspy.log"

    def check(self) -> str:
        self.python, retries = check(self.pid, self.native)
        self.retries += retries
        return self.python

    def start(self, timeout: float = 20.0) -> None:
        """Starts sampling; returns once py-spy samples, PySpyError if it cannot
        (a transient failure to start is tried again)."""
        for failed in range(READ_TRIES):
            try:
                self._start(timeout)
                return
            except PySpyError as e:
                if not e.transient or failed == READ_TRIES - 1:
                    raise
                self.retries += 1
                time.sleep(RETRY_PAUSE_S)

    def _start(self, timeout: float) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="kvprof-pyspy-")
        # --function: a frame is a function (at its first line), not a line of it, as
        # every other frame in kvprof is; flame graphs and findings then count it once
        argv = [
            binary(),
            "record",
            "--format",
            "raw",
            *_sampling_flags(self.native),
            "--threads",
            "--function",
        ]
        argv += ["-r", str(self.hz), "-d", "unlimited", "-p", str(self.pid), "-o", str(self._out)]
        self._proc = programs.start(argv, self._log)
        deadline = time.monotonic() + timeout
        while _STARTED not in self._log.read_text(errors="replace"):
            if self._proc.poll() is not None:
                error = _error(self._log.read_text(errors="replace"), self.pid, self.native)
                self.close()
                raise error
            if time.monotonic() > deadline:
                self.close()
                raise PySpyError(f"py-spy did not start sampling PID {self.pid} within {timeout:g} s")
            time.sleep(0.02)
        self._tally.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stops sampling and reads what py-spy wrote; idempotent."""
        proc = self._proc
        if proc is None or self._result is not None:
            return
        self._tally.stop()
        programs.stop(proc, timeout)  # as Ctrl-C: py-spy writes its file and exits
        log = self._log.read_text(errors="replace")
        summary = _SUMMARY.search(log)
        try:
            stacks = parse_raw(self._out.read_text(errors="replace"))
        except FileNotFoundError:
            stacks = Stacks()
            self.error = explain(log, self.pid, self.native) if "Error" in log else "py-spy wrote no stacks"
        samples = int(summary.group(1)) if summary else sum(s.count for s in stacks.stacks)
        errors = int(summary.group(2)) if summary else 0
        self._result = (stacks, samples, errors)

    def contribute(self, profile: Profile) -> None:
        """Puts the Python stacks in `profile.oncpu` (call after stop())."""
        if self._result is None:
            return
        stacks, samples, errors = self._result
        native = ", native frames merged" if self.native else ""
        what = f"py-spy {version() or '?'}: Python stacks{native}"
        _fill(profile, stacks, self._tally, what, samples, errors, self.hz, self.error, self.retries)

    def close(self) -> None:
        """Stops py-spy if it runs and removes its files; idempotent."""
        self._tally.stop()
        if self._proc is not None:
            programs.stop(self._proc, 10)
        self._proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def dump(pid: int, native: bool = False, timeout: float = 10.0) -> tuple[list[DumpThread], int]:
    """Every thread's Python stack right now (`py-spy dump --json`, --nonblocking
    unless native), and the failed tries before it."""
    out, retries = _dump(pid, native, timeout, "--json")
    try:
        return parse_dump(out), retries
    except ValueError:
        raise PySpyError(f"py-spy's dump of PID {pid} is not JSON: {out[:80]!r}") from None


class DumpSampler:
    """Cumulative Python stacks from `py-spy dump` every `interval` seconds, in a
    thread of its own, behind the collector interface (name, applies, start,
    contribute, close): a live view such as `kvprof top` calls contribute() on
    each snapshot of its BPF session to show Python frames as the on-CPU section.

    Each dump starts a py-spy process (tens of ms of CPU), so the interval is
    coarse; idle threads are left out as `py-spy record` leaves them out."""

    name = "oncpu"

    def __init__(
        self, pid: int, interval: float = 0.2, native: bool = False, topology: Topology | None = None
    ) -> None:
        self.pid, self.interval, self.native = pid, interval, native
        self.topology = topology or Topology.read()
        self.counts: Counter[tuple[int, tuple[str, ...]]] = Counter()
        self.names: dict[int, str] = {}
        self.samples = 0
        self.errors = 0
        self.retries = 0  # transient failures tried again
        self.error = ""  # the last failure, one line
        self._tally = SocketTally(pid, self.topology, interval=interval)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        _, self.retries = dump(self.pid, self.native)  # PySpyError now, in the caller, not in the thread
        self._thread = threading.Thread(target=self._run, name="kvprof-pyspy-dump", daemon=True)
        self._thread.start()

    def sample(self) -> None:
        """One dump, added to the counts."""
        try:
            threads, retries = dump(self.pid, self.native)
        except PySpyError as e:
            with self._lock:
                self.errors += 1
                self.error = str(e)
            return
        self._tally.tick()
        with self._lock:
            self.samples += 1
            self.retries += retries
            for t in threads:
                if t.name:
                    self.names[t.tid] = t.name
                if t.active and t.frames:
                    self.counts[(t.tid, tuple(t.frames))] += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.sample()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def contribute(self, profile: Profile) -> None:
        with self._lock:
            stacks = Stacks(
                [CpuStack(tid, list(frames), n) for (tid, frames), n in self.counts.items()], dict(self.names)
            )
            samples, errors, retries = self.samples, self.errors, self.retries
        hz = max(1, round(1 / self.interval))
        _fill(
            profile, stacks, self._tally, "py-spy dump: Python stacks", samples, errors, hz, retries=retries
        )

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(15)


class PySpyCollector:
    """The on-CPU collector of a CPython target (the session picks it): `py-spy record`
    over a recording window, its stacks read once at the end, or `py-spy dump` in a loop
    for a live view (opts.live). With opts.python (--python) py-spy was asked for: a
    target it cannot read ends the session (applies() raises) instead of being skipped."""

    name = "oncpu"

    def __init__(self, pid: int, opts: CollectOptions) -> None:
        self.pid, self.opts = pid, opts
        self.reads_once = not opts.live  # py-spy record writes its stacks when it stops
        self.source: PySpyRecorder | DumpSampler = (
            DumpSampler(pid, native=opts.native, topology=opts.topology)
            if opts.live
            else PySpyRecorder(pid, opts.hz, opts.native, opts.topology)
        )

    def applies(self) -> str | None:
        if not self.opts.python and python_version(self.pid) is None:
            return "not a CPython process"
        if isinstance(self.source, PySpyRecorder):  # PySpyError now rather than after the BPF compile
            python = self.source.check()
            if self.opts.progress is not None:
                self.opts.progress(f"Python stacks from py-spy ({python or 'CPython'})")
        return None

    def start(self) -> None:
        self.source.start()

    def contribute(self, profile: Profile) -> None:
        if isinstance(self.source, PySpyRecorder):
            self.source.stop()
        self.source.contribute(profile)

    def close(self) -> None:
        self.source.close()
