"""The `requests` collector: server-side latency histograms per opcode, from
kvcached's `kvs:cmd__done` probe (probes/requests.bpf.c).

Counts estimate every request's: kvcached fires cmd__* for a sample of the
requests per worker (paced, or 1 in N with `--probe-sample N`), each with the
number of requests it stands for, and the program counts it that many times.
One key of a multi-get is one request. p50/p99 are read off the log2 histogram
as the largest value of their bucket (kvprof.model.histogram): a bound within a factor of 2.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from kvprof.collect import HIST_SLOTS, PROBES_DIR
from kvprof.collect.bpf import KvsCollector, map_items, percpu_counters, put_counters
from kvprof.collect.cdefs import x_macro
from kvprof.model.histogram import hist_percentile
from kvprof.model.profile import Profile, RequestStat

COUNTERS = ("events", "map_full")  # the order of enum requests_counter


# KV_OPCODES: the cmd__* `opcode` numbers, in order; kvcached's own (server/opcodes.h links to it)
OPCODES_H = PROBES_DIR / "opcodes.h"


@functools.cache  # the header is read once per path
def opcode_names(header: Path = OPCODES_H) -> dict[int, str]:
    """kvcached's opcode numbers and names, read from its `KV_OPCODES` X-macro list (entry N
    is opcode N): {0: "get", 1: "gets", ...}."""
    return {n: entry[1] for n, entry in enumerate(x_macro(header, "KV_OPCODES"))}


@dataclass
class _Snapshot:
    hist: dict[int, list[int]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)


class RequestsCollector(KvsCollector):
    name = "requests"
    empty = _Snapshot
    probes: ClassVar[dict[str, str]] = {"cmd__done": "requests_on_done"}
    instead = "per-opcode latency needs the server's own cmd__done probe"

    def _read(self) -> _Snapshot:
        snap = _Snapshot()
        for k, n in map_items(self.table("hist")):
            snap.hist.setdefault(k.opcode, [0] * HIST_SLOTS)[min(k.slot, HIST_SLOTS - 1)] += n
        snap.counters = percpu_counters(self.table("counters"), COUNTERS)
        return snap

    def contribute(self, profile: Profile) -> None:
        snap = self.latest()
        for opcode, hist in sorted(snap.hist.items()):
            name = opcode_names().get(opcode, f"opcode_{opcode}")
            profile.requests[name] = RequestStat(
                count=sum(hist),
                hist_log2_ns=hist,
                p50_ns=hist_percentile(hist, 0.50),
                p99_ns=hist_percentile(hist, 0.99),
            )
        put_counters(profile, "requests", snap.counters, "requests")
