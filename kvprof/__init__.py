"""kvprof: find where a multi-threaded cache server loses its throughput."""

from pathlib import Path

__version__ = "0.1.0"

REPO = Path(__file__).resolve().parent.parent  # the checkout: probes/ and server/build/ live here
SERVER_BUILD = REPO / "server" / "build"
