"""What `kvprof exporter` serves: a session's counters as Prometheus metric families.

`profile_metrics(profile, labeler)` maps a cumulative Profile (the session
since its collectors attached) to metric families, and
`target_metrics(stats, families)` the target's own `stats`; neither reads
anything but its arguments (the labeler keeps the labels steady from one
scrape to the next and is handed the threads' CPUs by its caller). Serving
them over HTTP is
kvprof/commands/exporter.py's. Every counter counts from the moment the
collectors attached; they only go up, so `rate()` and `increase()` work on
them as on any exporter's.

Labels:

- `thread` (the TID), `thread_name`, `socket`: the socket of the CPU the
  thread was on when the exporter first saw it. A label never changes for a
  thread, so its series stay monotonic; pin threads to CPUs for an exact
  answer. Exact per-socket CPU time is `kvprof_socket_cpu_samples_total`.
- `function`: the leaf frame of an on-CPU sample (code without a symbol is
  `module+0xSTART`, its function's start). The `--top` functions with the
  most samples so far have series of their own; every other function counts
  as `other`. Samples go to a function's own series while it is in the top
  and to `other` while it is not, so no series ever goes down and each
  sample counts once (TopFunctions).
- `lock`, `site`, `opcode`: names the server defines (bounded by its code);
  `--max-labels` caps them anyway, and threads, with the rest in `other`.
- `finding`: a finding's id (`lock:topkeys`, `cacheline:collect_timings`,
  `futex:0x...`), capped the same way; its gauge is the throughput fixing it
  would give back, from the session so far (kvprof.analysis.whatif).

Cardinality is therefore at most threads x (top + 1) for the function
series and threads x locks (or sites) for the others.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from kvprof.analysis import ceilings
from kvprof.analysis.findings import find
from kvprof.analysis.findings.common import GAIN_KEY
from kvprof.analysis.lines import LINE, line_table
from kvprof.analysis.tables import functions, locks, transfers_matrix
from kvprof.analysis.whatif import gain_if_all_fixed, modelled
from kvprof.model.histogram import hist_sum_estimate
from kvprof.model.profile import CacheLineStat, Profile
from kvprof.model.topology import Topology

NS = "kvprof"
OTHER = "other"
UNKNOWN = "unknown"
UNKNOWN_FUNCTION = "[unknown]"
# request latency buckets: 2^8 ns (256 ns) .. 2^33 ns (8.6 s), one per log2 slot
BUCKET_EXPONENTS = range(8, 34)
# status.counters suffixes that count lost data, by collector
DROPPED = ("map_full", "start_full", "stack_errors", "user_stack_errors", "kernel_stack_errors", "comm_full")
EVENTS = ("events", "samples", "switches", "futex_waits")
_METRIC_CHARS = re.compile(r"[^a-zA-Z0-9_]")


# ---- bounded labels ---------------------------------------------------------------------------


class Capped:
    """At most `limit` values of one label; later ones are `other`, for good."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept: set[str] = set()
        self.folded: set[str] = set()

    def label(self, value: str) -> str:
        if value in self.kept:
            return value
        if value not in self.folded and len(self.kept) < self.limit:
            self.kept.add(value)
            return value
        self.folded.add(value)
        return OTHER

    def admit(self, values: Iterable[tuple[str, int]]) -> None:
        """Sees new values biggest first, so the slots go to the heaviest."""
        for value, _ in sorted(values, key=lambda kv: (-kv[1], kv[0])):
            self.label(value)


