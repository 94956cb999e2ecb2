"""`kvprof exporter -p PID [--listen HOST:PORT]`: a Prometheus exporter over a live session."""

from __future__ import annotations

import argparse
from typing import Any

from kvprof.commands import add_collectors, add_hz, add_pid, add_seconds, command, number, options

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

# kvprof.views.prometheus.ExporterOptions' defaults (tests/test_cli.py checks they agree): kept
# literal so that building the parser loads no view
HZ = 49  # lower than record's: the exporter runs for long


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
    add_hz(p, default=HZ, why="the exporter runs for long, so lower than record's")
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
    from kvprof.views.prometheus import ExporterOptions, run

    return run(options(ExporterOptions, args))
