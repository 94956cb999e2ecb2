"""Soak: kvprof attaches to and detaches from a busy kvcached again and again,
ending every way it can end, and the target must not notice.

Starts kvcached (baseline preset, 2 workers) under `kvload --verify` for the
whole run, then --cycles times (default 50) attaches `kvprof record` or
`kvprof top` (in a pseudo-terminal, as a user runs it), alternately, waits
until all its collectors are attached, and ends it: the normal way (record's
--duration runs out, top's `q`), SIGINT or SIGKILL, in turn. After each end
it checks the target: every kvs semaphore back to 0 (read from
/proc/PID/mem: each uprobe of kvprof's holds one count) and no uprobe naming
kvcached's binary in tracefs. At the end it prints the cycles, kvload's
verify mismatches and errors (must be 0), the leftovers found (0) and
kvcached's RSS after the first cycle and after the last (bounded). Needs root.
Exit status 0 when every check held, 1 when one did not.

    sudo .venv/bin/python bench/soak.py [--cycles 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from top_cpu import Screen  # noqa: E402

from kvprof.collect.elf import ElfFile, load_bias, open_process, read_probes, read_semaphores  # noqa: E402
from kvprof.system.servers import Server, kvload_binary, start_kvcached  # noqa: E402

KVPROF = [sys.executable, "-m", "kvprof.cli"]
ENDS = ("normal", "SIGINT", "SIGKILL")
UPROBE_EVENTS = Path("/sys/kernel/tracing/uprobe_events")
RSS_GROWTH_MAX_MB = 32.0  # kvload's 1,000 keys are stored before the first cycle
ATTACH_TIMEOUT_S = 180.0
LOAD = ["--num-threads=1", "--connections=2", "--batch-size=8", "--set-pct=20", "--num-items=1000",
        "--min-size=64", "--max-size=256"]  # fmt: skip


def raised_semaphores(pid: int) -> dict[str, int]:
    """The kvs semaphores of the target that are not 0."""
    process = open_process(pid)
    elf = ElfFile(process.image)
    sites = [s for s in read_probes(elf) if s.provider == "kvs"]
    values = read_semaphores(process, sites, load_bias(process, elf))
    return {s.name: values[s.semaphore] for s in sites if values[s.semaphore]}


def tracefs_uprobes(exe: str) -> list[str]:
    """uprobe_events lines that name the target's binary (kvprof makes none there)."""
    try:
        lines = UPROBE_EVENTS.read_text().splitlines()
    except OSError:
        return []
    return [line for line in lines if exe in line]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_record(pid: int, end: str, out: Path) -> tuple[bool, int]:
    """`kvprof record` until attached, then ended as `end`: whether it attached, its exit status."""
    duration = "2" if end == "normal" else "120"
    proc = subprocess.Popen(
        [*KVPROF, "record", "-p", str(pid), "-d", duration, "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    attached = False
    while not attached:
        line = proc.stderr.readline()  # record ends by itself if it cannot attach
        if not line:
            break
        attached = "collecting" in line
    if end != "normal":
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT if end == "SIGINT" else signal.SIGKILL)
    proc.stderr.read()  # to its end: it exits
    return attached, proc.wait(60)


def run_top(pid: int, end: str) -> tuple[bool, int]:
    """`kvprof top` in a pseudo-terminal until attached, then ended as `end`: whether it
    attached, its exit status."""
    screen = Screen([*KVPROF, "top", "-p", str(pid)])
    attached = screen.seen_attached.wait(ATTACH_TIMEOUT_S)
    time.sleep(0.5)
    if end != "normal":
        screen.proc.send_signal(signal.SIGINT if end == "SIGINT" else signal.SIGKILL)
        screen.proc.wait(60)
    screen.stop()  # `q` when still running
    return attached, screen.proc.returncode


def soak(cycles: int, say: Any) -> dict[str, Any]:
    server: Server = start_kvcached(["--preset", "baseline", "-t", "2"])
    exe = str(Path(f"/proc/{server.pid}/exe").readlink())
    load = subprocess.Popen(
        [str(kvload_binary()), f"--server={server.address}", "--duration=86400", "--verify", "--json",
         "--quiet", *LOAD],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    result: dict[str, Any] = {
        "cycles": 0,
        "failed_exits": [],
        "leftover_semaphores": 0,
        "leftover_uprobes": 0,
    }
    out = Path(f"/tmp/kvprof-soak-{os.getpid()}.json")
    t0 = time.monotonic()
    try:
        time.sleep(1.0)  # kvload stores its keys first
        for i in range(cycles):
            tool, end = ("record", "top")[i % 2], ENDS[(i // 2) % len(ENDS)]
            started = time.monotonic()
            attached, status = (
                run_record(server.pid, end, out) if tool == "record" else run_top(server.pid, end)
            )
            expected = -signal.SIGKILL if end == "SIGKILL" else 0
            if not attached or (status != expected and not (end == "SIGINT" and status == 130)):
                how = "exited" if attached else "did not attach; exited"
                result["failed_exits"].append(f"cycle {i + 1}: {tool} ({end}) {how} {status}")
            if load.poll() is not None or not server.alive():
                raise RuntimeError(f"cycle {i + 1}: kvload or kvcached stopped")
            raised, probes = raised_semaphores(server.pid), tracefs_uprobes(exe)
            result["leftover_semaphores"] += sum(raised.values())
            result["leftover_uprobes"] += len(probes)
            if i == 0:
                result["rss_first_mb"] = rss_mb(server.pid)
            result["cycles"] = i + 1
            say(
                f"cycle {i + 1:3d}/{cycles}: {tool:6s} {end:7s} exit {status:4d}  "
                f"{time.monotonic() - started:5.1f} s  semaphores raised {sum(raised.values())}  "
                f"uprobes {len(probes)}"
            )
        result["rss_last_mb"] = rss_mb(server.pid)
    finally:
        if load.poll() is None:
            load.send_signal(signal.SIGTERM)
        stdout, stderr = load.communicate(timeout=60)
        server.stop()
        server.log_path.unlink(missing_ok=True)
        out.unlink(missing_ok=True)
    summary = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
    result.update(
        seconds=round(time.monotonic() - t0, 1),
        kvload_ops=summary.get("ops", 0),
        verify_mismatches=summary.get("verify_mismatches", -1),
        kvload_errors=summary.get("errors", -1),
        kvload_stderr=stderr.strip().splitlines()[-3:],
    )
    growth = result.get("rss_last_mb", 0.0) - result.get("rss_first_mb", 0.0)
    result["ok"] = bool(
        result["cycles"] == cycles
        and not result["failed_exits"]
        and result["verify_mismatches"] == 0
        and result["kvload_errors"] == 0
        and result["kvload_ops"] > 0
        and result["leftover_semaphores"] == 0
        and result["leftover_uprobes"] == 0
        and growth <= RSS_GROWTH_MAX_MB
    )
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=50, help="attach/detach cycles (default: 50)")
    ap.add_argument("--json", action="store_true", help="end with the result as one JSON object on stdout")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("soak: needs root (kvprof record and top load BPF programs)", file=sys.stderr)
        return 2
    r = soak(a.cycles, lambda line: print(line, file=sys.stderr, flush=True))
    ways = "record and top, ending normally, on SIGINT and on SIGKILL"
    print(f"cycles {r['cycles']} ({ways}) in {r['seconds']} s")
    for failed in r["failed_exits"]:
        print(f"  unexpected exit: {failed}")
    print(f"kvload --verify: {r['kvload_ops']:,} ops, {r['verify_mismatches']} verify mismatches, "
          f"{r['kvload_errors']} errors")  # fmt: skip
    print(f"leftover semaphore counts {r['leftover_semaphores']}, leftover uprobes {r['leftover_uprobes']}")
    print(f"kvcached RSS {r.get('rss_first_mb', 0):.1f} MB after cycle 1, {r.get('rss_last_mb', 0):.1f} MB "
          f"after the last (bound: +{RSS_GROWTH_MAX_MB:g} MB)")  # fmt: skip
    print("ok" if r["ok"] else "FAILED")
    if a.json:
        print(json.dumps(r))
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