class TopFunctions:
    """The `function` label: the `n` functions with the most samples so far have
    series of their own, the rest count as `other`.

    Each scrape's new samples of a function go to its own series while it is
    in the top n and to `other` while it is not, so every series only goes up
    and every sample is counted in exactly one series: `increase()` summed
    over them is the samples taken. A function that leaves the top n is not
    shown until it returns (its series goes stale at the count it had)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.last: dict[tuple[str, str], int] = {}  # (function, thread) -> count at the last fold
        self.own: Counter[tuple[str, str]] = Counter()  # what the function's own series shows
        self.other: Counter[str] = Counter()  # thread -> what `other` shows
        self.members: set[str] = set()

    def fold(self, counts: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
        """(function, thread) -> cumulative samples, into (function or `other`, thread) -> value."""
        totals: Counter[str] = Counter()
        for (fn, _), n in counts.items():
            totals[fn] += n
        ranked = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))
        self.members = {fn for fn, _ in ranked[: self.n]}
        for key, n in counts.items():
            new = max(0, n - self.last.get(key, 0))  # a map that lost entries counts again from 0
            self.last[key] = n
            if key[0] in self.members:
                self.own[key] += new
            else:
                self.other[key[1]] += new
        out = {key: n for key, n in self.own.items() if key[0] in self.members}
        out.update({(OTHER, thread): n for thread, n in self.other.items()})
        return out


def leaf_function(frame: str) -> str:
    """A leaf frame as the `function` label: code without a symbol is the start of its
    function (`module+0xSTART`, kvprof.collect.debuginfo), one series per function."""
    return frame or UNKNOWN_FUNCTION


# ---- the metrics ------------------------------------------------------------------------------


def _seconds(ns: float) -> float:
    return ns / 1e9


def _buckets(hist: list[int]) -> list[tuple[str, float]]:
    """Cumulative Prometheus buckets (le in seconds) of a log2 ns histogram: slot i
    counts [2^i, 2^(i+1)) ns, so le=2^k ns holds slots below k."""
    out = [(repr(_seconds(1 << k)), float(sum(hist[:k]))) for k in BUCKET_EXPONENTS]
    out.append(("+Inf", float(sum(hist))))
    return out


def _stat_name(stat: str) -> str:
    return _METRIC_CHARS.sub("_", stat).strip("_").lower()


# `stats` names that count up (memcached's meaning); the other numbers are gauges
_COUNTER_STAT = re.compile(
    r"^(cmd_\w+|total_\w+|\w+_(hits|misses|badval|expired|flushed)|bytes_read|bytes_written|"
    r"evictions|reclaimed|expired_unfetched|rejected_connections)$"
)
_SKIP_STATS = {"pid", "time", "version", "pointer_size", "libevent"}


T = tuple[str, ...]
THREAD = ("thread", "thread_name", "socket")

# name (after `kvprof_`) -> (type, help, labels): everything the exporter serves about the session
METRICS: dict[str, tuple[str, str, T]] = {
    "cpu_samples_total": (
        "counter",
        "On-CPU samples by leaf function (the top ones; the rest are `other`) and thread",
        ("function", *THREAD),
    ),
    "socket_cpu_samples_total": ("counter", "On-CPU samples by the socket they were taken on", ("socket",)),
    "cpu_sampling_frequency_hertz": ("gauge", "On-CPU samples per second per CPU", ()),
    "offcpu_seconds_total": ("counter", "Time threads spent off the CPU", THREAD),
    "futex_waits_total": ("counter", "Futex waits (contended mutexes, condition waits)", THREAD),
    "futex_wait_seconds_total": ("counter", "Time spent in futex waits", THREAD),
    "lock_waits_total": ("counter", "Contended lock acquisitions (kvs lock probes)", ("lock", *THREAD)),
    "lock_wait_seconds_total": ("counter", "Time spent waiting for contended locks", ("lock", *THREAD)),
    "lock_wait_max_seconds": ("gauge", "Longest single wait since the exporter attached", ("lock",)),
    "cacheline_samples_total": (
        "counter",
        "Sampled updates of a shared counter's cache line (kvs atomic probe)",
        ("site", *THREAD),
    ),
    "cacheline_transfers_total": (
        "counter",
        "Sampled updates that found the line last written by another CPU",
        ("site", *THREAD),
    ),
    "cacheline_cross_socket_transfers_total": (
        "counter",
        "Transfers whose previous writer was on another socket",
        ("site",),
    ),
    "cacheline_socket_transfers_total": (
        "counter",
        "Transfers by the socket the line came from and the one it went to",
        ("site", "from_socket", "to_socket"),
    ),
    "cacheline_update_cycles": ("gauge", "Mean TSC cycles a sampled update took (rdtsc)", ("site",)),
    "sampled_line_samples_total": (
        "counter",
        "On-CPU samples stalled on atomic writes to a cache line (sampled registers, any target)",
        ("symbol", "function", *THREAD),
    ),
    "sampled_line_writers": ("gauge", "Threads that wrote the cache line with atomics", ("symbol",)),
    "sampled_line_false_sharing": (
        "gauge",
        "1 when different threads wrote distinct addresses of the line",
        ("symbol",),
    ),
    "sampled_unattributed_total": (
        "counter",
        "Samples whose IP or data address could not be found (unreadable, undecodable, segment, clobbered)",
        ("reason",),
    ),
    "request_duration_seconds": (
        "histogram",
        "Server-side latency of requests, from the kvs probes' samples, each counted as the "
        "requests it stands for; _sum is estimated from the log2 buckets",
        ("opcode",),
    ),
    "finding_gain_if_fixed": (
        "gauge",
        "Throughput fixing the finding would give back (0.12: +12 %), kvprof's model (docs/findings.md)",
        ("finding",),
    ),
    "gain_if_all_fixed": (
        "gauge",
        "Throughput fixing the critical and warning findings together gives back",
        (),
    ),
    "ceiling_ops_per_s": (
        "gauge",
        "Throughput a serialized resource (a single lock, a shared line) caps the server at, kvprof's "
        "model (docs/findings.md)",
        ("resource",),
    ),
    "ceiling_binds_at_threads": (
        "gauge",
        "Busy threads at which that ceiling binds, from today's throughput per busy thread",
        ("resource",),
    ),
    "probe_sample_ratio": ("gauge", "The server fires this probe for 1 in N events", ("probe",)),
    "collector_up": ("gauge", "1 when the collector is attached, 0 when it is not (yet)", ("collector",)),
    "collector_dropped_total": (
        "counter",
        "Data a collector could not keep (a full map, a lost stack id)",
        ("collector", "reason"),
    ),
    "collector_events_total": ("counter", "Events a collector's BPF program handled", ("collector",)),
    "session_start_time_seconds": ("gauge", "Unix time the session's counters count from", ()),
    "target_up": ("gauge", "1 while the target process runs", ()),
    "scrape_read_seconds": ("gauge", "Time this scrape took to read the session and the target", ()),
    "target_stats_up": ("gauge", "1 when the target answered `stats` on this scrape", ()),
    "target_lock_contended_total": (
        "counter",
        "`stats locks`: contended acquisitions, counted by the server",
        ("lock",),
    ),
    "target_lock_wait_seconds_total": ("counter", "`stats locks`: wait time, timed by the server", ("lock",)),
    "target_request_duration_seconds": (
        "histogram",
        "`stats timings`: every request's latency, timed by the server",
        ("opcode",),
    ),
}


# a METRICS type -> its family class (anything else is a histogram)
_FAMILIES: dict[str, type[CounterMetricFamily] | type[GaugeMetricFamily]] = {
    "counter": CounterMetricFamily,
    "gauge": GaugeMetricFamily,
}


class Families:
    """Metric families being filled for one scrape."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}

    def family(self, name: str, kind: str = "", doc: str = "", labels: T = ()) -> Metric:
        """The family `name` (METRICS says its type, help and labels unless given)."""
        fam = self.families.get(name)
        if fam is None:
            kind, doc, labels = METRICS.get(name, (kind, doc, labels))
            cls = _FAMILIES.get(kind, HistogramMetricFamily)
            fam = self.families[name] = cls(f"{NS}_{name}", doc, labels=list(labels))
        return fam

    def add(self, name: str, values: Mapping[T, float] | float, scale: float = 1.0) -> None:
        """Samples of a counter or gauge: {label values: value}, or one value without labels."""
        fam = self.family(name)
        assert isinstance(fam, CounterMetricFamily | GaugeMetricFamily)
        if not isinstance(values, Mapping):
            fam.add_metric([], values * scale)
            return
        for key, value in sorted(values.items()):
            fam.add_metric(list(key), value * scale)

    def histogram(self, name: str, labels: T, hist_log2_ns: list[int], sum_ns: float) -> None:
        fam = self.family(name)
        assert isinstance(fam, HistogramMetricFamily)
        fam.add_metric(list(labels), _buckets(hist_log2_ns), _seconds(sum_ns))


