"""Turn stack addresses into frames: `function`, or `module+0xoffset` when the
binary has no symbol there, never a dropped frame. Kernel frames end in
`_[k]`, as folded stacks mark them.

Symbols of a process are resolved while it runs (BCC reads /proc/PID/maps
lazily), so collectors symbolize at every read, and the cache here keeps
what was resolved once the target is gone.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path
from typing import Any

from bcc import BPF

from kvprof.collect.unwind import MARKERS, Unwinder

TRACING_FRAMES = (
    "__traceiter_", "perf_trace_", "trace_event_raw_event_", "bpf_trace_run", "__bpf_trace_", "bpf_prog_",
)  # fmt: skip


class Symbolizer:
    def __init__(self, pid: int, unwinder: Unwinder | None = None) -> None:
        self.pid = pid
        self.unwinder = unwinder  # its mappings give module-relative offsets and the vdso's symbols
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
            frame = self._resolve(addr)
            self._user[addr] = frame
        return frame

    def _resolve(self, addr: int) -> str:
        """`function`, `module+0xoffset` (module-relative), or [unknown]: never a bare address."""
        m = self.unwinder.mapping(addr) if self.unwinder else None
        if m is not None and m.symbols:  # the vdso, read from the target's memory
            pc = addr - m.bias
            i = bisect.bisect_right(m.symbols, (pc, 1 << 64, "")) - 1
            if i >= 0 and m.symbols[i][0] <= pc < m.symbols[i][1]:
                return m.symbols[i][2]
            return f"{m.name}+0x{pc:x}"
        if m is not None and m.path == "[uprobes]":
            return "[uprobes]"  # the kernel's trampoline that runs an optimized uprobe
        if m is not None and not m.path.startswith("/"):
            return "[unknown]"  # anonymous memory: JIT code
        try:
            name, offset, module = BPF._sym_cache(self.pid).resolve(addr, True)
        except Exception:  # the process is gone and was never resolved
            name, offset, module = None, addr, None
        if name:
            return name.decode(errors="replace")
        if m is not None:
            return f"{m.name}+0x{addr - m.bias:x}"
        if module:
            return f"{os.path.basename(module.decode(errors='replace'))}+0x{offset:x}"
        return "[unknown]"

    def unwound(self, ips: list[int], reason: str) -> list[str]:
        """Frames of a stack walked by probes/unwind.h (ips leaf first), root first;
        a walk that stopped before the root starts with its marker."""
        frames = [self.user(a) for a in reversed(ips)]
        if reason != "root":
            frames.insert(0, MARKERS[reason])
        return frames

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
        frames = [self.kernel(a) for a in reversed(addrs)]
        # A stack taken at a tracepoint ends in the tracing machinery that ran
        # the BPF program (`__traceiter_sched_switch`): not the target's cost.
        while frames and frames[-1].startswith(TRACING_FRAMES):
            frames.pop()
        return frames


def stack_looks_truncated(frames: list[str]) -> bool:
    """A user stack that is 1-2 frames deep or whose root frame is unknown:
    the usual sign of code built without frame pointers (stacks that
    probes/unwind.h walked say why they stopped instead)."""
    if not frames:
        return True
    return len(frames) <= 2 or frames[0].startswith(("0x", "[unknown]", "[truncated]")) or "+0x" in frames[0]


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
