"""The `loop` collector: the target's TCP connections as a closed loop
(probes/loop.bpf.c, on the tcp:tcp_probe tracepoint).

A client that waits for each answer before its next request (a closed loop,
as memtier, kvload and most benchmarks run) splits each exchange in two: the
time from its request arriving at the target to the last segment of the
answer arriving back (the server's part: queued, then served) and from there
to its next request (the client's part, and the network's). The what-if
(kvprof.analysis.loop) needs both to say how much of a faster server the
loop turns into throughput. The answer's arrival is seen only when the
client runs on this machine; otherwise `Loop.exchanges` stays 0 and the
what-if takes the target's threads alone.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass, field

from kvprof.collect import LOOP_EVERY_S, LOOP_ON_S, CollectOptions
from kvprof.collect.bpf import BpfCollector, Module, Program, map_items, percpu_counters, put_counters, source
from kvprof.collect.server_stats import listening_ports
from kvprof.model.profile import Loop, Profile

COUNTERS = ("exchanges", "server_ns", "client_ns", "requests", "map_full")  # enum loop_counter's order
MAX_PORTS = 8  # the listening ports the program tells apart
TRACEPOINT, PROGRAM = b"tcp:tcp_probe", b"tracepoint__tcp__tcp_probe"
SENDER_SHARE = 0.05  # a thread that sent fewer of the requests is not taken for one of the client's


@dataclass
class _Snapshot:
    seconds: float = 0.0  # the stretches' seconds
    counters: dict[str, int] = field(default_factory=dict)
    senders: dict[int, int] = field(default_factory=dict)  # thread -> exchanges it started


class LoopCollector(BpfCollector):
    name = "loop"
    fired_by = "tracepoint"
    empty = _Snapshot

    def __init__(self, pid: int, opts: CollectOptions) -> None:
        super().__init__(pid, opts)
        self.ports = sorted({port for _, port in listening_ports(pid)})[:MAX_PORTS]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._since = 0.0  # when the stretch going on began (0: none)
        self._covered = 0.0  # seconds of the stretches that ended
        self._held = False  # paused by the session: no stretch until resumed

    def applies(self) -> str | None:
        why = super().applies()
        if why:
            return why
        if not self.ports:
            return "the target listens on no TCP port"
        return None

    def program(self) -> Program:
        ports = ",".join(str(p) for p in self.ports)
        flags = [f"-DLOOP_PORTS={ports}", f"-DLOOP_NPORTS={len(self.ports)}"]
        return Program(self.name, source("loop").read_text(), flags)

    def _attach(self, module: Module) -> None:
        with self._lock:
            self._off(module)  # BCC attached it when it compiled the module: stretches from now on
        self._thread = threading.Thread(target=self._run, name="kvprof-loop", daemon=True)
        self._thread.start()

    def _hook(self, module: Module) -> None:
        with self._lock:
            self._held = False

    def _detach(self) -> None:
        with self._lock:
            self._held = True
            if self.module is not None:
                self._off(self.module)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        super().close()

    def _run(self) -> None:
        """A stretch of LOOP_ON_S every LOOP_EVERY_S: the tracepoint attached, every
        connection's exchange started afresh (one in flight at the start is not counted)."""
        while not self._stop.wait(LOOP_EVERY_S - LOOP_ON_S):
            with self._lock:
                if self._held or self.module is None:
                    continue
                try:
                    self.module.bpf.attach_tracepoint(tp=TRACEPOINT, fn_name=PROGRAM)
                except Exception:  # BCC raises a plain Exception: no stretch this time
                    continue
                self.table("conns").clear()
                self.table("on")[ctypes.c_int(0)] = ctypes.c_uint32(1)
                self._since = time.monotonic()
            self._stop.wait(LOOP_ON_S)
            with self._lock:
                if self.module is not None:
                    self._off(self.module)

    def _off(self, module: Module) -> None:
        """End the stretch: stop counting, count its seconds, detach the tracepoint (which
        takes a while: the program counts nothing meanwhile). Under the lock."""
        module.table(f"{self.name}_on")[ctypes.c_int(0)] = ctypes.c_uint32(0)
        if self._since:
            self._covered += time.monotonic() - self._since
            self._since = 0.0
        if module.bpf.tracepoint_fds.get(TRACEPOINT):
            module.bpf.detach_tracepoint(TRACEPOINT)

    def seconds(self) -> float:
        """Seconds the tracepoint was attached so far."""
        with self._lock:
            return self._covered + (time.monotonic() - self._since if self._since else 0.0)

    def program_names(self, module: Module) -> list[str]:
        return [PROGRAM.decode()]

    def _read(self) -> _Snapshot:
        snap = _Snapshot(seconds=self.seconds())
        snap.counters = percpu_counters(self.table("counters"), COUNTERS)
        snap.senders = {int(k): int(v) for k, v in map_items(self.table("senders"))}
        return snap

    def contribute(self, profile: Profile) -> None:
        snap = self.latest()
        c = snap.counters
        total = sum(snap.senders.values())
        profile.loop = Loop(
            exchanges=c.get("exchanges", 0),
            server_ns=c.get("server_ns", 0),
            client_ns=c.get("client_ns", 0),
            senders={str(t): n for t, n in snap.senders.items() if n >= SENDER_SHARE * total},
            seconds=round(snap.seconds, 3),
        )
        put_counters(
            profile,
            "loop",
            {"requests": c.get("requests", 0), "map_full": c.get("map_full", 0)},
            "connections",
        )