def no_cpus() -> dict[int, int]:
    return {}


class Labeler:
    """Everything that must stay the same across scrapes: the label of each thread,
    lock, site and function. One per exporter. `thread_cpus()` says the CPU each of the
    target's threads is on now (kvprof.collect.thread_sockets for a live target); a
    thread it does not name takes the socket it has most samples on."""

    def __init__(
        self,
        topology: Topology,
        top: int = 20,
        max_labels: int = 64,
        thread_cpus: Callable[[], dict[int, int]] = no_cpus,
    ) -> None:
        self.topology = topology
        self.thread_cpus = thread_cpus
        self.threads = Capped(max_labels)
        self.locks = Capped(max_labels)
        self.sites = Capped(max_labels)
        self.lines = Capped(max_labels)  # data symbols of sampled lines
        self.findings = Capped(max_labels)  # finding ids
        self.functions = TopFunctions(top)
        self.sockets: dict[str, str] = {}  # tid -> socket, pinned when first seen
        self.names: dict[str, str] = {}  # tid -> name, pinned when first seen

    def see_threads(self, profile: Profile) -> None:
        activity = {
            tid: info.cpu_samples + info.offcpu_ns // 1_000_000 + info.lock_wait_ns // 1_000_000
            for tid, info in profile.threads.items()
        }
        new = [tid for tid in activity if tid not in self.sockets]
        if not new:
            return
        cpus = self.thread_cpus()
        for tid in new:
            info = profile.threads[tid]
            socket = UNKNOWN
            if int(tid) in cpus:
                try:
                    socket = str(self.topology.socket_of(cpus[int(tid)]))
                except (KeyError, IndexError, ValueError):
                    pass
            if socket == UNKNOWN and info.sockets:
                socket = max(sorted(info.sockets), key=lambda s: info.sockets[s])
            self.sockets[tid] = socket
            self.names[tid] = info.name or UNKNOWN
        self.threads.admit((tid, activity[tid]) for tid in new)

    def thread(self, tid: str) -> tuple[str, str, str]:
        """(thread, thread_name, socket) label values of a TID."""
        socket = self.sockets.get(tid, UNKNOWN)
        if self.threads.label(tid) == OTHER:
            return (OTHER, OTHER, socket)
        return (tid, self.names.get(tid, UNKNOWN), socket)


