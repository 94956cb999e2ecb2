"""Turn stack addresses into frames: `function` (C++ demangled), or
`module+0xSTART` when the binary has no symbol there (the start of the function
its unwind table's FDE covers; the address's own offset when none does), never
a dropped frame. Kernel frames end in
`_[k]`, as folded stacks mark them.

User symbols come from each module and its debug file
(kvprof.collect.debuginfo), read while the target runs, so collectors
symbolize at every read, and the cache here keeps what was resolved once the
target is gone; kernel symbols from BCC's /proc/kallsyms.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from bcc import BPF

from kvprof.collect import INLINE_FRAMES, inline
from kvprof.collect.debuginfo import ProcessSymbols
from kvprof.collect.gosym import GoSymbols
from kvprof.collect.unwind import MARKERS, Mapping, Unwinder
from kvprof.model.profile import INLINED

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
    """Frames of one process's stacks; with `inlines`, each address also gives the
    functions inlined there (kvprof.collect.inline), `name [inlined]` after its function."""

    def __init__(self, pid: int, unwinder: Unwinder | None = None, inlines: bool = INLINE_FRAMES) -> None:
        self.pid = pid
        self.unwinder = unwinder  # its mappings give module-relative offsets and the vdso's symbols
        self.inlines = inlines
        self._names = ProcessSymbols(pid)
        self._user = Memo(self._resolve)
        self._at = Memo(self._frames_at)
        self._dwarf: dict[str, inline.ModuleInlines | None] = {}  # mapped path -> its inline tables
        self._kernel = Memo(_kernel_frame)
        self._go = GoSymbols()  # a Go binary without .symtab: its .gopclntab
        # A stack in `ustacks` never changes (it is keyed by the stack's hash): a live
        # view reads the same stacks every second, so each is named once.
        self._unwound = Memo(self._unwind)

    def warm(self) -> None:
        """Read the target's mappings now, while it runs: each module's symbols
        are read at its first address, from the host's file of the same inode
        once the target is gone (kvprof.collect.procroot.mapped_file)."""
        self._names.refresh()

    def user(self, addr: int) -> str:
        return self._user[addr]

    def frames_at(self, addr: int, caller: bool) -> list[str]:
        """The frames of one address, root first: its function, then what was inlined
        there. `caller`: a return address, whose call is the instruction before it."""
        return self._at[(addr, caller)]

    def _frames_at(self, key: tuple[int, bool]) -> list[str]:
        addr, caller = key
        frames = [self.user(addr)]
        if self.inlines:
            frames += [name + INLINED for name in self._inlined(addr - caller)]
        return frames

    def _inlined(self, addr: int) -> list[str]:
        m = self._mapping(addr)
        if m is None or not m.path.startswith("/"):
            return []
        if m.path not in self._dwarf:
            self._dwarf[m.path] = inline.module_inlines(f"/proc/{self.pid}/map_files/{m.start:x}-{m.end:x}")
        tables = self._dwarf[m.path]
        return tables.chain(addr - m.bias) if tables is not None else []

    def _mapping(self, addr: int) -> Mapping | None:
        if self.unwinder is None:
            return None
        m = self.unwinder.mapping(addr)
        if m is None and not self.unwinder.tables:  # mappings read for names only: read them again
            try:
                self.unwinder.prepare()
            except OSError:  # the target is gone
                return None
            m = self.unwinder.mapping(addr)
        return m

    def _resolve(self, addr: int) -> str:
        """`function`, `module+0xoffset` (module-relative), or [unknown]: never a bare address."""
        m = self._mapping(addr)
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
        found = self._names.function(addr)  # debug files too (kvprof.collect.debuginfo)
        if found is not None:
            return found[0]
        go = self._go.name(self.pid, m, addr - m.bias) if m is not None else None
        if go:  # a Go binary without .symtab: its .gopclntab
            return go
        name = self._names.function_name(addr)  # module+0xoffset
        if name is not None:
            return name
        return f"{m.name}+0x{addr - m.bias:x}" if m is not None else "[unknown]"

    def unwound(self, ips: list[int], reason: str) -> list[str]:
        """Frames of a stack walked by probes/unwind.h (ips leaf first), root first;
        a walk that stopped before the root starts with its marker."""
        if reason == "outside known code" and self.unwinder and self.unwinder.did_not_fit(ips[-1]):
            reason = "table full"  # known code whose pages did not fit: [truncated]
        return list(self._unwound[(tuple(ips), reason)])

    def _unwind(self, key: tuple[tuple[int, ...], str]) -> list[str]:
        ips, reason = key
        frames = self._user_stack(list(ips))
        if reason != "root":
            frames.insert(0, MARKERS[reason])
        return frames

    def _user_stack(self, addrs: list[int]) -> list[str]:
        """Frames, root first, of user addresses leaf first (every one past the leaf a return address)."""
        return [f for i in range(len(addrs) - 1, -1, -1) for f in self.frames_at(addrs[i], caller=i > 0)]

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
        return self.kernel_stack(addrs) if kernel else self._user_stack(addrs)

    def kernel_stack(self, addrs: list[int]) -> list[str]:
        """Frames, root first, of kernel addresses leaf first."""
        return without_tracing([self.kernel(a) for a in reversed(addrs)])


def _kernel_frame(addr: int) -> str:
    name = BPF.ksym(addr)
    return (f"0x{addr:x}" if name in (b"[unknown]", b"") else name.decode(errors="replace")) + "_[k]"


class DataNames:
    """Names of data addresses of one process (futex words): the object symbol
    that contains it (from the module and its debug file: `stats_lock`,
    `server+0x8`), else `heap 0x...` / `stack 0x...` by the mapping it lies in."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._symbols = ProcessSymbols(pid)
        self._names = Memo(self._resolve)

    def name(self, addr: int) -> str:
        return self._names[addr]

    def _resolve(self, addr: int) -> str:
        return self._symbols.object_name(addr) or f"{region_of(self.pid, addr)} 0x{addr:x}"


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
