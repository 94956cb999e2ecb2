"""Cache lines from sampled data addresses, for any target (the `regsample`
collector: no PMU, no probes).

An atomic read-modify-write whose cache line another core owns stalls for
the line's round trip, so on-CPU samples pile up on it; the registers of
each such sample give the address it wrote (kvprof.collect.decode). Here
those addresses are grouped by 64-byte line: per line the data symbols, the
functions and instructions that wrote it, the threads, CPUs and sockets,
the samples and the share of the writing threads' CPU samples spent there.

A line is *contended* when two or more threads wrote it; it is *false
sharing* when those threads wrote distinct addresses in it (each could have
its own line), true sharing when they wrote the same address (a shared
counter). `line_findings` turns contended lines into findings with the fix.

Pure functions over kvprof.model (docs/cachelines.md has the method and its limits).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from kvprof.analysis.tables import seconds
from kvprof.model.profile import HZ, Finding, Profile

LINE = 64
LOCK_FUNCTIONS = ("pthread_mutex", "pthread_spin", "pthread_rwlock", "__lll_lock", "kv_lock", "kv_trylock")
MIN_SAMPLES = 4  # fewer samples on a line than this: too few to call it contended
SHARE_CRITICAL = 0.10  # of the writing threads' CPU samples
SHARE_WARNING = 0.02


@dataclass
class LineAddress:
    address: int
    symbol: str
    samples: int = 0
    threads: dict[str, int] = field(default_factory=dict)  # tid -> samples


@dataclass
class SampledLine:
    line: int  # address of the 64-byte line
    symbol: str  # data symbol of its lowest sampled address ("shared_items", "heap 0x...")
    samples: int = 0
    addresses: list[LineAddress] = field(default_factory=list)  # most sampled first
    functions: dict[str, int] = field(default_factory=dict)  # function -> samples
    instructions: dict[str, int] = field(default_factory=dict)  # "function: lock add ..." -> samples
    threads: dict[str, int] = field(default_factory=dict)  # tid -> samples
    cpus: dict[str, int] = field(default_factory=dict)
    sockets: dict[str, int] = field(default_factory=dict)
    thread_share: dict[str, float] = field(default_factory=dict)  # tid -> share of its CPU samples
    share: float = 0.0  # the writing threads' samples here / all their samples

    @property
    def writers(self) -> int:
        return len(self.threads)

    @property
    def ranked_functions(self) -> list[str]:
        """The functions that wrote it, most samples first."""
        return sorted(self.functions, key=lambda f: -self.functions[f])

    @property
    def contended(self) -> bool:
        return self.writers >= 2 and self.samples >= MIN_SAMPLES

    @property
    def false_sharing(self) -> bool:
        """Distinct addresses of the line written by different threads."""
        if not self.contended or len(self.addresses) < 2:
            return False
        addrs = self.addresses
        return any(
            t1 != t2
            for i, a in enumerate(addrs)
            for b in addrs[i + 1 :]
            for t1 in a.threads
            for t2 in b.threads
        )

    @property
    def cross_socket(self) -> bool:
        return len(self.sockets) > 1

    @property
    def function(self) -> str:
        return max(self.functions.items(), key=lambda kv: (kv[1], kv[0]))[0] if self.functions else ""


def line_table(profile: Profile) -> list[SampledLine]:
    """The lines of `profile.addresses`, most samples first."""
    topo = profile.host.topology
    lines: dict[int, SampledLine] = {}
    by_addr: dict[int, LineAddress] = {}
    for s in profile.addresses.samples:
        line = s.address & ~(LINE - 1)
        sl = lines.get(line)
        if sl is None:
            sl = lines[line] = SampledLine(line=line, symbol=s.symbol)
        a = by_addr.get(s.address)
        if a is None:
            a = by_addr[s.address] = LineAddress(s.address, s.symbol)
            sl.addresses.append(a)
        tid, cpu = str(s.tid), str(s.cpu)
        sock = str(topo.get(cpu, {}).get("socket", 0))
        a.samples += s.count
        a.threads[tid] = a.threads.get(tid, 0) + s.count
        sl.samples += s.count
        sl.functions[s.function] = sl.functions.get(s.function, 0) + s.count
        insn = f"{s.function}: {s.instruction}"
        sl.instructions[insn] = sl.instructions.get(insn, 0) + s.count
        sl.threads[tid] = sl.threads.get(tid, 0) + s.count
        sl.cpus[cpu] = sl.cpus.get(cpu, 0) + s.count
        sl.sockets[sock] = sl.sockets.get(sock, 0) + s.count
    totals = profile.addresses.thread_samples
    for sl in lines.values():
        sl.addresses.sort(key=lambda a: (-a.samples, a.address))
        sl.symbol = min(sl.addresses, key=lambda a: a.address).symbol
        sl.thread_share = {t: n / totals[t] for t, n in sl.threads.items() if totals.get(t)}
        all_of_writers = sum(totals.get(t, 0) for t in sl.threads)
        sl.share = sl.samples / all_of_writers if all_of_writers else 0.0
    return sorted(lines.values(), key=lambda sl: (-sl.samples, sl.line))


def unattributed(profile: Profile) -> int:
    """Samples at an IP that could not be read or decoded, or at an atomic whose
    address the registers could not give (%fs:-relative, clobbered)."""
    return sum(profile.addresses.unattributed.values())


def _names(tids: list[str], profile: Profile) -> str:
    out = []
    for t in tids:
        th = profile.threads.get(t)
        name = th.name if th else ""
        out.append(f"{name} ({t})" if name else f"tid {t}")
    return ", ".join(out)


def _plain(symbol: str) -> str:
    return symbol.split("+", 1)[0] if not symbol.startswith(("heap ", "stack ")) else symbol


def line_findings(profile: Profile, skip_functions: set[str] | frozenset[str] = frozenset()) -> list[Finding]:
    """A finding per contended line; lines whose every function is in
    `skip_functions` (already reported from the kvs probes) are left out."""
    out: list[Finding] = []
    hz = profile.hz or HZ  # a profile that does not say was taken at the default
    dur = seconds(profile)
    for sl in line_table(profile):
        if not sl.contended or set(sl.functions) <= skip_functions:
            continue
        tids = sorted(sl.threads, key=lambda t: -sl.threads[t])
        funcs = sl.ranked_functions
        severity = (
            "critical" if sl.share >= SHARE_CRITICAL else "warning" if sl.share >= SHARE_WARNING else "info"
        )
        where = ", ".join(f"{f}()" for f in funcs)
        if sl.false_sharing:
            syms = list(dict.fromkeys(a.symbol for a in sorted(sl.addresses, key=lambda a: a.address)))
            title = f"false sharing: {' and '.join(f'`{s}`' for s in syms[:3])} share a cache line"
            explanation = (
                f"Distinct addresses in the 64-byte line at 0x{sl.line:x} are written by different threads "
                f"({_names(tids, profile)}) in {where}: every write by one core takes the line from the "
                f"others, though none of them needs the others' data. The writers spent ~{sl.share:.1%} "
                "of their CPU samples on those writes."
            )
            advice = (
                "Pad or align each thread's data to its own 64-byte line (alignas(64), or a "
                "padding member), or give each thread its own counters and sum them on read."
            )
        elif any(f.startswith(LOCK_FUNCTIONS) for f in funcs):
            title = f"contended lock word `{sl.symbol}` in {where}"
            explanation = (
                f"The lock at `{sl.symbol}` is taken by {sl.writers} threads ({_names(tids, profile)}): each "
                "acquisition is an atomic write that first pulls the lock's cache line from the core that "
                f"took it last. That cost ~{sl.share:.1%} of their CPU samples, before any waiting."
            )
            advice = (
                "Take the lock less often (batch the work under one acquisition), split it per thread or "
                "per stripe, or replace what it guards with per-thread data merged on read."
            )
        else:
            title = f"contended atomic counter `{_plain(sl.symbol)}` in {where}"
            explanation = (
                f"`{sl.symbol}` is written by {sl.writers} threads ({_names(tids, profile)}) with atomic "
                f"read-modify-writes in {where}: each write waits for the cache line to come from the "
                f"core that wrote it last. That cost ~{sl.share:.1%} of their CPU samples"
                + (", and the line crossed sockets." if sl.cross_socket else ".")
            )
            advice = (
                "Use per-thread counters (one per thread, each padded to 64 bytes) summed on read, "
                "or batch updates locally and publish them now and then."
            )
        out.append(
            Finding(
                id=f"sampled-line:0x{sl.line:x}",
                title=f"{title}, written by {sl.writers} threads, ~{sl.share:.1%} of their CPU",
                category="cacheline",
                severity=severity,
                where=funcs[0],
                cost={
                    "samples": float(sl.samples),
                    "share": sl.share,
                    "writers": float(sl.writers),
                    "addresses": float(len(sl.addresses)),
                    "false_sharing": float(sl.false_sharing),
                    "est_s_per_s": sl.samples / hz / dur,
                },
                per_thread={
                    t: {"samples": float(n), "share": sl.thread_share.get(t, 0.0)}
                    for t, n in sl.threads.items()
                },
                per_socket={s: {"samples": float(n)} for s, n in sl.sockets.items()},
                explanation=explanation,
                advice=advice,
                sites=funcs,
                thread_names={t: profile.threads[t].name for t in sl.threads if t in profile.threads},
            )
        )
    return out


def kvs_line_ranking(profile: Profile) -> list[int]:
    """The kvs `atomic__sample` lines, most transfers first (summed over sites):
    what the sampled ranking is compared with."""
    transfers: dict[int, int] = defaultdict(int)
    for c in profile.cachelines:
        transfers[c.line] += c.transfers
    return sorted(transfers, key=lambda ln: (-transfers[ln], ln))


def kind(sl: SampledLine) -> str:
    """`false sharing`, `shared` (two or more writers of one address), or `one thread`."""
    if sl.false_sharing:
        return "false sharing"
    return "shared" if sl.contended else "one thread" if sl.writers == 1 else "few samples"


def line_row(sl: SampledLine) -> dict[str, object]:
    """One line as plain values, for the report's JSON, the exporter and the TUI."""
    return {
        "line": f"0x{sl.line:x}",
        "symbol": sl.symbol,
        "symbols": [a.symbol for a in sl.addresses],
        "functions": sl.ranked_functions,
        "instructions": dict(sl.instructions),
        "samples": sl.samples,
        "share": sl.share,
        "writers": sl.writers,
        "threads": dict(sl.threads),
        "cpus": dict(sl.cpus),
        "sockets": dict(sl.sockets),
        "contended": sl.contended,
        "false_sharing": sl.false_sharing,
        "kind": kind(sl),
    }
