"""Programs run beside the target instead of BPF (py-spy, perf): started so that they
stop when kvprof dies, and stopped as Ctrl-C stops them, so they write what they have."""

from __future__ import annotations

import ctypes
import signal
import subprocess
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _interrupt_with_parent() -> None:
    # in the child: if kvprof dies without stopping it, the kernel sends the SIGINT
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGINT, 0, 0, 0)


def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`argv` with its stdout and stderr in `log`, no stdin."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, preexec_fn=_interrupt_with_parent
        )


def stop(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGINT, as Ctrl-C (the program writes its output and exits), SIGKILL after `timeout` s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
