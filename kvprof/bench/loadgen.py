"""The load generators: kvload (ours) and memcaslap (libmemcached's, as a
yardstick): their command lines, and what they report.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kvprof.bench import BenchError
from kvprof.bench.variants import ClientConfig, Variant
from kvprof.collect.server_stats import TargetError
from kvprof.system.lab import lab_binary

MEMCASLAP_KEY_SIZE = 16  # about kvload's key length (`kvload:12345`)
MEMCASLAP_WINDOW = "1k"  # keys each memcaslap connection works on; its gets hit keys it has set
MEMCASLAP_OVERWRITE = 0.9  # most sets overwrite, so the key set grows slowly


def kvload_binary() -> Path:
    """The kvload to run (kvprof.system.lab.lab_binary)."""
    try:
        return lab_binary("kvload")
    except TargetError as e:
        raise BenchError(str(e)) from None


def tail(text: str, lines: int = 8) -> str:
    """The last lines of a tool's output, indented, for an error message."""
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


def key_space(client: ClientConfig) -> list[str]:
    """kvload's arguments for `client`'s keys and values: the run and its population agree."""
    size = str(client.value_size)
    return ["--num-items", str(client.num_items), "--min-size", size, "--max-size", size]


def kvload_argv(
    exe: Path, address: str, client: ClientConfig, duration: float | None = None, cycles: int | None = None
) -> list[str]:
    """kvload for one run on an already populated server: timed, or `cycles` batches per connection."""
    if (duration is None) == (cycles is None):
        raise ValueError("kvload_argv takes a duration or a cycle count")
    length = ["--duration", f"{duration:g}"] if duration is not None else ["--num-cycles", str(cycles)]
    return [str(exe), "--server", address, "--no-population", "--num-threads", str(client.threads),
            "--connections", str(client.connections), "--batch-size", str(client.batch), *key_space(client),
            "--set-pct", str(client.set_pct), "--key-dist", client.key_dist, *length,
            "--json", "--quiet"]  # fmt: skip


def kvload_populate_argv(exe: Path, address: str, client: ClientConfig) -> list[str]:
    """kvload storing every key of `client`'s key space once, so that its gets hit."""
    return [str(exe), "--server", address, "--populate-only", *key_space(client),
            "--connections", "4", "--batch-size", "100", "--quiet"]  # fmt: skip


def memcaslap_config(client: ClientConfig) -> str:
    """memcaslap's -F file: key and value size ranges, then set (0) and get (1) shares."""
    sets = client.set_pct / 100
    return (
        f"key\n{MEMCASLAP_KEY_SIZE} {MEMCASLAP_KEY_SIZE} 1\n"
        f"value\n{client.value_size} {client.value_size} 1\n"
        f"cmd\n0 {sets:.2f}\n1 {1 - sets:.2f}\n"
    )


def memcaslap_argv(exe: str, address: str, client: ClientConfig, config: Path, duration: float) -> list[str]:
    """memcaslap for one timed run; it takes whole seconds only."""
    argv = [
        exe,
        f"--servers={address}",
        f"--threads={client.threads}",
        f"--concurrency={client.total_connections}",
        f"--cfg_cmd={config}",
        f"--time={max(1, math.ceil(duration))}s",
        f"--win_size={MEMCASLAP_WINDOW}",
        f"--overwrite={MEMCASLAP_OVERWRITE}",
    ]
    if client.batch > 1:
        argv.append(f"--division={client.batch}")
    return argv


_MEMCASLAP_TOTAL = re.compile(r"Run time: ([\d.]+)s Ops: (\d+) TPS: (\d+)")


def parse_memcaslap(output: str) -> dict[str, float]:
    """memcaslap's summary: run time, ops, TPS, and its get/set/miss counts."""
    found = list(_MEMCASLAP_TOTAL.finditer(output))
    if not found:
        raise BenchError(f"no `Run time: ... TPS: ...` line in memcaslap's output:\n{tail(output)}")
    last = found[-1]
    out = {"duration_s": float(last.group(1)), "ops": float(last.group(2)), "tps": float(last.group(3))}
    for name in ("cmd_get", "cmd_set", "get_misses"):
        counts = re.findall(rf"^{name}: (\d+)", output, re.MULTILINE)
        if counts:
            out[name] = float(counts[-1])
    return out


def parse_kvload(stdout: str) -> dict[str, object]:
    """The JSON object on kvload's last stdout line."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise BenchError("kvload printed no JSON line")
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise BenchError(f"kvload's last line is not JSON ({e}): {lines[-1][:200]!r}") from None
    if not isinstance(result, dict) or "ops_per_sec" not in result:
        raise BenchError(f"kvload's JSON has no ops_per_sec: {lines[-1][:200]!r}")
    return result


def _num(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


@dataclass(frozen=True)
class Counts:
    """What a load generator reports about one run."""

    ops_per_sec: float
    duration_s: float
    ops: int
    gets: int
    sets: int
    hits: int
    misses: int
    latency_us: dict[str, float]  # p50, p99, p999, max; empty when the tool gives none


def kvload_counts(v: Variant, proc: subprocess.CompletedProcess[str]) -> Counts:
    """kvload's JSON line; BenchError on a failed run."""
    if proc.returncode == 2:
        raise BenchError(f"kvload cannot connect to {v.name}:\n{tail(proc.stderr)}")
    out = parse_kvload(proc.stdout) if proc.stdout.strip() else {}
    if proc.returncode != 0 or not out:
        detail = {k: out.get(k) for k in ("errors", "verify_mismatches")} if out else proc.stderr
        raise BenchError(f"kvload against {v.name} failed (status {proc.returncode}): {detail}")
    latency = out.get("latency_us")
    return Counts(
        ops_per_sec=_num(out["ops_per_sec"]),
        duration_s=_num(out.get("duration_s")),
        ops=int(_num(out.get("ops"))),
        gets=int(_num(out.get("gets"))),
        sets=int(_num(out.get("sets"))),
        hits=int(_num(out.get("hits"))),
        misses=int(_num(out.get("misses"))),
        latency_us={k: _num(x) for k, x in latency.items()} if isinstance(latency, dict) else {},
    )


def memcaslap_counts(v: Variant, proc: subprocess.CompletedProcess[str]) -> Counts:
    """memcaslap's summary (its TPS); BenchError on a failed run."""
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise BenchError(f"memcaslap against {v.name} failed (status {proc.returncode}):\n{tail(output)}")
    out = parse_memcaslap(output)
    gets = int(out.get("cmd_get", 0))
    misses = int(out.get("get_misses", 0))
    return Counts(
        ops_per_sec=out["tps"],
        duration_s=out["duration_s"],
        ops=int(out["ops"]),
        gets=gets,
        sets=int(out.get("cmd_set", 0)),
        hits=gets - misses,
        misses=misses,
        latency_us={},
    )