def profile_metrics(profile: Profile, lab: Labeler) -> Families:
    """The session's counters as metric families (cumulative since the window started)."""
    fam = Families()
    lab.see_threads(profile)
    if "oncpu" in profile.collectors:
        _cpu(profile, lab, fam)
    if "offcpu" in profile.collectors:
        _offcpu(profile, lab, fam)
    if "locks" in profile.collectors:
        _locks(profile, lab, fam)
    if "cachelines" in profile.collectors:
        _cachelines(profile, lab, fam)
    if "regsample" in profile.collectors:
        _sampled_lines(profile, lab, fam)
    if "requests" in profile.collectors:
        for opcode, rs in sorted(profile.requests.items()):
            fam.histogram(
                "request_duration_seconds", (opcode,), rs.hist_log2_ns, hist_sum_estimate(rs.hist_log2_ns)
            )
    _gains(profile, lab, fam)
    fam.add("probe_sample_ratio", {(probe,): n for probe, n in profile.status.sample_rates.items()})
    fam.add("collector_up", {(n,): float(s.startswith("ok")) for n, s in profile.status.collectors.items()})
    dropped: dict[T, float] = {}
    events: dict[T, float] = {}
    for key, value in profile.status.counters.items():
        collector, _, what = key.partition(".")
        if what in DROPPED:
            dropped[(collector, what)] = value
        elif what in EVENTS:
            events[(collector,)] = value
    fam.add("collector_dropped_total", dropped)
    fam.add("collector_events_total", events)
    return fam


