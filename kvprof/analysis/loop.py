"""The closed loop around a server: how much of a faster server its clients turn
into throughput.

A client that waits for each answer before its next request (memtier, kvload
and most benchmarks do) keeps a fixed number of requests in flight, N. Each
exchange spends R_s in the server (from the request's arrival to the answer's
last segment back at the client: queued, then served) and R_c in the client
and the network (kvprof.collect.loop measures both), so the loop runs at
X = N / (R_s + R_c) exchanges a second (Little's law; N is read off the same
law, X x (R_s + R_c)). When the server is faster, R_s shrinks, but not R_c:
a client that was close to saturation itself queues the requests a faster
server sends back sooner, and the loop gains less than the server did. A
server that saturates with the client idle gains all of it.

This is a closed queueing network of two stations solved by mean-value
analysis, with Schweitzer's approximation (an arriving exchange finds
q (N - 1) / N others queued where q are there on average) and Seidmann's for
a station of c threads (a single server of demand D / c and a delay of
D (c - 1) / c): per exchange, a station's residence is

    R = D / c x (1 + q (N - 1) / N) + D (c - 1) / c.

The server's c is its threads that were busy, the client's the threads seen
sending requests (on this machine). The demands D come from the measured
residences: the equation solved for D at the measured X and N. A fix that
removes a share r of the server's busy time removes that share of D_s, and
the loop is solved again: its throughput over today's, less one, is the gain.

The client must run on this machine for the answer's arrival to be seen;
elsewhere, kvprof.analysis.whatif takes the target's threads alone. Pure
functions over kvprof.model; docs/findings.md has the model and what it was
checked against.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvprof.model.profile import Loop

MIN_EXCHANGES = 100  # fewer whole exchanges in the window: no loop is taken from them
ROUNDS = 1000  # the fixed-point iterations' bound
CONVERGED = 1e-9  # the relative change in throughput at which they stop


@dataclass(frozen=True)
class Station:
    """One station of the loop: its demand per exchange (s) and how many threads serve it."""

    demand: float
    servers: float

    def residence(self, queued: float, n: float) -> float:
        """Per exchange, with `queued` exchanges there on average and `n` in the loop."""
        c = max(1.0, self.servers)
        return self.demand / c * (1 + queued * (n - 1) / n) + self.demand * (c - 1) / c


def demand(residence: float, servers: float, rate: float, n: float) -> float:
    """The demand that gives `residence` at `rate` exchanges a second with `n` in the loop."""
    c = max(1.0, servers)
    return residence / ((1 + rate * residence * (n - 1) / n) / c + (c - 1) / c)


def throughput(stations: tuple[Station, ...], n: float) -> float:
    """Exchanges a second of the loop with `n` in flight (mean-value analysis)."""
    queued = [n / len(stations)] * len(stations)
    rate = 0.0
    for _ in range(ROUNDS):
        r = [s.residence(q, n) for s, q in zip(stations, queued, strict=True)]
        new = n / sum(r)
        queued = [new * x for x in r]
        if abs(new - rate) <= CONVERGED * new:
            return new
        rate = new
    return rate


@dataclass(frozen=True)
class ClosedLoop:
    """The loop as measured: exchanges a second, in flight, and its two stations."""

    rate: float
    in_flight: float
    server: Station
    client: Station
    server_share: float = 0.0  # of an exchange's time, the share in the server

    def describe(self) -> str:
        """One sentence: the loop as measured."""
        return (
            f"Its clients kept {self.in_flight:.1f} requests in flight, each {self.server_share:.0%} "
            f"of its time in the server and the rest in the client ({self.client.servers:g} "
            f"thread{'s' if self.client.servers != 1 else ''}) and the network: a fix gains what "
            "this loop makes of a faster server."
        )

    def gain(self, removed: float) -> float:
        """The throughput gained when a share `removed` of the server's demand goes."""
        if removed <= 0:
            return 0.0
        before = throughput((self.server, self.client), self.in_flight)
        faster = Station(self.server.demand * (1 - removed), self.server.servers)
        after = throughput((faster, self.client), self.in_flight)
        return after / before - 1 if before > 0 else 0.0


def of(loop: Loop, seconds: float, server_threads: int) -> ClosedLoop | None:
    """The closed loop a recording measured, with the server's busy threads; None when it
    saw too few whole exchanges (no client on this machine, or no load)."""
    if loop.exchanges < MIN_EXCHANGES or seconds <= 0 or loop.server_ns <= 0 or loop.client_ns <= 0:
        return None
    rate = loop.exchanges / seconds
    rs, rc = loop.server_ns / 1e9 / loop.exchanges, loop.client_ns / 1e9 / loop.exchanges
    n = max(1.0, rate * (rs + rc))  # below one, the connections were idle at times: no queueing
    clients = max(1, len(loop.senders))
    server = Station(demand(rs, server_threads, rate, n), server_threads)
    client = Station(demand(rc, clients, rate, n), clients)
    return ClosedLoop(rate, n, server, client, rs / (rs + rc))
