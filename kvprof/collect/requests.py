"""The `requests` collector: server-side latency histograms per opcode, from
kvcached's `kvs:cmd__done` probe (probes/requests.bpf.c).

Counts are of *sampled* requests: kvcached fires cmd__* for 1 request in N
per worker (`--probe-sample N`, recorded in
`Profile.status.sample_rates["cmd__done"]`); multiply by N for totals. One
key of a multi-get is one request. p50/p99 are read off the log2 histogram
(geometric interpolation inside a bucket), so they are within a factor of 2.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field

from kvprof.collect import PROBES_DIR, CollectOptions
from kvprof.collect.usdt import KvsProgram, hist_percentile, not_applicable, probe_sample
from kvprof.model.profile import Profile, RequestStat

HIST_SLOTS = 64


def opcode_names() -> dict[int, str]:
    """The opcode table of probes/kvs.d (`0 get, 1 gets, ...`)."""
    text = (PROBES_DIR / "kvs.d").read_text()
    table = text.split("Opcodes", 1)[1].split("Statuses", 1)[0]
    flat = " ".join(line.strip().lstrip("*") for line in table.splitlines())
    return {int(n): name for n, name in re.findall(r"(\d+) ([a-z_]+)", flat)}


@dataclass
class _Snapshot:
    hist: dict[int, list[int]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)


class RequestsCollector:
    name = "requests"

    def __init__(self, pid: int, opts: CollectOptions) -> None:
        self.pid = pid
        self.opts = opts
        self._prog: KvsProgram | None = None
        self._last = _Snapshot()
        self._opcodes = opcode_names()
        self._rate = 0

    def applies(self) -> str | None:
        return not_applicable(
            self.pid, ["cmd__done"], "per-opcode latency needs the server's own cmd__done probe"
        )

    def start(self) -> None:
        self._rate = probe_sample(self.pid)
        self._prog = KvsProgram(self.pid, "requests", {"cmd__done": "on_done"}, [])

    def _read(self) -> _Snapshot:
        if self._prog is None:
            return self._last
        snap = _Snapshot()
        for k, n in self._prog.table("hist").items():
            snap.hist.setdefault(k.opcode, [0] * HIST_SLOTS)[min(k.slot, HIST_SLOTS - 1)] += n.value
        counters = self._prog.table("counters")
        for i, label in enumerate(("events", "map_full")):
            snap.counters[label] = int(counters[ctypes.c_int(i)].value)
        self._last = snap
        return snap

    def contribute(self, profile: Profile) -> None:
        snap = self._read()
        for opcode, hist in sorted(snap.hist.items()):
            name = self._opcodes.get(opcode, f"opcode_{opcode}")
            profile.requests[name] = RequestStat(
                count=sum(hist),
                hist_log2_ns=hist,
                p50_ns=hist_percentile(hist, 0.50),
                p99_ns=hist_percentile(hist, 0.99),
            )
        if self._rate:
            profile.status.sample_rates["cmd__done"] = self._rate
        for label, value in snap.counters.items():
            profile.status.counters[f"requests.{label}"] = value

    def close(self) -> None:
        if self._prog is not None:
            try:
                self._read()  # keep what was counted: the maps go with the program
            except Exception:  # a failed last read must not keep probes attached
                pass
            prog, self._prog = self._prog, None
            prog.close()