def _gains(profile: Profile, lab: Labeler, fam: Families) -> None:
    """Each contention finding's gain if fixed, and all of the worth-fixing ones together."""
    findings = find(profile)
    modelled_ones = [f for f in findings if modelled(f)]
    lab.findings.admit((f.id, round(f.cost.get(GAIN_KEY, 0.0) * 1e6)) for f in modelled_ones)
    gains: dict[T, float] = {}
    for f in modelled_ones:
        key = (lab.findings.label(f.id),)
        gains[key] = max(gains.get(key, 0.0), f.cost.get(GAIN_KEY, 0.0))
    fam.add("finding_gain_if_fixed", gains)
    fam.add("gain_if_all_fixed", gain_if_all_fixed(profile, findings))
    rungs = ceilings.ladder(profile, findings)
    fam.add("ceiling_ops_per_s", {(c.resource,): c.ceiling_ops_per_s for c in rungs})
    fam.add("ceiling_binds_at_threads", {(c.resource,): c.binds_at_threads for c in rungs})


def _cpu(profile: Profile, lab: Labeler, fam: Families) -> None:
    counts = functions(profile)
    by_fn: Counter[tuple[str, str]] = Counter()
    for tid, n in counts.thread_samples.items():  # samples without frames: `[unknown]`
        by_fn[(UNKNOWN_FUNCTION, tid)] += n
    for leaf, by_tid in counts.self_by_thread.items():
        for tid, n in by_tid.items():
            by_fn[(leaf_function(leaf), tid)] += n
            by_fn[(UNKNOWN_FUNCTION, tid)] -= n
    by_fn = +by_fn  # drop the zeros
    samples: Counter[T] = Counter()
    for (fn, tid), n in lab.functions.fold(dict(by_fn)).items():
        samples[(fn, *lab.thread(tid))] += n
    fam.add("cpu_samples_total", samples)
    per_socket: Counter[T] = Counter()
    for info in profile.threads.values():
        for socket, n in info.sockets.items():
            per_socket[(socket,)] += n
    fam.add("socket_cpu_samples_total", per_socket)
    fam.add("cpu_sampling_frequency_hertz", profile.hz)


def _offcpu(profile: Profile, lab: Labeler, fam: Families) -> None:
    off: Counter[T] = Counter()
    for tid, info in profile.threads.items():
        off[lab.thread(tid)] += info.offcpu_ns
    waits: Counter[T] = Counter()
    wait_ns: Counter[T] = Counter()
    for fw in profile.offcpu.futex:
        waits[lab.thread(str(fw.tid))] += fw.waits
        wait_ns[lab.thread(str(fw.tid))] += fw.ns
    fam.add("offcpu_seconds_total", off, 1e-9)
    fam.add("futex_waits_total", waits)
    fam.add("futex_wait_seconds_total", wait_ns, 1e-9)


def _locks(profile: Profile, lab: Labeler, fam: Families) -> None:
    kvs = [lk for lk in locks(profile) if not lk.futex]  # futexes are the offcpu metrics
    lab.locks.admit((lk.name, lk.waits) for lk in kvs)
    waits: Counter[T] = Counter()
    wait_ns: Counter[T] = Counter()
    longest: dict[T, float] = {}
    for lk in kvs:
        name = lab.locks.label(lk.name)
        longest[(name,)] = max(longest.get((name,), 0.0), lk.max_ns or 0)
        for tid, w in lk.by_thread.items():
            waits[(name, *lab.thread(tid))] += w.waits
            wait_ns[(name, *lab.thread(tid))] += w.wait_ns
    fam.add("lock_waits_total", waits)
    fam.add("lock_wait_seconds_total", wait_ns, 1e-9)
    fam.add("lock_wait_max_seconds", longest, 1e-9)


