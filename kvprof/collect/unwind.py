"""Unwind tables for the BPF stack walker (probes/unwind.h), and the frames of
the stacks it stores.

For every executable mapping of the target, the module's call-frame
information (`.eh_frame`, `.debug_frame`, as `readelf --debug-dump=frames-interp`
decodes it) becomes compact rows "from pc on, CFA = rsp+n | rbp+n, rbp saved at
CFA+k, return address at CFA-8"; a module without any gets frame-pointer
walking. Tables are built once per binary, keyed by its build-id, and kept in
CACHE_DIR (at most CACHE_BYTES, oldest dropped first). The rows of every
module go into `unw_rows`, and every 4 KiB page of the mappings into
`unw_pages` with the range of rows covering it. Bounds: UNWIND_ROWS rows
(12 bytes each) and UNWIND_PAGES pages per program; a target whose modules
do not fit gets frames marked `[truncated]` past what fits, and a warning.

Frames are symbols, `module+0xoffset` (module-relative), or the markers
`[unknown]` / `[truncated]` where the walk stopped early and why
(STOP_REASONS).
"""

from __future__ import annotations

import bisect
import ctypes
import hashlib
import os
import re
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from kvprof.collect import PROBES_DIR, CollectError
from kvprof.collect.gosym import unwind_frames
from kvprof.collect.procroot import PerFile

# The order of enum unw_kind and enum unw_reason in probes/unwind.h.
ROW_KINDS = ("none", "rsp", "rbp", "end", "plt")
STOP_REASONS = (
    "root",
    "no unwind info",
    "outside known code",
    "stack not readable",
    "depth limit",
    "table full",
)
MARKERS = {
    "no unwind info": "[unknown]",
    "outside known code": "[unknown]",
    "stack not readable": "[unknown]",
    "depth limit": "[truncated]",
    "table full": "[truncated]",
}
UNWIND_ROWS = 1 << 20
UNWIND_PAGES = 1 << 16
UNWIND_FRAMES = 64
PAGE_SHIFT = 12
PAGE_FP = 1
PAGE_NO_TABLE = 2
ROW = struct.Struct("<IBBhi")  # struct unw_row
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvprof" / "unwind"
CACHE_BYTES = 256 << 20
UNWIND_H = PROBES_DIR / "unwind.h"

_FDE = re.compile(r"^[0-9a-f]+ [0-9a-f]+ [0-9a-f]+ FDE cie=([0-9a-f]+) pc=([0-9a-f]+)\.\.([0-9a-f]+)")
_CIE = re.compile(r"^([0-9a-f]+) [0-9a-f]+ [0-9a-f]+ CIE")


def cflags(stacks: int) -> list[str]:
    """The bounds of probes/unwind.h; `stacks`: stack ids per collector (oncpu and
    offcpu share its `ustacks` in one module, so it holds twice that)."""
    return [
        f"-DUNWIND_ROWS={UNWIND_ROWS}",
        f"-DUNWIND_PAGES={UNWIND_PAGES}",
        f"-DUNWIND_FRAMES={UNWIND_FRAMES}",
        f"-DUNWIND_STACKS={2 * stacks}",
    ]


def with_unwinder(name: str) -> str:
    """probes/<name>.bpf.c with unwind.h pasted in where it is included: BCC
    rewrites map accesses in the main file only (unwind.h's include guard keeps
    the second program of a module from declaring its maps again)."""
    return (PROBES_DIR / f"{name}.bpf.c").read_text().replace('#include "unwind.h"', UNWIND_H.read_text())


def shared(module: Any, mine: Unwinder, progress: Any, who: str) -> Unwinder:
    """The one Unwinder of a kvprof.collect.bpf.Module (the first collector's
    `mine`: the programs of a module share its unw_* maps), its tables built or
    read from the cache and pushed; `progress` hears when tables were built."""
    unwinder: Unwinder = module.shared.setdefault("unwinder", mine)
    built = len(unwinder.built)
    try:
        unwinder.prepare()
    except OSError as e:
        raise CollectError(f"{who}: cannot read the target's mappings ({e.strerror})") from None
    if len(unwinder.built) > built and progress is not None:
        progress(unwinder.built_line())
    try:
        unwinder.load(module.bpf)
    except Exception as e:
        raise CollectError(f"{who}: cannot push the unwind tables ({e})") from None
    return unwinder


