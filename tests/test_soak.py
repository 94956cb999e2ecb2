"""The short soak (bench/soak.py --cycles 5): record and top attach to a
kvcached under `kvload --verify` and end normally, on SIGINT and on SIGKILL;
the target keeps every kvs semaphore at 0 between them, kvload sees no
mismatch and no error, and the server's RSS stays bounded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parent.parent / "bench" / "soak.py"


@pytest.mark.bpf
def test_short_soak_leaves_nothing_behind() -> None:
    done = subprocess.run(
        [sys.executable, str(SOAK), "--cycles", "5", "--json"], capture_output=True, text=True, timeout=900
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0 and result["ok"], done.stdout + done.stderr
    assert result["cycles"] == 5 and not result["failed_exits"]
    assert result["verify_mismatches"] == 0 and result["kvload_errors"] == 0 and result["kvload_ops"] > 0
    assert result["leftover_semaphores"] == 0 and result["leftover_uprobes"] == 0
