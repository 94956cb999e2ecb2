"""scripts/provision.sh on a machine it has already provisioned (the second `make setup`,
CI's run after the session's, `vagrant provision`): it installs nothing, touches neither
the .venv nor the kvcached builds, says only its summary, and is quick."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROVISION = REPO / "scripts" / "provision.sh"
DPKG_STATUS = Path("/var/lib/dpkg/status")


def tree_state(root: Path) -> dict[str, tuple[int, int, int]]:
    """(mode, size, mtime ns) of every file, link and folder under `root`. Bytecode caches
    are left out: the interpreter writes them when any program imports from the venv."""
    state: dict[str, tuple[int, int, int]] = {}
    if not root.exists():
        return state
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in [".", *dirnames, *filenames]:
            path = Path(dirpath, name)
            st = path.lstat()
            state[str(path.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return state


def machine_state() -> dict[str, object]:
    return {
        "dpkg status": hashlib.sha256(DPKG_STATUS.read_bytes()).hexdigest(),
        ".venv": tree_state(REPO / ".venv"),
        "server/build": tree_state(REPO / "server" / "build"),
        "server/build-asan": tree_state(REPO / "server" / "build-asan"),
    }


def run_provision(timeout: float) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    done = subprocess.run(
        ["bash", str(PROVISION)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done, time.monotonic() - start


@pytest.fixture(scope="module")
def provisioned() -> None:
    if not DPKG_STATUS.exists() or shutil.which("dpkg-query") is None:
        pytest.skip("not a Debian or Ubuntu system: provision.sh supports only those")
    if os.geteuid() != 0 and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("provision.sh needs root or passwordless sudo")
    done, _ = run_provision(timeout=1800)  # a no-op after `make setup`; the real set-up otherwise
    assert done.returncode == 0, done.stdout + done.stderr


def test_second_run_changes_nothing_says_little_and_is_quick(provisioned: None) -> None:
    """A second provision.sh installs no package, leaves .venv and the kvcached builds untouched
    (same files, sizes, mtimes), prints only its timing and one-line summary, in under 30 s."""
    before = machine_state()
    done, took = run_provision(timeout=120)
    after = machine_state()
    assert done.returncode == 0, done.stdout + done.stderr
    for what, state in before.items():
        if state != after[what]:
            if isinstance(state, dict):
                assert isinstance(after[what], dict)
                changed = sorted(
                    k for k in state.keys() | after[what].keys() if state.get(k) != after[what].get(k)
                )
                pytest.fail(f"the second run changed {what}: {changed[:10]}")
            pytest.fail(f"the second run changed the {what} (a package was installed or removed)")
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) == 2 and lines[0].startswith("provision: took "), lines
    summary = lines[-1]
    assert summary.startswith("provision: ok: kernel "), summary
    for part in ("headers ", "BCC ", "PMU ", "sockets "):
        assert part in summary, summary
    assert took < 30, f"the second run took {took:.1f} s"
