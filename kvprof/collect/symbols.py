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
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from bcc import BPF

from kvprof.collect.elf import STT_OBJECT, ElfFile, ProbesError
from kvprof.collect.unwind import MARKERS, Unwinder

# The machinery that runs a BPF program, from the tracepoint, perf event or
# uprobe that fires it up to the program and the helpers it calls.
TRACING_FRAMES = (
    "__traceiter_", "perf_trace_", "trace_event_raw_event_", "bpf_trace_run", "__bpf_trace_", "bpf_prog_",
    "trace_call_bpf", "perf_syscall_enter", "perf_syscall_exit", "bpf_overflow_handler", "__uprobe_perf_func",
    "uprobe_perf_func", "uretprobe_perf_func",
)  # fmt: skip


K = TypeVar("K")
V = TypeVar("V")


class Memo(dict[K, V], Generic[K, V]):
    """A dict that fills itself: memo[key] is make(key), made the first time it is asked for."""

    def __init__(self, make: Callable[[K], V]) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, key: K) -> V:
        value = self[key] = self.make(key)
        return value


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
    def __init__(self, pid: int, unwinder: Unwinder | None = None) -> None:
        self.pid = pid
        self.unwinder = unwinder  # its mappings give module-relative offsets and the vdso's symbols
        self._user = Memo(self._resolve)
        self._kernel = Memo(_kernel_frame)
        # A stack in `ustacks` never changes (it is keyed by the stack's hash): a live
        # view reads the same stacks every second, so each is named once.
        self._unwound = Memo(self._unwind)

    def warm(self) -> None:
        """Read the target's memory map now, while it runs: BCC loads each
        module's symbols lazily from its file, so addresses seen before the
        target died still resolve after it is gone."""
        try:
            BPF._sym_cache(self.pid)
        except Exception:  # gone already: frames fall back to addresses
            pass

    def user(self, addr: int) -> str:
        return self._user[addr]

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
            return str(name.decode(errors="replace"))
        if m is not None:
            return f"{m.name}+0x{addr - m.bias:x}"
        if module:
            return f"{os.path.basename(module.decode(errors='replace'))}+0x{offset:x}"
        return "[unknown]"

    def unwound(self, ips: list[int], reason: str) -> list[str]:
        """Frames of a stack walked by probes/unwind.h (ips leaf first), root first;
        a walk that stopped before the root starts with its marker."""
        if reason == "outside known code" and self.unwinder and self.unwinder.did_not_fit(ips[-1]):
            reason = "table full"  # known code whose pages did not fit: [truncated]
        return list(self._unwound[(tuple(ips), reason)])

    def _unwind(self, key: tuple[tuple[int, ...], str]) -> list[str]:
        ips, reason = key
        frames = [self.user(a) for a in reversed(ips)]
        if reason != "root":
            frames.insert(0, MARKERS[reason])
        return frames

    def kernel(self, addr: int) -> str:
        return self._kernel[addr]

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


def _kernel_frame(addr: int) -> str:
    name = BPF.ksym(addr)
    return (f"0x{addr:x}" if name in (b"[unknown]", b"") else name.decode(errors="replace")) + "_[k]"


class DataNames:
    """Names of data addresses of one process (futex words): the object symbol
    that contains it (`.symtab`, `.dynsym`: `stats_lock`, `server+0x8`), else
    `heap 0x...` / `stack 0x...` by the mapping it lies in."""

    def __init__(self, pid: int, unwinder: Unwinder) -> None:
        self.pid = pid
        self.unwinder = unwinder  # its mappings give each module's load bias
        self._objects: dict[str, list[tuple[int, int, str]]] = {}
        self._names = Memo(self._resolve)

    def _symbols(self, path: str, source: str) -> list[tuple[int, int, str]]:
        if path not in self._objects:
            self._objects[path] = object_symbols(source)
        return self._objects[path]

    def name(self, addr: int) -> str:
        return self._names[addr]

    def _resolve(self, addr: int) -> str:
        seen = set()
        for m in self.unwinder.mappings:
            if not m.path.startswith("/") or m.path in seen or m.why:
                continue
            seen.add(m.path)
            syms = self._symbols(m.path, f"/proc/{self.pid}/map_files/{m.start:x}-{m.end:x}")
            rel = addr - m.bias
            i = bisect.bisect_right(syms, (rel, 1 << 64, "")) - 1
            if i >= 0 and syms[i][0] <= rel < syms[i][1]:
                off = rel - syms[i][0]
                return syms[i][2] + (f"+0x{off:x}" if off else "")
        return f"{region_of(self.pid, addr)} 0x{addr:x}"


def object_symbols(path: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of the data objects in an ELF file's symbol tables, sorted."""
    try:
        elf = ElfFile(path)
    except ProbesError:
        return []
    return sorted(
        {
            (value, value + size, name)
            for table in (".symtab", ".dynsym")
            for value, size, name, _ in elf.symbols(table, (STT_OBJECT,))
            if size
        }
    )


def region_of(pid: int, addr: int) -> str:
    """`stack` for the main stack and thread stacks (an anonymous mapping right
    above a guard page, as glibc allocates them), else `heap`."""
    prev_end, prev_perms = -1, ""
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return "heap"
    for line in lines:
        parts = line.split(None, 5)
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= addr < hi:
            name = parts[5] if len(parts) > 5 else ""
            if name.startswith("[stack"):
                return "stack"
            if not name and prev_end == lo and prev_perms.startswith("---"):
                return "stack"
            return "heap"
        prev_end, prev_perms = hi, parts[1]
    return "heap"


def stack_looks_truncated(frames: list[str]) -> bool:
    """A user stack that is 1-2 frames deep or whose root frame is unknown:
    the usual sign of code built without frame pointers (stacks that
    probes/unwind.h walked say why they stopped instead)."""
    if not frames:
        return True
    return len(frames) <= 2 or frames[0].startswith(("0x", "[unknown]", "[truncated]")) or "+0x" in frames[0]
