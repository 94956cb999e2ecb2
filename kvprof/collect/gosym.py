"""Function names of a Go binary from its `.gopclntab`, for binaries without `.symtab`.

Go's linker writes the function table the runtime itself uses for tracebacks
into `.gopclntab`, and keeps it when `-ldflags=-s` drops `.symtab` and DWARF,
so a stripped Go binary is still named as `go tool pprof` names it
(`main.work`, `sync.(*Mutex).lockSlow`). The layout read here is the one of Go
1.18 and later (header magic 0xfffffff0, and 0xfffffff1 from Go 1.20): after
the magic, two pad bytes, the instruction quantum and the pointer size, eight
pointer-size words (number of functions, number of files, text start, then the
offsets of the function-name table, the compilation-unit table, the file table,
the pc tables and the function table). The function table holds a pair of
uint32 (entry pc minus text start, offset of the function's `_func`) per
function and then the end pc; a `_func` starts with its entry offset and the
offset of its name in the function-name table.
"""

from __future__ import annotations

import bisect
import os
import struct
from dataclasses import dataclass
from typing import Protocol

from kvprof.collect.elf import ElfFile, ProbesError

EM_X86_64 = 62  # e_machine


class Mapping(Protocol):
    """What is read of a mapping (kvprof.collect.unwind.Mapping; unwind imports this module)."""

    start: int
    end: int
    path: str


GO_MAGICS = (0xFFFFFFF0, 0xFFFFFFF1)  # Go 1.18-1.19, Go 1.20 and later
GO_NOTE = (
    "a Go program: goroutines are multiplexed over the OS threads shown, so a thread's samples "
    "and waits are those of whichever goroutines ran on it"
)


def _go_sections(path: str) -> tuple[bytes, int, bool] | None:
    """(.gopclntab's bytes, .text's address, whether x86-64) of an ELF file built by Go's
    linker; None for any other file."""
    try:
        elf = ElfFile(path)
    except ProbesError:
        return None
    tab, text = elf.section(".gopclntab"), elf.section(".text")
    if tab is None or text is None:
        return None
    return elf.data[tab.offset : tab.offset + tab.size], text.addr, elf.machine == EM_X86_64


def is_go(path: str) -> bool:
    """Whether the ELF file at `path` was built by Go's linker (it has a .gopclntab)."""
    try:
        return ElfFile(path).section(".gopclntab") is not None
    except ProbesError:
        return False


@dataclass(frozen=True)
class GoFunc:
    start: int  # link-time addresses
    end: int
    name: str
    pcsp: int  # offset of its pc -> stack-pointer-delta table in the pc tables


@dataclass(frozen=True)
class Pclntab:
    funcs: list[GoFunc]  # sorted by start
    pctab: bytes
    quantum: int
    ptr: int


def target_is_go(pid: int) -> bool:
    """Whether the process runs a Go program."""
    return is_go(f"/proc/{pid}/exe")


def read_pclntab(path: str) -> Pclntab | None:
    """The functions of the .gopclntab of the ELF file at `path`; None when it has none,
    or a layout older than Go 1.18."""
    found = _go_sections(path)
    if found is None:
        return None
    data, start, _ = found
    if len(data) < 8 or struct.unpack_from("<I", data)[0] not in GO_MAGICS or data[7] not in (4, 8):
        return None
    ptr = data[7]
    word = "<Q" if ptr == 8 else "<I"
    nfunc, _, _, nametab, _, _, pctab, functab = (
        struct.unpack_from(word, data, 8 + i * ptr)[0] for i in range(8)
    )
    # start: .text's address, as debug/gosym takes it too: the header's copy may be unrelocated
    try:
        return _functions(data, start, ptr, nfunc, nametab, pctab, functab)
    except (struct.error, ValueError):  # a truncated or foreign table
        return None


def _functions(
    data: bytes, start: int, ptr: int, nfunc: int, nametab: int, pctab: int, functab: int
) -> Pclntab:
    pairs = struct.unpack_from(f"<{2 * nfunc + 1}I", data, functab)
    funcs = []
    for i in range(nfunc):
        # _func: entry offset, name offset, args, deferreturn, pcsp, ...
        name_off, _, _, pcsp = struct.unpack_from("<iiII", data, functab + pairs[2 * i + 1] + 4)
        at = nametab + name_off
        name = data[at : data.find(b"\0", at)].decode(errors="replace")
        funcs.append(GoFunc(start + pairs[2 * i], start + pairs[2 * i + 2], name, pcsp))
    return Pclntab(funcs, data[pctab:functab], data[6], ptr)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[at]
        at += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, at


def sp_deltas(tab: Pclntab, fn: GoFunc) -> list[tuple[int, int]]:
    """(pc, stack pointer below the return address from there on) of one function, from
    its pcsp table: pairs of zig-zag value delta and pc delta (in instruction quanta),
    the value starting at -1, ending at a zero value delta."""
    out, pc, value, at, first = [], fn.start, -1, fn.pcsp, True
    while fn.pcsp and at < len(tab.pctab):
        delta, at = _varint(tab.pctab, at)
        if delta == 0 and not first:
            break
        first = False
        value += -((delta >> 1) + 1) if delta & 1 else delta >> 1
        step, at = _varint(tab.pctab, at)
        out.append((pc, value))
        pc += step * tab.quantum
    return out


# where goroutine and thread stacks start: nothing called them
GO_ROOTS = frozenset({"runtime.goexit", "runtime.mstart", "runtime.rt0_go", "runtime.morestack"})


def unwind_frames(path: str) -> list[tuple[int, int | None]]:
    """(pc, CFA offset from rsp, None at a stack's root) from there on, for every
    function of a Go binary, sorted: what .debug_frame would say, from the pc tables
    the runtime unwinds with (kept by -ldflags=-s); [] for any other file."""
    found = _go_sections(path)
    tab = read_pclntab(path) if found is not None and found[2] else None
    if tab is None:
        return []
    out: list[tuple[int, int | None]] = []
    for fn in tab.funcs:
        if fn.name in GO_ROOTS:
            out.append((fn.start, None))
            continue
        out += [(pc, sp + tab.ptr) for pc, sp in sp_deltas(tab, fn) if sp >= 0]
    return out


class GoSymbols:
    """Names from .gopclntab per mapped file, read once per path."""

    def __init__(self) -> None:
        self._tables: dict[str, list[tuple[int, int, str]]] = {}

    def table(self, pid: int, m: Mapping) -> list[tuple[int, int, str]]:
        found = self._tables.get(m.path)
        if found is None:
            found = []
            # the mapped file itself while the target runs; its path once it is gone
            for path in (f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}", m.path.removesuffix(" (deleted)")):
                if os.path.exists(path):
                    tab = read_pclntab(path)
                    found = [(f.start, f.end, f.name) for f in tab.funcs] if tab else []
                    break
            self._tables[m.path] = found
        return found

    def name(self, pid: int, m: Mapping, pc: int) -> str | None:
        """The Go function holding link-time address `pc` of mapping `m` of `pid`, or None."""
        if not m.path.startswith("/"):
            return None
        table = self.table(pid, m)
        i = bisect.bisect_right(table, (pc, 1 << 64, "")) - 1
        if i >= 0 and table[i][0] <= pc < table[i][1]:
            return table[i][2]
        return None
