"""`kvprof exporter -p PID [--listen HOST:PORT]`: a Prometheus exporter over a live session.

One process attaches kvprof's collectors to one target, serves `/metrics`
on loopback (unless told otherwise) and reads the session when scraped; what
a scrape returns is kvprof.views.metrics' (loaded when the command runs, so
that building the parser loads no view and no prometheus_client).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvprof.collect import HZ, OFFCPU_SAMPLE
from kvprof.commands import add_collectors, add_hz, add_pid, add_seconds, command, fail, number, options

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from kvprof.collect.session import Session

HELP = "serve a live session's counters to Prometheus"

DESCRIPTION = """\
Attach kvprof's collectors to a running process and serve their counters on
/metrics for Prometheus: CPU samples by function (the top N, the rest as
`other`), lock waits and wait seconds by lock, cache-line samples and transfers
by site, request latency histograms, per thread and socket; collector health;
and the target's own `stats` when it speaks the memcached protocol. Binds
loopback unless told otherwise. Needs root. SIGTERM or Ctrl-C detaches
everything; exit status 1 when the target exits, 2 when it cannot start."""

EXAMPLES = """\
examples:
  kvprof exporter -p $(pgrep -x kvcached)                 # http://127.0.0.1:9464/metrics
  kvprof exporter -p 1234 --listen 127.0.0.1:9500 --top 10
  kvprof exporter -p 1234 --collectors locks,cachelines,requests   # the kvs probes only: cheapest
  kvprof exporter -p 1234 --listen 0.0.0.0:9464           # other hosts may scrape it (say so)

Prometheus scrape config (docs/fleet.md):
  - job_name: kvprof
    static_configs: [{targets: ["127.0.0.1:9464"]}]