# ---- building a module's rows ------------------------------------------------


def _rule(cols: list[str], vals: list[str], plt: list[tuple[int, int]], pc: int) -> tuple[int, int, int]:
    """(kind, rbp_off, cfa_off) of one readelf row."""
    row = dict(zip(cols, vals, strict=False))
    cfa, ra, rbp = row.get("CFA", ""), row.get("ra", ""), row.get("rbp", "u")
    if ra == "u":
        return ROW_KINDS.index("end"), 0, 0
    rbp_off = int(rbp[1:]) if rbp.startswith("c") and rbp[1:].lstrip("-").isdigit() else 0
    for reg in ("rsp", "rbp"):
        if cfa.startswith(reg + "+") and cfa[4:].isdigit():
            return ROW_KINDS.index(reg), rbp_off, int(cfa[4:])
    if cfa == "exp" and any(lo <= pc < hi for lo, hi in plt):
        return ROW_KINDS.index("plt"), 0, 0
    return ROW_KINDS.index("none"), 0, 0


def build_rows(path: str) -> list[tuple[int, int, int, int]]:
    """The module's unwind rows (pc, kind, rbp_off, cfa_off), sorted by pc; [] without CFI."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        plt = [
            (s["sh_addr"], s["sh_addr"] + s["sh_size"])
            for s in elf.iter_sections()
            if s.name in (".plt", ".plt.sec", ".plt.got")
        ]
    out = subprocess.run(
        ["readelf", "--debug-dump=frames-interp", path], capture_output=True, text=True, check=False
    ).stdout
    rows: list[tuple[int, int, int, int, int]] = []  # pc, priority, kind, rbp_off, cfa_off
    cie_rows: dict[str, tuple[list[str], list[str]]] = {}
    cie: str | None = None
    fde: tuple[str, int, int] | None = None
    cols: list[str] = []
    seen_row = False

    def end_fde() -> None:
        if fde is None:
            return
        cie_id, lo, hi = fde
        if not seen_row and cie_id in cie_rows:  # only the CIE's initial instructions
            c, v = cie_rows[cie_id]
            rows.append((lo, 1, *_rule(c, v, plt, lo)))
        rows.append((hi, 0, ROW_KINDS.index("none"), 0, 0))  # past its end, unless a function starts there

    for line in out.splitlines():
        if m := _FDE.match(line):
            end_fde()
            fde, cie, seen_row, cols = (m.group(1), int(m.group(2), 16), int(m.group(3), 16)), None, False, []
        elif m := _CIE.match(line):
            end_fde()
            fde, cie, cols = None, m.group(1), []
        elif line.strip().startswith("LOC"):
            cols = line.split()[1:]
        elif cols and (parts := line.split()) and len(parts) == len(cols) + 1:
            try:
                pc = int(parts[0], 16)
            except ValueError:
                continue
            if fde is not None:
                rows.append((pc, 1, *_rule(cols, parts[1:], plt, pc)))
                seen_row = True
            elif cie is not None:
                cie_rows[cie] = (cols, parts[1:])
    end_fde()
    rows.sort()
    table: dict[int, tuple[int, int, int, int]] = {}
    for pc, _, kind, rbp_off, cfa_off in rows:
        table[pc] = (pc, kind, rbp_off, cfa_off)  # the later (real) row of a pc wins
    return [r for r in table.values() if r[0] < 1 << 32 and -32768 <= r[2] < 32768]


def fde_ranges(path: str) -> list[tuple[int, int]]:
    """The code ranges (start, end) of the module's FDEs (`.eh_frame`, `.debug_frame`),
    sorted: one per function, a compiler's `.cold` fragment one of its own ([] when
    readelf cannot read it)."""
    try:
        argv = ["readelf", "--debug-dump=frames", path]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = (_FDE.match(line) for line in out.splitlines())
    return sorted({(int(m.group(2), 16), int(m.group(3), 16)) for m in found if m})


_FUNCTIONS = PerFile(fde_ranges)


def function_start(path: str, pc: int) -> int | None:
    """The start of the function whose FDE covers link-time address `pc` in the module
    at `path`, None when none does: how a module without symbols is cut into functions."""
    ranges = _FUNCTIONS(path) or []
    i = bisect.bisect_right(ranges, (pc, 1 << 64)) - 1
    for lo, hi in ranges[max(i - 3, 0) : i + 1][::-1]:  # a nested FDE may precede the covering one
        if lo <= pc < hi:
            return lo
    return None


def go_rows(path: str) -> list[tuple[int, int, int, int]]:
    """The rows of a Go binary without CFI (-ldflags=-s drops .debug_frame) from its pc
    tables (kvprof.collect.gosym); [] for any other file. A Go frame saves the caller's
    rbp right below the return address."""
    frames = unwind_frames(path)
    end, rsp = ROW_KINDS.index("end"), ROW_KINDS.index("rsp")
    return [(pc, end, 0, 0) if cfa is None else (pc, rsp, -16 if cfa >= 16 else 0, cfa) for pc, cfa in frames]


def build_id(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            for section in ELFFile(f).iter_sections():
                if section.header["sh_type"] == "SHT_NOTE":
                    for note in section.iter_notes():
                        if note["n_type"] == "NT_GNU_BUILD_ID":
                            return str(note["n_desc"])
    except (OSError, ELFError):
        pass
    return None


@dataclass
class Table:
    rows: bytes  # packed struct unw_row, sorted by pc
    pcs: list[int]
    build_s: float  # 0.0 when it came from the cache
    cached: bool


def _trim_cache() -> None:
    files = sorted(CACHE_DIR.glob("*.rows"), key=lambda p: p.stat().st_mtime)
    total = sum(p.stat().st_size for p in files)
    while files and total > CACHE_BYTES:
        victim = files.pop(0)
        total -= victim.stat().st_size
        victim.unlink(missing_ok=True)


def module_key(path: str) -> str:
    """What names one build of the module at `path` in caches: its build-id, else
    its path, size and modification time."""
    key = build_id(path)
    if key is None:
        st = os.stat(path)
        key = hashlib.sha1(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    return key


def module_table(path: str) -> Table:
    """The rows of the module at `path`, from the cache when its build-id was seen before."""
    key = module_key(path)
    cached = CACHE_DIR / f"{key}.rows"
    try:
        data = cached.read_bytes()
        os.utime(cached)
        return Table(data, [ROW.unpack_from(data, i)[0] for i in range(0, len(data), ROW.size)], 0.0, True)
    except OSError:
        pass
    t0 = time.monotonic()
    rows = build_rows(path) or go_rows(path)
    data = b"".join(ROW.pack(pc, kind, 0, rbp_off, cfa_off) for pc, kind, rbp_off, cfa_off in rows)
    build_s = time.monotonic() - t0
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.rename(cached)
        _trim_cache()
    except OSError:  # a read-only home: build again next time
        pass
    return Table(data, [r[0] for r in rows], build_s, False)


# ---- the target's mappings -------------------------------------------------------


@dataclass
class Mapping:
    start: int
    end: int
    offset: int
    path: str  # as /proc/PID/maps names it ("[vdso]", "/usr/lib/... (deleted)")
    name: str  # what frames call it: the file's base name, or [vdso]
    bias: int = 0  # runtime address - module-relative pc
    table: Table | None = None
    why: str = ""  # why it has no table ("" when it has one)
    symbols: list[tuple[int, int, str]] = field(default_factory=list)  # (start, end, name) for [vdso]


def _maps(pid: int) -> list[Mapping]:
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5 or "x" not in parts[1]:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        path = parts[5] if len(parts) > 5 else ""
        if path == "[vsyscall]":
            continue
        name = path if path.startswith("[") or not path else os.path.basename(path.removesuffix(" (deleted)"))
        out.append(Mapping(lo, hi, int(parts[2], 16), path, name or "[anon]"))
    return out


def _bias(elf: ELFFile, m: Mapping) -> int:
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_LOAD" and seg["p_offset"] <= m.offset < seg["p_offset"] + max(
            1, seg["p_filesz"]
        ):
            return m.start - m.offset + int(seg["p_offset"]) - int(seg["p_vaddr"])
    return m.start - m.offset


def _elf_symbols(elf: ELFFile) -> list[tuple[int, int, str]]:
    syms = []
    for name in (".symtab", ".dynsym"):
        section = elf.get_section_by_name(name)
        if section is None:
            continue
        for s in section.iter_symbols():
            if s["st_info"]["type"] == "STT_FUNC" and s["st_value"] and s.name:
                syms.append((s["st_value"], s["st_value"] + max(1, s["st_size"]), s.name))
    best: dict[int, tuple[int, int, str]] = {}
    for sym in sorted(syms):  # one name per address: the vdso's own (`__vdso_clock_gettime`) over its alias
        if sym[0] not in best or sym[2].startswith("__vdso_"):
            best[sym[0]] = sym
    return sorted(best.values())


class Unwinder:
    """The unwind tables of one target, pushed into a program's maps, and the
    frames of the stacks that program stored."""

    def __init__(self, pid: int, tables: bool = True) -> None:
        self.pid = pid
        self.tables = tables  # False: the mappings and their load bias only (for naming frames)
        self.mappings: list[Mapping] = []
        self.built: list[tuple[str, int, float]] = []  # (module, rows, seconds) built, not cached
        self.warnings: list[str] = []
        self._starts: list[int] = []
        self._known: set[tuple[int, int, str]] = set()
        self._tables: dict[str, tuple[Table | None, str]] = {}  # path -> table, or why none
        self._pushed: set[int] = set()  # starts of the mappings whose pages are in the maps
        self._placed: dict[int, int] = {}  # id(table) -> its first row in unw_rows
        self._nrows = 0
        self._npages = 0
        self._unpushed: list[tuple[int, int]] = []  # address ranges whose pages did not fit

    def prepare(self) -> None:
        """Read the target's executable mappings and build (or load) the table of
        each module not seen before, once."""
        mappings = [m for m in _maps(self.pid) if (m.start, m.end, m.path) not in self._known]
        for m in mappings:
            self._known.add((m.start, m.end, m.path))
            self._prepare(m)
        self.mappings = sorted(self.mappings + mappings, key=lambda m: m.start)
        self._starts = [m.start for m in self.mappings]

    def built_line(self) -> str:
        """What prepare() built (not found in the cache), for progress output."""
        total = sum(s for _, _, s in self.built)
        each = ", ".join(f"{name} {rows:,} rows {s:.2f} s" for name, rows, s in self.built)
        return f"unwind tables built in {total:.1f} s ({each}); cached in {CACHE_DIR}"

    def refresh(self, bpf: Any) -> None:
        """Push what was mapped since: libraries opened late, the uprobe trampoline
        that the kernel maps once a probe is attached."""
        try:
            self.prepare()
        except OSError:  # the target is gone
            return
        self.load(bpf)

    def _prepare(self, m: Mapping) -> None:
        if m.path == "[vdso]":
            self._vdso(m)
            return
        if m.path == "[uprobes]":
            # The kernel's trampoline of optimized uprobes (6.18: a USDT probe's nop5 becomes
            # a call into it): push rcx, r11, rax; syscall. Here: CFA = rsp + 32.
            m.bias = m.start
            m.table = Table(ROW.pack(0, ROW_KINDS.index("rsp"), 0, 0, 32), [0], 0.0, True)
            return
        if not m.path or m.path.startswith("["):
            m.why = "anonymous memory (JIT code?): no unwind information"
            return
        # map_files opens what is mapped, also when it was deleted or replaced on disk
        source = f"/proc/{self.pid}/map_files/{m.start:x}-{m.end:x}"
        try:
            with open(source, "rb") as f:
                m.bias = _bias(ELFFile(f), m)
        except (OSError, ELFError) as e:
            m.why = f"not an ELF file we can read ({e.__class__.__name__})"
            return
        if not self.tables:
            return
        if m.path not in self._tables:
            try:
                table = module_table(source)
                self._tables[m.path] = (table, "") if table.rows else (None, "no .eh_frame or .debug_frame")
                if not table.cached:
                    self.built.append((m.name, len(table.pcs), table.build_s))
            except (OSError, ELFError) as e:
                self._tables[m.path] = (None, f"cannot read its unwind information ({e.__class__.__name__})")
        m.table, m.why = self._tables[m.path]

    def _vdso(self, m: Mapping) -> None:
        try:
            with open(f"/proc/{self.pid}/mem", "rb") as f:
                f.seek(m.start)
                image = f.read(m.end - m.start)
        except OSError as e:
            m.why = f"cannot read the vdso ({e.strerror})"
            return
        with tempfile.NamedTemporaryFile(suffix=".vdso") as tmp:
            tmp.write(image)
            tmp.flush()
            try:
                with open(tmp.name, "rb") as f:
                    elf = ELFFile(f)
                    m.bias = (
                        _bias(elf, m)
                        if m.offset
                        else m.start
                        - min(
                            (s["p_vaddr"] for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"), default=0
                        )
                    )
                    m.symbols = _elf_symbols(elf)
                t0 = time.monotonic()
                rows = build_rows(tmp.name)
            except (OSError, ELFError) as e:
                m.why = f"cannot parse the vdso ({e.__class__.__name__})"
                return
        data = b"".join(ROW.pack(pc, kind, 0, rbp_off, cfa_off) for pc, kind, rbp_off, cfa_off in rows)
        m.table = Table(data, [r[0] for r in rows], time.monotonic() - t0, False)

    def load(self, bpf: Any) -> None:
        """Push the tables and pages of the mappings not pushed yet into `bpf`'s
        unw_rows and unw_pages, then mark the tables ready."""
        rows_map, pages_map = bpf[b"unw_rows"], bpf[b"unw_pages"]
        chunks: list[bytes] = []
        first_row = self._nrows
        page_keys: list[int] = []
        page_vals: list[tuple[int, int, int, int]] = []
        full = False
        for m in self.mappings:
            if m.start in self._pushed:
                continue
            self._pushed.add(m.start)
            if m.table is None and not m.path.startswith("/"):
                continue  # anonymous: no pages, frames there are [unknown]
            flags, start, pcs = PAGE_FP, 0, None
            if m.table is not None:
                if id(m.table) not in self._placed and self._nrows + len(m.table.pcs) <= UNWIND_ROWS:
                    self._placed[id(m.table)] = self._nrows
                    chunks.append(m.table.rows)
                    self._nrows += len(m.table.pcs)
                if id(m.table) in self._placed:
                    flags, start, pcs = 0, self._placed[id(m.table)], m.table.pcs
                else:
                    flags, full = PAGE_NO_TABLE, True
            for page in range(m.start >> PAGE_SHIFT, ((m.end - 1) >> PAGE_SHIFT) + 1):
                if self._npages >= UNWIND_PAGES:
                    full = True
                    self._unpushed.append((page << PAGE_SHIFT, m.end))
                    break
                first = count = 0
                if pcs is not None:
                    lo = (page << PAGE_SHIFT) - m.bias
                    first = max(0, bisect.bisect_right(pcs, lo) - 1)
                    count = bisect.bisect_left(pcs, lo + (1 << PAGE_SHIFT)) - first
                page_keys.append(page)
                page_vals.append((m.bias, start + first, count, flags))
                self._npages += 1
        if full and not self.warnings:
            self.warnings.append(
                f"unwind: the target's {len(self.mappings)} executable mappings do not fit "
                f"({UNWIND_ROWS:,} rows, {UNWIND_PAGES:,} pages): stacks through the rest end in [truncated]"
            )
        n = self._nrows - first_row
        if n:
            data = b"".join(chunks)
            keys = (rows_map.Key * n)(*range(first_row, self._nrows))
            values = (rows_map.Leaf * n)()
            ctypes.memmove(values, data, len(data))
            rows_map.items_update_batch(keys, values)
        if page_keys:
            keys = (pages_map.Key * len(page_keys))(*page_keys)
            values = (pages_map.Leaf * len(page_keys))()
            for v, (bias, start, count, flags) in zip(values, page_vals, strict=True):
                v.bias, v.row_start, v.row_count, v.flags = bias, start, count, flags
            pages_map.items_update_batch(keys, values)
        ready = bpf[b"unw_ready"]
        ready[ready.Key(0)] = ready.Leaf(1)

    def walk(self, ip: int, sp: int, bp: int, read: Callable[[int], int | None]) -> tuple[list[int], str]:
        """The user stack (ips leaf first, why the walk stopped) from these registers,
        walked here by the rules probes/unwind.h walks by in BPF, over the same tables;
        `read` gives the 8 bytes at a stack address, or None. For a thread that BPF
        cannot walk: one asleep in another process (kvprof.collect.offsample)."""
        ips: list[int] = []
        for i in range(UNWIND_FRAMES):
            ips.append(ip)
            m = self.mapping(ip)
            if m is None or (m.table is None and not m.path.startswith("/")):
                return ips, "outside known code"
            if m.table is None:  # a module without unwind information: frame pointers
                saved = read(bp) if bp else None
                if saved is None:
                    return ips, "no unwind info" if not bp else "stack not readable"
                cfa, bp = bp + 16, saved
            else:
                pc = ip - m.bias - (1 if i else 0)  # a return address: look up its call
                row = bisect.bisect_right(m.table.pcs, pc) - 1
                if row < 0:
                    return ips, "no unwind info"
                _, kind_no, _, rbp_off, cfa_off = ROW.unpack_from(m.table.rows, row * ROW.size)
                kind = ROW_KINDS[kind_no]
                if kind == "none":
                    return ips, "no unwind info"
                if kind == "end":
                    return ips, "root"
                if kind == "rbp":
                    cfa = bp + cfa_off
                elif kind == "plt":
                    cfa = sp + 8 + (8 if ip & 15 >= 11 else 0)
                else:
                    cfa = sp + cfa_off
                if rbp_off:
                    saved = read(cfa + rbp_off)
                    if saved is None:
                        return ips, "stack not readable"
                    bp = saved
            ra = read(cfa - 8)
            if ra is None:
                return ips, "stack not readable"
            if not ra:
                return ips, "root"
            ip, sp = ra, cfa
        return ips, "depth limit"

    def did_not_fit(self, ip: int) -> bool:
        """Whether ip lies in a mapping (part) whose pages did not fit in unw_pages."""
        return any(lo <= ip < hi for lo, hi in self._unpushed)

    def mapping(self, ip: int) -> Mapping | None:
        i = bisect.bisect_right(self._starts, ip) - 1
        if i >= 0 and self.mappings[i].start <= ip < self.mappings[i].end:
            return self.mappings[i]
        return None


def read_stack(table: Any, key: int, known: dict[int, tuple[list[int], str]]) -> tuple[list[int], str] | None:
    """Entry `key` of the `ustacks` map: (ips leaf first, why the walk stopped),
    kept in `known`; None when the map has no such entry. An entry never changes
    once stored (its key is the stack's hash), so each is looked up once: a live
    view reads the aggregation maps every second."""
    stack = known.get(key)
    if stack is not None:
        return stack
    try:
        value = table[table.Key(key)]
    except KeyError:
        return None
    n = min(int(value.len), UNWIND_FRAMES)
    reason = STOP_REASONS[min(int(value.reason), len(STOP_REASONS) - 1)]
    stack = ([int(value.ips[i]) for i in range(n)], reason)
    known[key] = stack
    return stack
