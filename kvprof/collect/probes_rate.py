"""Hits per second of each USDT probe of a process, for `kvprof probes`.

Loads probes/probes_rate.bpf.c with one handler per probe (all its sites),
reads the per-CPU hit counters at the start and the end of the window, and
always detaches: BPF.cleanup() removes the uprobes, and closing the USDT
context is what lowers the probes' semaphores again (BCC 0.26 raises them
when a probe is enabled and lowers them only on bcc_usdt_close).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any

from kvprof.collect import PROBES_DIR, CollectError

SOURCE = PROBES_DIR / "probes_rate.bpf.c"
MAX_PROBES = 64  # as in probes_rate.bpf.c


@dataclass(frozen=True)
class ProbeRate:
    provider: str
    name: str
    hits: int
    per_sec: float


@dataclass(frozen=True)
class Rates:
    window_s: float
    probes: list[ProbeRate]
    skipped: list[tuple[str, str]]  # beyond MAX_PROBES: not counted


def _totals(table: Any, n: int) -> list[int]:
    import ctypes

    return [sum(int(v) for v in table[ctypes.c_int(i)]) for i in range(n)]


def count_hits(pid: int, probes: list[tuple[str, str]], duration: float) -> Rates:
    """Attach a counter to every (provider, name) probe of PID for `duration` seconds."""
    from bcc import BPF, USDT

    counted, skipped = probes[:MAX_PROBES], probes[MAX_PROBES:]
    try:
        usdt = USDT(pid=pid)
    except Exception as e:
        raise CollectError(f"cannot read the USDT probes of PID {pid}: {e}") from None
    bpf = None
    try:
        for i, (provider, name) in enumerate(counted):
            try:
                usdt.enable_probe(probe=f"{provider}:{name}", fn_name=f"on_hit_{i}")
            except Exception:
                raise CollectError(f"cannot enable {provider}:{name} in PID {pid} (did it exit?)") from None
        try:
            bpf = BPF(src_file=str(SOURCE).encode(), usdt_contexts=[usdt], cflags=[f"-DTARGET_PID={pid}"])
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CollectError(f"cannot attach to PID {pid}: {first} (try `kvprof doctor`)") from None
        table = bpf[b"hits"]
        before, t0 = _totals(table, len(counted)), time.monotonic()
        time.sleep(duration)
        after, t1 = _totals(table, len(counted)), time.monotonic()
    finally:
        if bpf is not None:
            bpf.cleanup()
        _close(usdt)
        del usdt, bpf
        gc.collect()
    window = t1 - t0
    rates = [
        ProbeRate(provider, name, a - b, (a - b) / window if window > 0 else 0.0)
        for (provider, name), a, b in zip(counted, after, before, strict=True)
    ]
    return Rates(window, rates, skipped)


def _close(usdt: Any) -> None:
    """Close the USDT context now (lowering the semaphores), not whenever it is collected."""
    from bcc import libbcc

    context = getattr(usdt, "context", None)
    if context:
        libbcc.lib.bcc_usdt_close(context)
        usdt.context = None  # USDT.__del__ closes it again: make that a no-op