"""


@dataclass
class ExporterOptions:
    pid: int
    listen: str = "127.0.0.1:9464"
    hz: int = HZ
    collectors: tuple[str, ...] = ()
    top: int = 20  # functions with series of their own
    max_labels: int = 64  # threads, locks, sites: the rest are `other`
    min_interval: float = 1.0  # scrapes closer than this share one reading of the maps
    offcpu_sample: int = OFFCPU_SAMPLE
    quiet: bool = False


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[V6]:PORT` or `:PORT` (loopback) -> (host, port); ValueError when malformed."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def add_parser(commands: Any) -> None:
    p = command(commands, "exporter", HELP, DESCRIPTION, EXAMPLES)
    add_pid(p, "the process to watch")
    p.add_argument(
        "--listen",
        default="127.0.0.1:9464",
        metavar="HOST:PORT",
        help="where to serve /metrics (default: %(default)s; loopback unless told otherwise)",
    )
    add_collectors(p)
    add_hz(p)
    p.add_argument("--top", type=number(int, 1, 1000), default=20, metavar="N",
                   help="functions with series of their own; the rest count as `other` "
                   "(default: %(default)s)")  # fmt: skip
    p.add_argument("--max-labels", type=number(int, 1, 10000), default=64, metavar="N",
                   help="at most N threads, locks and sites as label values; the rest are `other` "
                   "(default: %(default)s)")  # fmt: skip
    add_seconds(p, "--min-interval", type=number(float, lo=0), default=1.0,
                help="scrapes closer together than SEC share one reading of the maps")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="no banner")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    return run(options(ExporterOptions, args))


class SessionCollector:
    """A prometheus_client collector over a live Session: reads it when scraped
    (at most once per `min_interval`; concurrent scrapes share the reading)."""

    def __init__(self, opts: ExporterOptions, session: Session) -> None:
        self.opts = opts
        self.session = session
        from kvprof.collect.thread_sockets import thread_cpus
        from kvprof.views.metrics import Labeler

        self.labeler = Labeler(
            session.opts.topology, opts.top, opts.max_labels, thread_cpus=lambda: thread_cpus(opts.pid)
        )
        self.attached = False  # set once the session has started its window
        self.states: dict[str, str] = dict.fromkeys(session.names, "attaching")  # until then
        self._lock = threading.Lock()
        self._cache: tuple[float, list[Metric]] | None = None
        self.scrapes = 0
        self.closed = False

    def on_state(self, name: str, state: str) -> None:
        """The session's progress while it attaches (Session.start's on_state)."""
        self.states[name] = state

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            now = time.monotonic()
            if self._cache is None or now - self._cache[0] >= self.opts.min_interval:
                self._cache = (now, self._read())
            self.scrapes += 1
            metrics = self._cache[1]
        yield from metrics

    def _read(self) -> list[Metric]:
        from kvprof.collect.session import alive
        from kvprof.views.metrics import Families, profile_metrics, target_metrics

        began = time.monotonic()
        if not self.attached or self.closed:
            fam = Families()
            fam.add("collector_up", {(name,): 0.0 for name in self.states})
        else:
            fam = profile_metrics(self.session.snapshot(), self.labeler)
            fam.add("session_start_time_seconds", self.session.started_at)
        fam.add("target_up", float(alive(self.opts.pid)))
        target_metrics(self.session.stats(("", "locks", "timings")), fam)
        fam.add("scrape_read_seconds", time.monotonic() - began)
        return list(fam.families.values())

    def close(self) -> None:
        """Detach; a scrape in flight finishes first."""
        from kvprof.system.attach import end_yield

        end_yield()  # the detach must end, idle CPU or not
        with self._lock:
            self.closed = True
            self.session.close()


def _say(opts: ExporterOptions, line: str) -> None:
    if not opts.quiet:
        print(line, file=sys.stderr, flush=True)


def _attach_and_wait(opts: ExporterOptions, session: Session, collector: SessionCollector, where: str) -> int:
    """Attaches the session's collectors, then waits for the target's exit (status 1)."""
    from kvprof.collect.session import alive
    from kvprof.system.attach import yield_cpu

    target = session.target
    n = len(session.names)
    _say(opts, f"Attaching to {target.comm} PID {target.pid} ({n} collectors, compiling BPF)...")
    session.start(on_state=collector.on_state)
    yield_cpu()
    collector.attached = True
    attached = [n for n, s in session.status.collectors.items() if s == "ok"]
    _say(
        opts,
        f"Serving http://{where}/metrics for {target.comm} "
        f"PID {target.pid} ({', '.join(attached)}); SIGTERM or Ctrl-C detaches",
    )
    for name, state in session.status.collectors.items():
        if state != "ok":
            _say(opts, f"  {name}: {state}")
    stop = threading.Event()
    while not stop.wait(0.5):
        if not alive(opts.pid):
            _say(opts, f"kvprof exporter: the target (PID {opts.pid}) exited; detaching")
            return 1
    return 0


def run(opts: ExporterOptions) -> int:
    """Serves until SIGTERM, Ctrl-C or the target's exit; returns the exit status."""
    from prometheus_client import start_http_server
    from prometheus_client.registry import CollectorRegistry

    from kvprof.collect import CollectError, CollectOptions
    from kvprof.collect.session import TargetGone
    from kvprof.system.attach import open_session, stop_on_signals

    try:
        host, port = parse_listen(opts.listen)
    except ValueError as e:
        return fail("exporter", str(e))
    try:  # py-spy and perf are record's: the exporter reads BPF's counters at every scrape
        session = open_session(
            opts.pid,
            opts.collectors,
            CollectOptions(hz=opts.hz, offcpu_sample=opts.offcpu_sample, python=False),
        )
    except CollectError as e:
        return fail("exporter", str(e))
    collector = SessionCollector(opts, session)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:  # before attaching, so a busy port is said at once and not after a compile
        server, thread = start_http_server(port, host, registry)
    except OSError as e:
        why = "is in use" if e.errno == 98 else f"cannot be bound ({e.strerror or e})"
        return fail("exporter", f"{host}:{port} {why}: choose another with --listen HOST:PORT")

    status = 0
    with stop_on_signals():
        try:
            status = _attach_and_wait(
                opts, session, collector, f"{host if ':' not in host else f'[{host}]'}:{port}"
            )
        except KeyboardInterrupt:
            _say(opts, "kvprof exporter: detaching")
        except (CollectError, TargetGone) as e:  # no collector attached, or the target left meanwhile
            status = fail("exporter", str(e))
        finally:
            server.shutdown()
            server.server_close()
            thread.join(5)
            collector.close()
    if status == 0:
        _say(opts, f"kvprof exporter: detached after {collector.scrapes} scrapes")
    return status
