"""libmemcached's conformance tester, `memccapable -a` (libmemcached-tools),
run against a real server: every ASCII-protocol test it has must pass."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

import pytest

from kvprof.system.servers import Server


def test_memccapable_ascii_passes(kvcached_factory: Callable[..., Server]) -> None:
    """`memccapable -a` prints "All tests passed" and exits 0 against kvcached."""
    exe = shutil.which("memccapable")
    if exe is None:
        pytest.skip("memccapable not found: install libmemcached-tools (scripts/provision.sh does)")
    server = kvcached_factory("-t", "2")
    argv = [exe, "-a", "-t", "5", "-h", server.host, "-p", str(server.port)]
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(argv)} did not finish in 120 s; output so far:\n{e.stdout or ''}")
    output = run.stdout + run.stderr
    failed = [line for line in output.splitlines() if "[pass]" not in line and line.strip()]
    assert "All tests passed" in output and run.returncode == 0, (
        f"{' '.join(argv)} exited {run.returncode}; lines other than [pass]:\n" + "\n".join(failed)
    )
    assert server.alive()
