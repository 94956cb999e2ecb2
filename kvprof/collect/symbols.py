"""Turn stack addresses into frames: `function`, or `module+0xoffset` when the
binary has no symbol there, never a dropped frame. Kernel frames end in
`_[k]`, as folded stacks mark them.

Symbols of a process are resolved while it runs (BCC reads /proc/PID/maps
lazily), so collectors symbolize at every read, and the cache here keeps
what was resolved once the target is gone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bcc import BPF

# The machinery that runs a BPF program, from the tracepoint, perf event or
# uprobe that fires it up to the program and the helpers it calls.
TRACING_FRAMES = (
    "__traceiter_", "perf_trace_", "trace_event_raw_event_", "bpf_trace_run", "__bpf_trace_", "bpf_prog_",
    "trace_call_bpf", "perf_syscall_enter", "perf_syscall_exit", "bpf_overflow_handler", "__uprobe_perf_func",
    "uprobe_perf_func", "uretprobe_perf_func",
)  # fmt: skip


def without_tracing(frames: list[str]) -> list[str]:
    """A kernel stack (root first) cut where the tracing machinery starts: a
    stack taken inside a BPF program (at a tracepoint, or a sample that hit a
    uprobe's program) ends in its own frames, which are not the target's cost.
    Cut at the first such frame, not only trailing ones: a program loaded after
    BCC read /proc/kallsyms resolves to whatever symbol precedes it."""
    for i, frame in enumerate(frames):
        if frame.startswith(TRACING_FRAMES):
            return frames[:i]
    return frames


class Symbolizer:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._user: dict[int, str] = {}
        self._kernel: dict[int, str] = {}

    def warm(self) -> None:
        """Read the target's memory map now, while it runs: BCC loads each
        module's symbols lazily from its file, so addresses seen before the
        target died still resolve after it is gone."""
        try:
            BPF._sym_cache(self.pid)
        except Exception:  # gone already: frames fall back to addresses
            pass

    def user(self, addr: int) -> str:
        frame = self._user.get(addr)
        if frame is None:
            try:
                name, offset, module = BPF._sym_cache(self.pid).resolve(addr, True)
            except Exception:  # the process is gone and was never resolved
                name, offset, module = None, addr, None
            if name:
                frame = name.decode(errors="replace")
            elif module:
                frame = f"{os.path.basename(module.decode(errors='replace'))}+0x{offset:x}"
            else:
                frame = f"0x{addr:x}"
            self._user[addr] = frame
        return frame

    def kernel(self, addr: int) -> str:
        frame = self._kernel.get(addr)
        if frame is None:
            name = BPF.ksym(addr)
            frame = (f"0x{addr:x}" if name in (b"[unknown]", b"") else name.decode(errors="replace")) + "_[k]"
            self._kernel[addr] = frame
        return frame

    def stack(self, table: Any, stack_id: int, kernel: bool = False) -> list[str]:
        """Frames of a stack id from a BPF_STACK_TRACE table, root first; [] for a failed id."""
        if stack_id < 0:
            return []
        try:
            addrs = list(table.walk(stack_id))
        except KeyError:
            return []
        if not kernel:
            return [self.user(a) for a in reversed(addrs)]
        return without_tracing([self.kernel(a) for a in reversed(addrs)])


def stack_looks_truncated(frames: list[str]) -> bool:
    """A user stack that is 1-2 frames deep or whose root frame is unknown:
    the usual sign of code built without frame pointers."""
    if not frames:
        return True
    return len(frames) <= 2 or frames[0].startswith("0x") or "+0x" in frames[0]


class ThreadNames:
    """Thread names (`/proc/PID/task/TID/comm`) read while the target runs and
    kept once it is gone; names it never saw come from `fallback`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._names: dict[int, str] = {}

    def refresh(self) -> None:
        task = Path(f"/proc/{self.pid}/task")
        try:
            tids = [int(t.name) for t in task.iterdir()]
        except OSError:  # the process is gone
            return
        for tid in tids:
            try:
                self._names[tid] = (task / str(tid) / "comm").read_text().rstrip("\n")
            except OSError:  # the thread exited meanwhile
                pass

    def get(self, tid: int, fallback: str = "") -> str:
        return self._names.get(tid) or fallback
