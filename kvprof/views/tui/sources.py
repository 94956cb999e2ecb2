"""Where `kvprof top` gets its samples: a live BPF session, or a recorded profile.

Both have the same small interface, called from the app's refresh worker
(never from the UI thread, since a poll reads BPF maps or a socket):

    start()  -> None            begin (the live source attaches in the background)
    poll()   -> list[Sample]    what is new since the last poll ([] when nothing)
    close()  -> None            stop and detach everything; idempotent

The live source attaches its collectors in the order that names the
contention spots soonest: the kvs lock and cache-line programs compile in a
second or two each, the on-CPU one takes several; the first collector
starts the session's window and the others join it (Session.add) while the
screen already shows numbers.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kvprof.model.profile import Profile
from kvprof.views.tui.data import Sample

if TYPE_CHECKING:
    from kvprof.collect.session import Session

# kvs targets: the lock and cache-line collectors name the study's spots; then the slow
# on-CPU program (5-10 s to compile here), whose compile a quit does not wait for (see
# LiveSource.close), so a quit while the first findings are on screen is quick
KVS_ORDER = ("locks", "cachelines", "oncpu", "offcpu", "requests", "regsample")
GENERIC_ORDER = ("offcpu", "oncpu", "regsample", "locks", "cachelines", "requests")


class Source(Protocol):
    title: str  # "kvcached PID 1234"
    command: str
    label: str  # "live" or "replay of FILE"
    live: bool
    pid: int

    def start(self) -> None: ...

    def poll(self) -> list[Sample]: ...

    def close(self) -> None: ...


def _title(comm: str, pid: int) -> str:
    return f"{comm or 'PID'} PID {pid}" if comm else f"PID {pid}"


class ReplaySource:
    """A recorded profile, shown as one window: its `stats` before and after it, then the profile."""

    live = False

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.profile = Profile.load(self.path)  # ProfileError says why, before the screen is taken
        t = self.profile.target
        self.pid = t.pid
        self.title = _title(t.comm, t.pid)
        self.command = " ".join(t.cmdline)
        self.label = f"replay of {self.path.name}"
        self._done = False

    def start(self) -> None:
        pass

    def poll(self) -> list[Sample]:
        if self._done:
            return []
        self._done = True
        p = self.profile
        states = dict(p.status.collectors) or dict.fromkeys(p.collectors, "ok")
        return [
            Sample(0.0, None, p.server_stats.get("before"), states=states),
            Sample(p.window.duration_s, p, p.server_stats.get("after"), states=states),
        ]

    def close(self) -> None:
        pass


class LiveSource:
    """A Session on a running process, attached in the background, read at every poll."""

    live = True

    def __init__(self, pid: int, hz: int = 99, collectors: tuple[str, ...] = ()) -> None:
        from kvprof.collect.session import describe_target

        target = describe_target(pid)  # TargetGone / PermissionError before the screen is taken
        self.pid = pid
        self.hz = hz
        self.title = _title(target.comm, pid)
        self.command = " ".join(target.cmdline)
        self.label = "live"
        self.wanted = collectors
        self.states: dict[str, str] = {}
        self.error = ""  # why nothing could attach
        self._session: Session | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a collector's state changed
        self._poll_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._stop = threading.Event()
        self._attacher: threading.Thread | None = None
        self._t0 = time.monotonic()
        self._stats_port: tuple[str, int] | None = None
        self._closed = False
        self.compiling = ""  # the collector being compiled and attached now
        self._spy: Any = None  # kvprof.collect.pyspy.DumpSampler: a CPython target's on-CPU stacks

    # ---- attaching (a thread of its own: compiling takes seconds) -----------------

    def start(self) -> None:
        """Start attaching in the background; once (later calls do nothing)."""
        if self._attacher is not None:
            return
        self._t0 = time.monotonic()
        self._attacher = threading.Thread(target=self._attach, name="kvprof-attach", daemon=True)
        self._attacher.start()

    def _set(self, name: str, state: str) -> None:
        with self._changed:
            self.states[name] = state
            self._changed.notify_all()

    def wait_attached(self, names: tuple[str, ...], timeout: float) -> bool:
        """Wait until each of `names` is attached or known not to attach, the source is
        closed, or `timeout` passes; True unless it timed out."""

        def settled() -> bool:
            pending = [n for n in names if self.states.get(n, "attaching") == "attaching"]
            return not pending or self._stop.is_set()

        with self._changed:
            return self._changed.wait_for(settled, timeout)

    def _attach(self) -> None:
        from kvprof.collect import CollectError, CollectOptions
        from kvprof.collect.session import Session, TargetGone
        from kvprof.collect.usdt import has_kvs_probes  # readelf: no bcc yet

        kvs = has_kvs_probes(self.pid)
        order = [n for n in (KVS_ORDER if kvs else GENERIC_ORDER) if not self.wanted or n in self.wanted]
        for name in order:
            self._set(name, "attaching")
        if "oncpu" in order and not kvs:
            order = self._python_stacks(order)
        opts = CollectOptions(hz=self.hz)
        session: Session | None = None
        # One at a time, in this thread: BCC's compiler crashes when two threads compile
        # at once (seen here as a segfault); reading maps meanwhile, from the poll, is fine.
        for name in order:
            if self._stop.is_set():
                self._set(name, "not attached: stopping")
                continue
            self.compiling = name
            try:
                if session is None:
                    candidate = Session(self.pid, [name], opts)
                    try:
                        candidate.start()
                    except CollectError as e:
                        self._set(name, candidate.status.collectors.get(name, f"failed: {e}"))
                        continue
                    with self._lock:
                        if not self._stop.is_set():
                            self._session = session = candidate
                            self.states.update(candidate.status.collectors)
                    if session is None:  # closed while it compiled (see close)
                        candidate.close()
                        break
                else:
                    self._set(name, session.add(name))
            except TargetGone:
                break  # poll() sees it gone and says so
            except Exception as e:  # one collector's surprise must not end the others
                self._set(name, f"failed: {type(e).__name__}: {e}")
            finally:
                self.compiling = ""
        if session is None and not self._stop.is_set():
            reasons = "; ".join(f"{n}: {s}" for n, s in self.states.items())
            self.error = f"no collector could attach: {reasons}"

    def _python_stacks(self, order: list[str]) -> list[str]:
        """A CPython target's on-CPU stacks come from `py-spy dump` (Python
        functions, file:line) instead of BPF; the other collectors stay. Returns
        what is left for BPF to attach."""
        from kvprof.collect.pyspy import DumpSampler, PySpyError, python_version

        if python_version(self.pid) is None:
            return order
        sampler = DumpSampler(self.pid)
        try:
            sampler.start()
        except PySpyError as e:
            self._set("oncpu", f"failed: {e}")
        else:
            self._spy = sampler
            self._set("oncpu", "ok (py-spy dump: Python stacks)")
        return [n for n in order if n != "oncpu"]

    def stopped(self) -> bool:
        return self._stop.is_set()

    def attaching(self) -> bool:
        return self._attacher is not None and self._attacher.is_alive()

    # ---- reading ---------------------------------------------------------------------

    def _stats(self) -> dict[str, str] | None:
        from kvprof.collect.server_stats import general_stats, listening_ports
        from kvprof.system.servers import TargetError

        ports = [self._stats_port] if self._stats_port else listening_ports(self.pid)
        for host, port in ports:
            try:
                values = general_stats(host, port, timeout=0.5)
            except (TargetError, OSError):
                continue
            self._stats_port = (host, port)
            return values
        self._stats_port = None
        return None

    def poll(self) -> list[Sample]:
        from kvprof.collect.session import alive

        with self._poll_lock:
            if self._closed:
                return []
            at = time.monotonic() - self._t0
            is_alive = alive(self.pid)
            stats = self._stats() if is_alive else None
            with self._lock:
                session = self._session
                states = dict(self.states)
            profile = session.snapshot() if session is not None else None
            if profile is not None and self._spy is not None:
                self._spy.contribute(profile)
            if profile is not None:
                states.update(profile.status.collectors)
                if not is_alive:
                    profile.status.partial = True
                    profile.status.reason = f"the target (PID {self.pid}) exited after {at:.1f} s"
            if self.error:
                states.setdefault("error", self.error)
        if not is_alive:
            self.close()  # the last of it: detach now, keep showing what was counted
        return [Sample(at, profile, stats, alive=is_alive, states=states)]

    def close(self) -> None:
        """Stop attaching, detach everything; idempotent.

        A collector being compiled is not waited for (it takes up to ~10 s on
        a busy machine): it holds only file descriptors until it attaches (the
        kvs ones too: the kernel owns the probe semaphores, see
        kvprof/collect/usdt.py). If it finishes in this process it sees the
        session closed and detaches itself (attaching() is True until then); if
        the process exits first, the kernel drops the fds."""
        with self._close_lock:  # a second caller waits for the first to finish
            self._close()

    def _close(self) -> None:
        with self._changed:
            self._stop.set()
            self._changed.notify_all()
        with self._poll_lock:  # a poll in flight reads the maps: let it finish first
            self._closed = True
        attacher = self._attacher
        if attacher is not None and attacher is not threading.current_thread():
            while attacher.is_alive() and not self.compiling:
                attacher.join(0.05)
        with self._lock:
            session = self._session
        if session is not None:
            session.close()
        if self._spy is not None:
            self._spy.close()
