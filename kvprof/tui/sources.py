"""Where `kvprof top` gets its samples: a live BPF session, or a recorded profile.

Both have the same small interface, called from the app's refresh worker
(never from the UI thread, since a poll reads BPF maps or a socket):

    start()  -> None            begin (the live source attaches in the background)
    poll()   -> list[Sample]    what is new since the last poll ([] when nothing)
    close()  -> None            stop and detach everything; idempotent
    attaching() -> bool         collectors are still attaching (or a poll has yet to see the last)
    wait_change(timeout) -> None   until a collector attached or failed since the last poll

While collectors attach, the app polls once per collector attached rather than
at a fixed pace, so the compile has the CPU.

The live source starts one Session (kvprof/collect/session.py) in a thread of its
own: the session attaches its collectors one after another, fastest-to-name-the-
contention first, and starts the window at the first attach (opts.live), so the
screen shows numbers while slower ones still compile; its on_state callbacks say
which collector is being attached.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kvprof.collect import HZ, INLINE_FRAMES
from kvprof.model.profile import Profile, Target
from kvprof.tui.data import Sample

if TYPE_CHECKING:
    from kvprof.collect.session import Session

PENDING = ("attaching", "compiling")  # the session's states of a collector not attached yet


class Source(Protocol):
    title: str  # "kvcached PID 1234"
    command: str
    label: str  # "live" or "replay of FILE"
    live: bool
    pid: int

    def start(self) -> None: ...

    def poll(self) -> list[Sample]: ...

    def close(self) -> None: ...

    def attaching(self) -> bool: ...

    def wait_change(self, timeout: float) -> None: ...

    def held(self) -> bool:
        """Paused from outside (SIGUSR1: kvprof.system.attach.pause_on_signals): nothing
        is counted, and the screen is not refreshed until it resumes (SIGUSR2)."""
        ...


def _title(target: Target) -> str:
    """`kvcached PID 1234`, `PID 1234 (1 in its namespace)` for a target in a container."""
    return f"{target.comm} {target.pids}" if target.comm else target.pids


class ReplaySource:
    """A recorded profile, shown as one window: its `stats` before and after it, then the profile."""

    live = False

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.profile = Profile.load(self.path)  # ProfileError says why, before the screen is taken
        t = self.profile.target
        self.pid = t.pid
        self.title = _title(t)
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

    def attaching(self) -> bool:
        return False

    def wait_change(self, timeout: float) -> None:
        pass

    def held(self) -> bool:
        return False


class LiveSource:
    """A Session on a running process, attached in the background, read at every poll."""

    live = True

    def __init__(
        self,
        pid: int,
        hz: int = HZ,
        collectors: tuple[str, ...] = (),
        inline: bool = INLINE_FRAMES,
        yield_cpu: bool = False,
    ) -> None:
        """`yield_cpu`: once attached, the whole process drops to nice WATCH_NICE
        (system.attach.yield_cpu): what `kvprof top` does; a test's process keeps its own."""
        from kvprof.collect import CollectOptions
        from kvprof.system.attach import open_session

        # CollectError (the target is gone, not ours...) before the screen is taken
        self.session: Session = open_session(pid, collectors, CollectOptions(hz=hz, inline=inline, live=True))
        target = self.session.target
        self.pid = pid
        self.title = _title(target)
        self.command = " ".join(target.cmdline)
        self.label = "live"
        self.yield_cpu = yield_cpu
        self.states: dict[str, str] = dict.fromkeys(self.session.names, "attaching")
        self.error = ""  # why nothing could attach
        self.compiling = ""  # the collector being compiled and attached now
        self._changed = threading.Condition()  # a collector's state changed
        self._changes = 0  # how many times one did; poll() notes how many it has seen
        self._polled_changes = 0
        self._poll_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._stop = threading.Event()
        self._attacher: threading.Thread | None = None
        self._t0 = time.monotonic()
        self._closed = False

    # ---- attaching (a thread of its own: compiling takes seconds) -----------------

    def start(self) -> None:
        """Start attaching in the background; once (later calls do nothing)."""
        if self._attacher is not None:
            return
        self._t0 = time.monotonic()
        self._attacher = threading.Thread(target=self._attach, name="kvprof-attach", daemon=True)
        self._attacher.start()

    def _on_state(self, name: str, state: str) -> None:
        """The session's progress: "compiling X" on screen comes from here."""
        pending = state in PENDING
        self.compiling = name if pending else ""
        with self._changed:
            self.states[name] = "attaching" if pending else state
            self._changes += not pending  # the screen shows the pending ones alike
            self._changed.notify_all()

    def wait_attached(self, names: tuple[str, ...], timeout: float) -> bool:
        """Wait until each of `names` is attached or known not to attach, the source is
        closed, or `timeout` passes; True unless it timed out."""

        def settled() -> bool:
            pending = [n for n in names if self.states.get(n, "attaching") == "attaching"]
            return not pending or self._stop.is_set()

        with self._changed:
            return self._changed.wait_for(settled, timeout)

    def wait_change(self, timeout: float) -> None:
        """Return once a collector attached or failed since the last poll(), attaching
        ended, the source stopped, or `timeout` passed: while collectors attach, the
        screen is redrawn when one does, not at a fixed pace (every poll reads the
        maps and builds a frame: CPU the compiling thread needs)."""

        def changed() -> bool:
            return self._changes != self._polled_changes or self._stop.is_set()

        with self._changed:
            self._changed.wait_for(changed, timeout)

    def _attach(self) -> None:
        from kvprof.collect import CollectError
        from kvprof.collect.session import TargetGone
        from kvprof.system.attach import yield_cpu

        try:
            self.session.start(on_state=self._on_state)
            if self.yield_cpu:
                yield_cpu()
        except TargetGone:
            pass  # poll() sees it gone and says so
        except CollectError:
            if not self._stop.is_set():
                reasons = "; ".join(f"{n}: {s}" for n, s in self.states.items())
                self.error = f"no collector could attach: {reasons}"
        except Exception as e:  # a surprise in one collector must not end top
            self.error = f"attaching failed: {type(e).__name__}: {e}"
        finally:
            self.compiling = ""
            with self._changed:
                self._changes += 1  # attaching ended
                self._changed.notify_all()

    def stopped(self) -> bool:
        return self._stop.is_set()

    def held(self) -> bool:
        return self.session.is_paused()

    def attaching(self) -> bool:
        """True until every collector attached or failed and a poll has seen that."""
        if self._attacher is not None and self._attacher.is_alive():
            return True
        with self._changed:
            return self._changes != self._polled_changes and not self._stop.is_set()

    # ---- reading ---------------------------------------------------------------------

    def poll(self) -> list[Sample]:
        with self._poll_lock:
            if self._closed:
                return []
            at = time.monotonic() - self._t0
            with self._changed:
                seen = self._changes  # a change after this point gets a poll of its own
            ended = self.session.stop_reason()  # it exited, or exec'd another program
            is_alive = ended is None
            stats = self.session.stats(("",), timeout=0.5).get("general") if is_alive else None
            # the window starts with the first collector attached
            profile = self.session.snapshot() if self.session.started_at else None
            with self._changed:
                self._polled_changes = seen
                if profile is not None:
                    self.states.update(profile.status.collectors)
                states = dict(self.states)
            if profile is not None and not is_alive:
                profile.status.partial = True
                profile.status.reason = ended or ""
            if self.error:
                states.setdefault("error", self.error)
        if not is_alive:
            self.close()  # the last of it: detach now, keep showing what was counted
        return [Sample(at, profile, stats, alive=is_alive, states=states)]

    def close(self) -> None:
        """Stop attaching, detach everything; idempotent.

        A collector being compiled is not waited for (it takes seconds on a
        busy machine: docs/top.md, "How it works"): it holds only file descriptors until it attaches (the
        kvs ones too: the kernel owns the probe semaphores, see
        kvprof/collect/usdt.py). If it finishes in this process it sees the
        session closed and detaches itself (attaching() is True until then); if
        the process exits first, the kernel drops the fds."""
        with self._close_lock:  # a second caller waits for the first to finish
            with self._changed:
                self._stop.set()
                self._changed.notify_all()
            with self._poll_lock:  # a poll in flight reads the maps: let it finish first
                self._closed = True
            self.session.close()
