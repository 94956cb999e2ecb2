"""Hits per second of each USDT probe of a process, for `kvprof probes`.

Loads probes/usdt_rate.bpf.c with one handler per probe, attached to all
its sites of the executable as usdt.KvsProgram attaches (the kernel owns the
semaphores: they go back to 0 when the uprobes' fds close, however kvprof
ends), and reads the per-CPU hit counters at the start and the end of the
window.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from kvprof.collect import PROBES_DIR, CollectError, CollectOptions

SOURCE = PROBES_DIR / "usdt_rate.bpf.c"
MAX_PROBES = 64  # handlers written in usdt_rate.bpf.c


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
    """Each probe's hits summed over CPUs, every probe from one read of the map: read one
    by one, a probe read later than its pair (cmd__done after cmd__start) would count
    the requests served between the two reads, more when the reader is preempted."""
    from kvprof.collect.bpf import map_items  # imports bcc, as count_hits() does

    by_slot = {int(k): sum(int(v) for v in values) for k, values in map_items(table)}
    return [by_slot.get(i, 0) for i in range(n)]


def count_hits(pid: int, probes: list[tuple[str, str]], duration: float) -> Rates:
    """Attach a counter to every (provider, name) probe of PID's executable for `duration` seconds."""
    from bcc import BPF

    from kvprof.collect.elf import ElfFile, ProbesError, read_probes
    from kvprof.collect.usdt import attach_site

    counted, skipped = probes[:MAX_PROBES], probes[MAX_PROBES:]
    try:
        elf = ElfFile(f"/proc/{pid}/exe")
    except ProbesError as e:
        raise CollectError(f"cannot read the USDT probes of PID {pid}: {e}") from None
    slot = {probe: i for i, probe in enumerate(counted)}
    bpf = None
    fds: list[int] = []
    try:
        try:
            flags = [*CollectOptions().cflags(pid), f"-DUSDT_RATE_PROBES={MAX_PROBES}"]
            bpf = BPF(src_file=str(SOURCE).encode(), cflags=flags)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CollectError(f"cannot attach to PID {pid}: {first} (try `kvprof doctor`)") from None
        for site in read_probes(elf):
            i = slot.get((site.provider, site.name))
            if i is None:
                continue
            prog = bpf.load_func(f"on_hit_{i}".encode(), BPF.KPROBE)
            fds.append(attach_site(prog.fd, elf, site, pid))
        table = bpf[b"hits"]
        before, t0 = _totals(table, len(counted)), time.monotonic()
        time.sleep(duration)
        after, t1 = _totals(table, len(counted)), time.monotonic()
    finally:
        for fd in fds:
            os.close(fd)  # the kernel removes the uprobe and lowers its semaphore
        if bpf is not None:
            bpf.cleanup()
    window = t1 - t0
    rates = [
        ProbeRate(provider, name, a - b, (a - b) / window if window > 0 else 0.0)
        for (provider, name), a, b in zip(counted, after, before, strict=True)
    ]
    return Rates(window, rates, skipped)
