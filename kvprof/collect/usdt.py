"""kvcached's own `kvs` USDT probes: find them in a target, attach BPF to them,
and detach so that nothing stays raised.

Used by the three kvs collectors (locks, cachelines, requests), by `kvprof
probes`, and by the session to decide `Target.kvs_probes`.

Two BCC 0.26 quirks shape this module:

- BCC rewrites `bpf_usdt_readarg()` per probe from the name of the C function
  given to `enable_probe`, so the program calls it only inside that function,
  never in a shared helper.
- Creating a USDT context raises the probes' is-enabled semaphores in the
  target, and only closing the context lowers them again (BPF.cleanup() does
  not). `KvsProgram.close()` closes it explicitly instead of hoping for the
  garbage collector, so a detached kvcached really pays nothing.

bcc is imported only when a program is loaded, so `kvs_probes()` and
`not_applicable()` work without it.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from kvprof.collect import PROBES_DIR, CollectError

PROVIDER = "kvs"
DEFAULT_PROBE_SAMPLE = 256  # kvcached's default --probe-sample

_NOTE = re.compile(r"Provider: (\S+)\s+Name: (\S+)")


def exe_of(pid: int) -> str:
    """The target's executable path ('' when the process is gone or not ours)."""
    try:
        return str(Path(f"/proc/{pid}/exe").readlink()).removesuffix(" (deleted)")
    except OSError:
        return ""


def kvs_probes(pid: int) -> list[str]:
    """Names of the `kvs` provider's probes in the target's executable (from
    `readelf -n`, which reads the stapsdt notes BCC itself uses)."""
    try:
        out = subprocess.run(
            ["readelf", "-n", f"/proc/{pid}/exe"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted({name for provider, name in _NOTE.findall(out) if provider == PROVIDER})


def has_kvs_probes(pid: int) -> bool:
    """Whether the target's executable carries any `kvs` probe (Target.kvs_probes)."""
    return bool(kvs_probes(pid))


def not_applicable(pid: int, probes: list[str], instead: str) -> str | None:
    """None when the target carries every one of `probes`, else a one-line reason
    naming the executable and what covers for it (`instead`)."""
    exe = exe_of(pid) or f"PID {pid}"
    if not os.path.exists(f"/proc/{pid}"):
        return f"no process {pid}"
    found = set(kvs_probes(pid))
    if not found:
        return f"no kvs probes in {exe}: {instead}"
    missing = [p for p in probes if p not in found]
    if missing:
        return f"{exe} lacks the kvs probes {', '.join(missing)}: {instead}"
    return None


def probe_sample(pid: int) -> int:
    """The target's `--probe-sample N` (1 in N requests fire the sampled probes),
    read from its command line; kvcached's default when not given."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return DEFAULT_PROBE_SAMPLE
    args = [a.decode(errors="replace") for a in argv]
    for i, arg in enumerate(args):
        value = None
        if arg == "--probe-sample" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--probe-sample="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                return max(int(value), 1)
            except ValueError:
                break
    return DEFAULT_PROBE_SAMPLE


def program_text(name: str) -> str:
    """The BPF C source probes/<name>.bpf.c."""
    return (PROBES_DIR / f"{name}.bpf.c").read_text()


class KvsProgram:
    """One BPF program attached to `kvs` probes of one process.

    `probes` maps probe name -> C function. Maps are read with `table(name)`;
    `close()` detaches, frees the program and lowers the semaphores; it is
    idempotent and tolerates a target that died.
    """

    def __init__(self, pid: int, name: str, probes: dict[str, str], cflags: list[str]) -> None:
        self.pid = pid
        self.name = name
        self._usdt: Any = None
        self.bpf: Any = None
        try:
            from bcc import BPF, USDT
        except ImportError as e:
            raise CollectError(f"BCC is not importable ({e}): run scripts/provision.sh") from None
        try:
            self._usdt = USDT(pid=pid)
            for probe, fn in probes.items():
                self._usdt.enable_probe(probe=f"{PROVIDER}:{probe}", fn_name=fn)
            self.bpf = BPF(
                text=program_text(name).encode(),
                cflags=[f"-DTARGET_PID={pid}", *cflags],
                usdt_contexts=[self._usdt],
            )
        except Exception as e:
            self.close()
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CollectError(f"cannot attach {name} to the kvs probes of PID {pid}: {first}") from None

    def table(self, name: str) -> Any:
        return self.bpf[name.encode()]

    def close(self) -> None:
        if self.bpf is not None:
            try:
                self.bpf.cleanup()
            finally:
                self.bpf = None
        if self._usdt is not None:
            from bcc import libbcc

            # What USDT.__del__ would do, now: lowers the target's semaphores.
            ctx, self._usdt.context = self._usdt.context, None
            if ctx is not None:
                libbcc.lib.bcc_usdt_close(ctx)
            self._usdt = None


def log2_slot(value: int) -> int:
    """The log2 histogram bucket of `value`, as the BPF programs count it:
    bucket i holds [2^i, 2^(i+1)), bucket 0 also holds 0 (kvcached's
    `stats timings` convention)."""
    return max(value.bit_length() - 1, 0)


def hist_percentile(hist: list[int], q: float) -> int:
    """The q-quantile (0..1) of a log2 histogram, interpolated geometrically
    inside its bucket; 0 for an empty histogram."""
    total = sum(hist)
    if total == 0:
        return 0
    rank = q * total
    seen = 0
    for i, n in enumerate(hist):
        if n and seen + n >= rank:
            lo, hi = (0 if i == 0 else 1 << i), 1 << (i + 1)
            frac = (rank - seen) / n
            if lo == 0:
                return int(hi * frac)
            return int(lo * (hi / lo) ** frac)
        seen += n
    return 1 << len(hist)
