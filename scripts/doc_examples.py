#!/usr/bin/env python3
"""Run the commands whose output the docs show, and put that output in the pages
(`make doc-examples`); needs root.

A page marks an example with `<!-- output: NAME -->` ... `<!-- /output: NAME -->`;
everything between the two lines is replaced by a code block: each command as
typed (`$ kvprof ...`) and what it printed (stdout and stderr, as a terminal
shows them). The commands run in a temporary directory, whose path is shown as
`./`; kvcached (`--preset baseline`, then `fixed`, 2 workers) runs under the
demo load while they need a target. Counts and timings are whatever this
machine gave in that minute.

    sudo .venv/bin/python scripts/doc_examples.py [NAME ...]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvprof.system import demo  # noqa: E402
from kvprof.system.servers import Server, free_port, start_kvcached  # noqa: E402

DOCS = REPO / "docs"
KVPROF = [str(REPO / ".venv" / "bin" / "kvprof")]
Blocks = dict[str, list[tuple[str, str]]]  # name -> [(command as shown, its output)]


def run(tmp: Path, shown: str, argv: list[str] | None = None, stdout_only: bool = False) -> tuple[str, str]:
    """Run `shown` (a kvprof command line, or `argv` when given) in `tmp`; the command and its output."""
    args = argv if argv is not None else [*KVPROF, *shown.split()[1:]]
    proc = subprocess.run(
        args,
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if stdout_only else subprocess.STDOUT,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "80"},
    )
    return shown, proc.stdout.replace(f"{tmp}/", "./").rstrip("\n")


def exporter(tmp: Path, server: Server) -> list[tuple[str, str]]:
    """The exporter's banner, a scrape, and its exit on SIGTERM."""
    port = free_port()
    shown = f"kvprof exporter -p {server.pid} --listen 127.0.0.1:{port}"
    proc = subprocess.Popen(
        [*KVPROF, *shown.split()[1:]], cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 120
        body = ""
        while time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(url, timeout=10).read().decode()
                if "kvprof_lock_wait_seconds_total" in body:
                    break
            except OSError:
                pass
            time.sleep(1.0)
        time.sleep(5.0)
        body = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    wanted = re.compile(r"^kvprof_(lock_wait_seconds|cacheline_transfers)_total\{")
    scrape = "\n".join(line for line in body.splitlines() if wanted.match(line))
    grep = (
        f"curl -s 127.0.0.1:{port}/metrics | grep -E '^kvprof_(lock_wait_seconds|cacheline_transfers)_total'"
    )
    said = out.rstrip("\n").splitlines()
    ending = [line for line in said if line.startswith("kvprof exporter: detach")]
    banner = [line for line in said if line not in ending]
    return [(shown + " &", "\n".join(banner)), (grep, scrape), ("kill -TERM %1", "\n".join(ending))]


def with_server(preset: str, steps: Callable[[Server], None]) -> None:
    server = start_kvcached(["--preset", preset, "-t", "2"])
    load = demo.start_load(server.address, None)
    try:
        time.sleep(2.0)  # kvload populates its keys first
        steps(server)
    finally:
        load.stop()
        load.cleanup()
        server.stop()
        server.log_path.unlink(missing_ok=True)


def collect(tmp: Path, wanted: set[str]) -> Blocks:
    blocks: Blocks = {}

    def want(name: str) -> bool:
        return not wanted or name in wanted

    def baseline(server: Server) -> None:
        pid = server.pid
        blocks["record"] = [run(tmp, f"kvprof record -p {pid} -d 5 -o baseline.json.gz")]
        if want("probes"):
            blocks["probes"] = [run(tmp, f"kvprof probes -p {pid}")]
        if want("exporter"):
            blocks["exporter"] = exporter(tmp, server)

    def fixed(server: Server) -> None:
        blocks["record-fixed"] = [run(tmp, f"kvprof record -p {server.pid} -d 5 -o fixed.json.gz -q")]

    with_server("baseline", baseline)
    with_server("fixed", fixed)
    if want("kvload"):
        server = start_kvcached(["--preset", "fixed", "-t", "2"])
        try:
            shown = (
                f"server/build/kvload --server {server.address} --batch-size 100 --set-pct 0 "
                "--num-items 10000 --min-size 32 --max-size 32 --duration 3"
            )
            blocks["kvload"] = [run(tmp, shown, [str(REPO / shown.split()[0]), *shown.split()[1:]])]
        finally:
            server.stop()
            server.log_path.unlink(missing_ok=True)
    if want("report"):
        blocks["report"] = [run(tmp, "kvprof report baseline.json.gz")]
    if want("flamegraph"):
        blocks["flamegraph"] = [
            run(tmp, "kvprof flamegraph baseline.json.gz -o baseline.svg"),
            run(tmp, "kvprof flamegraph baseline.json.gz --kind offcpu -o baseline-offcpu.svg"),
            run(tmp, "kvprof flamegraph baseline.json.gz --kind locks -o baseline-locks.svg"),
        ]
        blocks["folded"] = [
            run(tmp, "kvprof flamegraph baseline.json.gz --kind locks -o baseline-locks.folded"),
            run(tmp, "cat baseline-locks.folded", ["cat", "baseline-locks.folded"]),
        ]
        blocks["speedscope"] = [run(tmp, "kvprof flamegraph baseline.json.gz -o baseline.speedscope.json")]
        blocks["icicle"] = [run(tmp, "kvprof report baseline.json.gz --flame --width 80")]
    if want("diff"):
        blocks["diff"] = [
            run(tmp, "kvprof diff baseline.json.gz fixed.json.gz --negate -o diff-cpu.svg"),
            run(tmp, "kvprof diff baseline.json.gz fixed.json.gz --kind locks --negate -o diff-locks.svg"),
        ]
    if want("doctor"):
        blocks["doctor"] = [run(tmp, "kvprof doctor")]
    if want("demo"):
        blocks["demo"] = [run(tmp, "kvprof demo -d 5")]
        blocks["demo-fixed"] = [run(tmp, "kvprof demo -d 5 --preset fixed")]
    if want("bench"):
        shown = "kvprof bench -t 2 --variants baseline,fixed --runs=3 -d 2 -o bench-example.json"
        blocks["bench"] = [run(tmp, shown, stdout_only=True)]
    return blocks


def fill(blocks: Blocks) -> None:
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        new = text
        for name, commands in blocks.items():
            body = "\n".join(f"$ {cmd}" + (f"\n{out}" if out else "") for cmd, out in commands)
            pattern = re.compile(
                rf"(<!-- output: {re.escape(name)} -->\n).*?(<!-- /output: {re.escape(name)} -->)", re.S
            )
            new = pattern.sub(lambda m, b=body: f"{m.group(1)}```\n{b}\n```\n{m.group(2)}", new)
        if new != text:
            page.write_text(new)
            print(f"wrote {page.relative_to(REPO)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="only these examples (default: all)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvprof-examples-") as name:
        blocks = collect(Path(name), set(a.names))
    fill({k: v for k, v in blocks.items() if not a.names or k in a.names})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
