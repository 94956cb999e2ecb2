"""A process's USDT probes: where they are, their semaphores, and how often they fire.

    listing = list_probes(pid)          # the ELF notes and the semaphores (no BPF)
    listing.count(duration)             # hits/s per probe over `duration` s (BPF)

Both raise CollectError (the target is gone, not ours, has no mapping...) with
a one-line message: the target's own in the words every command uses
(kvprof.system.attach), the rest from kvprof.collect.elf.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvprof.collect import CollectError
from kvprof.collect.elf import (
    ElfFile,
    ProbesError,
    Process,
    UsdtProbe,
    load_bias,
    open_process,
    probe_names,
    read_probes,
    read_semaphores,
)
from kvprof.system.attach import NEEDS_ROOT, may_load_bpf, target


@dataclass
class Row:
    """One probe (provider:name) with all its sites."""

    provider: str
    name: str
    semaphore: int
    semaphore_value: int | None  # before counting; None: the probe has no semaphore
    sites: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    hits: int | None = None
    per_sec: float | None = None

    @property
    def full_name(self) -> str:
        return f"{self.provider}:{self.name}"


@dataclass
class Listing:
    """The probes of one process, and what counting them found."""

    process: Process
    pie: bool
    bias: int
    sites: list[UsdtProbe]
    rows: dict[tuple[str, str], Row]
    before: dict[int, int]  # semaphore values (by link-time address) before counting
    after: dict[int, int] | None = None  # after counting; None: not counted, or the target left
    window: float | None = None  # seconds counted
    skipped: list[tuple[str, str]] = field(default_factory=list)  # probes not counted

    @property
    def names(self) -> list[tuple[str, str]]:
        return probe_names(self.sites)

    def count(self, duration: float, starting: Callable[[], None] | None = None) -> None:
        """Count each probe's hits for `duration` s (`starting()` once allowed to); the
        semaphores are read again after."""
        if not may_load_bpf():
            raise CollectError(f"{NEEDS_ROOT}; -d 0 lists the probes without counting")
        from kvprof.collect.usdt_rate import count_hits

        if starting is not None:
            starting()

        rates = count_hits(self.process.pid, self.names, duration)
        self.window, self.skipped = rates.window_s, rates.skipped
        for r in rates.probes:
            self.rows[(r.provider, r.name)].hits = r.hits
            self.rows[(r.provider, r.name)].per_sec = r.per_sec
        try:
            self.after = read_semaphores(self.process, self.sites, self.bias)
        except ProbesError:
            self.after = None  # the target exited meanwhile

    def changed(self) -> list[str]:
        """The probes whose semaphore another tracer moved while we counted."""
        if self.after is None or self.after == self.before:
            return []
        return [
            r.full_name
            for r in self.rows.values()
            if r.semaphore and self.after.get(r.semaphore) != self.before.get(r.semaphore)
        ]


def list_probes(pid: int) -> Listing:
    """The USDT probes in `pid`'s executable and their semaphores now (rows empty: none)."""
    target(pid)  # gone, a kernel thread, not ours: said as for every command
    try:
        process = open_process(pid)
        elf = ElfFile(process.image)
        sites = read_probes(elf)
        if not sites:
            return Listing(process, elf.pie, 0, [], {}, {})
        bias = load_bias(process, elf)
        before = read_semaphores(process, sites, bias)
    except ProbesError as e:
        raise CollectError(str(e)) from None
    rows: dict[tuple[str, str], Row] = {}
    for s in sites:
        row = rows.setdefault(
            (s.provider, s.name),
            Row(s.provider, s.name, s.semaphore, before.get(s.semaphore) if s.semaphore else None),
        )
        row.sites.append((s.location, s.arguments))
    return Listing(process, elf.pie, bias, sites, rows, before)
