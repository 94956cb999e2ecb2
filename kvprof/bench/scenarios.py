"""The named experiments: which variants `kvprof bench --scenario ...` runs.

`study` is the Couchbase study's experiment: a read-only workload of batched
multi-gets on small values, every worker busy, at 1 and 2 worker threads
(more where the machine has the cores), in the study's three steps:
`baseline` (everything shared), `baseline+topkeys` (the top-keys mutex gone)
and `fixed` (every shared atomic gone too). `memcached` (`--against
memcached`) runs the same workload on kvcached `fixed` and Debian's memcached.
`loadgen` checks the load generator itself: kvload and memcaslap against the
same kvcached. `keycmp` is the Redis `lpFind` study's question on kvcached:
the hash lookup's key comparison inlined (`--key-compare inline`, a length
check and memcmp) or through a function pointer (`indirect`), `fixed` preset,
the study's workload, 2 workers.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvprof.bench.variants import (
    KEY_COMPARES,
    KVLOAD,
    MEMCASLAP,
    ClientConfig,
    Group,
    Plan,
    Variant,
    parse_server,
)

STUDY = "study"
MEMCACHED = "memcached"
LOADGEN = "loadgen"
ATOMICS = "atomics"
KEYCMP = "keycmp"
WHATIF = "whatif"  # kvprof.bench.whatif
CEILING = "ceiling"  # kvprof.bench.ceiling
SCENARIOS = (STUDY, LOADGEN, ATOMICS, KEYCMP, WHATIF, CEILING)  # MEMCACHED: --against memcached

STUDY_SERVERS = ("baseline", "baseline+topkeys", "fixed")
MEMCACHED_SERVERS = ("memcached", "fixed")  # memcached first: the ratio is kvcached / memcached
MEMCACHED_WORKERS = (2,)
REV_WORKERS = (2,)
LOADGEN_SERVER = "fixed"  # the fastest kvcached: the most likely to expose a slow client
LOADGEN_WORKERS = (2,)
KEYCMP_PRESET = "fixed"  # no shared site in the way of what the key comparison costs
KEYCMP_WORKERS = (2,)

# The study's client. Read-only, so every request is a hit on a hot table and
# the server's per-request bookkeeping (the contention sites) is a large part
# of its work; batches of 100 keys in one multi-get take the per-request
# syscalls out of the way, as pipelining does for Redis. Small fixed values
# keep memcpy and the network out of the picture.
STUDY_BATCH = 100
STUDY_VALUE_SIZE = 32
STUDY_NUM_ITEMS = 10_000
# Two connections per worker keep every worker busy: while the client reads
# one connection's reply and sends its next batch, the worker serves the
# other. One kvload thread per worker (up to the CPU count): parsing a
# 100-value reply costs kvload about as much CPU as serving it costs the
# server, so a single kvload thread serializes the loop; more threads or
# connections than these do not raise the throughput on the 2-core VM, its
# cores are full (docs/bench-results.md, "Client settings").
CONNECTIONS_PER_CLIENT_THREAD = 2

# memcaslap's workload for `loadgen`, given to both generators: 90 % gets,
# 100-byte values; 2 threads x 16 connections with one request at a time per
# connection (memcaslap's usual mode, the demo's), and 2 threads x 2
# connections of multi-gets of 100 keys (the study's regime; memcaslap's
# --division).
LOADGEN_VALUE_SIZE = 100
LOADGEN_SET_PCT = 10


def study_workers(ncpu: int | None = None) -> list[int]:
    """1 and 2 worker threads, then doubling up to the CPU count, and the CPU count itself."""
    ncpu = ncpu or os.cpu_count() or 1
    counts = [1, 2]
    while counts[-1] * 2 <= ncpu:
        counts.append(counts[-1] * 2)
    if ncpu > counts[-1]:
        counts.append(ncpu)
    return counts


def study_client(workers: int, ncpu: int | None = None) -> ClientConfig:
    """The study's kvload settings for a server with `workers` worker threads."""
    threads = max(1, min(workers, ncpu or os.cpu_count() or 1))
    total = 2 * workers  # two per worker, however many client threads share them
    return ClientConfig(
        tool=KVLOAD,
        threads=threads,
        connections=max(CONNECTIONS_PER_CLIENT_THREAD, -(-total // threads)),
        batch=STUDY_BATCH,
        num_items=STUDY_NUM_ITEMS,
        value_size=STUDY_VALUE_SIZE,
        set_pct=0,
    )


@dataclass(frozen=True)
class Overrides:
    """What the command line changed; None keeps the scenario's choice. Lists make a matrix."""

    servers: tuple[str, ...] | None = None
    workers: tuple[int, ...] | None = None
    client_threads: tuple[int, ...] | None = None
    connections: tuple[int, ...] | None = None  # per client thread
    batch: tuple[int, ...] | None = None
    num_items: int | None = None
    value_size: int | None = None
    set_pct: int | None = None
    key_dist: str | None = None

    def client_changes(self) -> list[str]:
        names = ("client_threads", "connections", "batch", "num_items", "value_size", "set_pct", "key_dist")
        return [name for name in names if getattr(self, name) is not None]


def _clients(base: ClientConfig, o: Overrides) -> list[ClientConfig]:
    """The client settings to run: the scenario's, changed by the overrides (lists multiply)."""
    base = replace(
        base,
        num_items=base.num_items if o.num_items is None else o.num_items,
        value_size=base.value_size if o.value_size is None else o.value_size,
        set_pct=base.set_pct if o.set_pct is None else o.set_pct,
        key_dist=base.key_dist if o.key_dist is None else o.key_dist,
    )
    threads = o.client_threads or (base.threads,)
    connections = o.connections or (None,)
    batches = o.batch or (base.batch,)
    out = []
    for t, c, b in itertools.product(threads, connections, batches):
        if c is None:  # keep the scenario's total number of connections
            c = max(1, -(-base.total_connections // t))
        out.append(replace(base, threads=t, connections=c, batch=b))
    return out


def single_client(workers: int, o: Overrides) -> ClientConfig:
    """The study's client for `workers`, changed by the overrides, which must not make a matrix."""
    clients = _clients(study_client(workers), o)
    if len(clients) != 1:
        raise ValueError("--rev takes one client setting: give one value per kvload option")
    return clients[0]


def _workers_title(workers: int) -> str:
    return f"{workers} worker{'s' if workers != 1 else ''}"


def matrix(scenario: str, servers: Sequence[str], workers: Sequence[int], o: Overrides) -> Plan:
    """Servers x worker threads x client settings, grouped so each group compares one axis.

    With several server specs a group is one (workers, client settings) pair
    and compares the servers; with one server spec a group is one worker
    count and compares the client settings.
    """
    groups: list[Group] = []
    for w in workers:
        configs = [parse_server(spec, w) for spec in servers]
        clients = _clients(study_client(w), o)
        vary_client = len(clients) > 1
        if len(configs) > 1:
            for client in clients:
                title = f"{_workers_title(w)}, kvload {client.label}"
                suffix = f" {client.label}" if vary_client else ""
                variants = tuple(Variant(f"{s.label} t={w}{suffix}", title, s, client) for s in configs)
                groups.append(Group(title, variants))
        else:
            (server,) = configs
            title = f"{server.label}, {_workers_title(w)}"
            variants = tuple(Variant(f"{server.label} t={w} {c.label}", title, server, c) for c in clients)
            groups.append(Group(title, variants))
    names = [v.name for g in groups for v in g.variants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"the same variant twice: {', '.join(duplicates)}")
    return Plan(scenario, tuple(groups))


def study(o: Overrides) -> Plan:
    """The study's three steps at 1, 2, ... worker threads."""
    return matrix(STUDY, o.servers or STUDY_SERVERS, o.workers or study_workers(), o)


def against_memcached(o: Overrides) -> Plan:
    """kvcached `fixed` vs Debian's memcached, the study's workload, 2 workers each."""
    plan = matrix(MEMCACHED, o.servers or MEMCACHED_SERVERS, o.workers or MEMCACHED_WORKERS, o)
    return replace(plan, target=1.0, target_means="kvcached at least as fast as memcached")


def loadgen(o: Overrides) -> Plan:
    """kvload vs memcaslap against the same kvcached, unbatched and with multi-gets."""
    if o.servers or o.client_changes():
        raise ValueError("--scenario loadgen takes only -t/--threads: both clients get the same workload")
    groups = []
    for w in o.workers or LOADGEN_WORKERS:
        server = parse_server(LOADGEN_SERVER, w)
        for title, threads, connections, batch in (
            ("one request at a time per connection", 2, 16, 1),
            ("multi-gets of 100 keys", 2, 2, 100),
        ):
            variants = []
            for tool in (MEMCASLAP, KVLOAD):  # memcaslap first: the ratio is kvload / memcaslap
                client = ClientConfig(
                    tool=tool,
                    threads=threads,
                    connections=connections,
                    batch=batch,
                    value_size=LOADGEN_VALUE_SIZE,
                    set_pct=LOADGEN_SET_PCT,
                )
                name = f"{tool} {client.label}" + (f" t={w}" if o.workers else "")
                variants.append(Variant(name, f"{title} ({server.label} t={w})", server, client))
            groups.append(Group(variants[0].group, tuple(variants)))
    return Plan(LOADGEN, tuple(groups), target=1.0, target_means="kvload is at least as fast as memcaslap")


def keycmp(o: Overrides) -> Plan:
    """kvcached `fixed` with the key comparison inlined, then through a function pointer."""
    if o.servers:
        raise ValueError("--scenario keycmp chooses its own variants: drop --variants")
    groups = []
    for w in o.workers or KEYCMP_WORKERS:
        base = parse_server(KEYCMP_PRESET, w)
        for client in _clients(study_client(w), o):
            title = f"{KEYCMP_PRESET}, {_workers_title(w)}, kvload {client.label}"
            variants = tuple(
                Variant(f"{mode} t={w}", title, replace(base, key_compare=mode), client)
                for mode in KEY_COMPARES
            )
            groups.append(Group(title, variants))
    names = [v.name for g in groups for v in g.variants]
    if len(set(names)) != len(names):
        raise ValueError("--scenario keycmp takes one client setting per worker count")
    return Plan(KEYCMP, tuple(groups))


def build(scenario: str, against: str | None, o: Overrides) -> Plan:
    """The plan for `--scenario` (and `--against memcached`)."""
    if against == MEMCACHED:
        if scenario != STUDY:
            raise ValueError("--against memcached runs the study's workload: drop --scenario")
        return against_memcached(o)
    if scenario == STUDY:
        return study(o)
    if scenario == LOADGEN:
        return loadgen(o)
    if scenario == KEYCMP:
        return keycmp(o)
    raise ValueError(f"unknown scenario {scenario!r} (scenarios: {', '.join(SCENARIOS)})")
