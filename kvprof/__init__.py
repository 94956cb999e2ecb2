"""kvprof: find where a multi-threaded cache server loses its throughput."""

__version__ = "0.1.0"