def _cachelines(profile: Profile, lab: Labeler, fam: Families) -> None:
    lab.sites.admit((c.site, c.samples) for c in profile.cachelines)
    samples: Counter[T] = Counter()
    transfers: Counter[T] = Counter()
    cross: Counter[T] = Counter()
    cycles: Counter[T] = Counter()  # site -> sum of cycles
    counted: Counter[T] = Counter()  # site -> samples
    by_label: dict[str, list[CacheLineStat]] = {}
    for c in profile.cachelines:
        site = lab.sites.label(c.site)
        by_label.setdefault(site, []).append(c)
        cross[(site,)] += c.cross_socket_transfers
        cycles[(site,)] += round(c.cycles_mean * c.samples)
        counted[(site,)] += c.samples
        for tid, lt in c.by_thread.items():
            samples[(site, *lab.thread(tid))] += lt.samples
            transfers[(site, *lab.thread(tid))] += lt.transfers
    matrix: dict[T, float] = {
        (site, str(src), str(dst)): n
        for site, lines in by_label.items()
        for src, row in enumerate(transfers_matrix(lines))
        for dst, n in enumerate(row)
    }
    fam.add("cacheline_samples_total", samples)
    fam.add("cacheline_transfers_total", transfers)
    fam.add("cacheline_cross_socket_transfers_total", cross)
    fam.add("cacheline_socket_transfers_total", matrix)
    fam.add("cacheline_update_cycles", {site: cycles[site] / n for site, n in counted.items() if n})


def _sampled_lines(profile: Profile, lab: Labeler, fam: Families) -> None:
    table = line_table(profile)
    lab.lines.admit((sl.symbol, sl.samples) for sl in table)
    samples: Counter[T] = Counter()
    writers: dict[T, float] = {}
    false_sharing: dict[T, float] = {}
    for sl in table:
        symbol = lab.lines.label(sl.symbol)
        writers[(symbol,)] = max(writers.get((symbol,), 0.0), float(sl.writers))
        false_sharing[(symbol,)] = max(false_sharing.get((symbol,), 0.0), float(sl.false_sharing))
    symbol_of = {sl.line: sl.symbol for sl in table}
    for a in profile.addresses.samples:
        symbol = lab.lines.label(symbol_of[a.address & ~(LINE - 1)])
        samples[(symbol, a.function, *lab.thread(str(a.tid)))] += a.count
    fam.add("sampled_line_samples_total", samples)
    fam.add("sampled_line_writers", writers)
    fam.add("sampled_line_false_sharing", false_sharing)
    fam.add("sampled_unattributed_total", {(r,): n for r, n in profile.addresses.unattributed.items()})


def target_metrics(stats: dict[str, dict[str, str]], fam: Families) -> None:
    """The target's own counters: memcached `stats` (general, locks, timings) or Redis `INFO`."""
    fam.add("target_stats_up", float(bool(stats)))
    for stat, text in sorted(stats.get("general", {}).items()):
        name = _stat_name(stat)
        try:
            value = float(text)
        except ValueError:
            continue
        if stat in _SKIP_STATS or not name:
            continue
        if stat.startswith("rusage_"):
            kind, name = "counter", f"target_{name}_seconds_total"
        elif stat == "uptime":
            kind, name = "gauge", "target_uptime_seconds"
        elif _COUNTER_STAT.match(stat):
            kind, name = "counter", f"target_{name}_total"
        else:
            kind, name = "gauge", f"target_{name}"
        fam.family(name, kind, f"`stats` {stat}")
        fam.add(name, value)
    contended: dict[T, float] = {}
    waited: dict[T, float] = {}
    for key, text in stats.get("locks", {}).items():
        lock, _, what = key.rpartition(":")
        if text.isdigit() and what == "contended":
            contended[(lock,)] = int(text)
        elif text.isdigit() and what == "wait_ns":
            waited[(lock,)] = int(text)
    if "locks" in stats:
        fam.add("target_lock_contended_total", contended)
        fam.add("target_lock_wait_seconds_total", waited, 1e-9)
    timings = stats.get("timings", {})
    for key, text in sorted(timings.items()):
        opcode, _, what = key.rpartition(":")
        if what != "log2_ns" or opcode == "total":
            continue
        try:
            hist = [int(x) for x in text.split(",")]
            sum_ns = int(timings.get(f"{opcode}:sum_ns", "0"))
        except ValueError:
            continue
        fam.histogram("target_request_duration_seconds", (opcode,), hist, sum_ns)
