"""Inline frames from DWARF: for an address in a module, the functions the
compiler inlined there (`DW_TAG_inlined_subroutine`), outermost first, as
`perf report --inline` and `addr2line -i` show them.

A module's DWARF is read only where addresses are asked about:
`.debug_aranges` (else each compile unit's own ranges) says which unit holds
an address; the unit's functions with code (`DW_TAG_subprogram` at its top
level or in a namespace; types and the rest are skipped by their
`DW_AT_sibling`) say which function; and that function's inlined calls
become ranges (low, high, nesting depth, name). The tables of a module are
kept per build-id for the life of the process, so the collectors of one
session (and a live view's every refresh) read each unit's list of functions
and each function once.

Names come from the inlined call's abstract origin (`DW_AT_name`, through
`DW_AT_specification` for C++ members). Range lists by index
(`DW_FORM_rnglistx`, clang's DWARF 5) are not read: such calls are left out.
"""

from __future__ import annotations

import bisect
import mmap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from elftools.dwarf.ranges import BaseAddressEntry
from elftools.elf.elffile import ELFFile

from kvprof.collect.unwind import module_key

T = TypeVar("T")
_NAME_HOPS = 4  # abstract origin -> specification -> ... before giving up on a name


@dataclass(frozen=True)
class Call:
    """One address range of one inlined call."""

    low: int
    high: int
    depth: int  # 0: inlined into the out-of-line function; 1: into a depth-0 call; ...
    name: str


Ranges = list[tuple[int, int, int]]  # (low, high, DIE offset), sorted


def _find(ranges: Ranges, pc: int) -> int | None:
    """The offset of the range that holds pc, if any."""
    i = bisect.bisect_right(ranges, (pc, 1 << 64, 0)) - 1
    return ranges[i][2] if i >= 0 and ranges[i][0] <= pc < ranges[i][1] else None


@dataclass
class ModuleInlines:
    """The inlined calls of one ELF file's DWARF, read per function on demand."""

    dwarf: Any  # elftools DWARFInfo
    units: Ranges  # the compile units' code
    functions: dict[int, Ranges] = field(default_factory=dict)  # unit offset -> its functions' code
    calls: dict[int, list[Call]] = field(default_factory=dict)  # function DIE offset -> its inlined calls

    def chain(self, pc: int) -> list[str]:
        """The functions inlined at module-relative `pc`, outermost first; [] for none."""
        unit = _find(self.units, pc)
        if unit is None:
            return []
        if unit not in self.functions:
            self.functions[unit] = _read(_functions, self.dwarf, unit, [])
        function = _find(self.functions[unit], pc)
        if function is None:
            return []
        if function not in self.calls:
            self.calls[function] = _read(_calls, self.dwarf, function, [])
        calls = (c for c in self.calls[function] if c.low <= pc < c.high)
        return [c.name for c in sorted(calls, key=lambda c: c.depth)]


_MODULES: dict[str, ModuleInlines | None] = {}  # build-id (or path, size, mtime) -> its calls


def module_inlines(path: str) -> ModuleInlines | None:
    """The inline tables of the ELF file at `path` (None: no DWARF, or unreadable),
    shared by every caller in this process that opens the same build."""
    try:
        key = module_key(path)
    except OSError:
        return None
    if key not in _MODULES:
        _MODULES[key] = _open(path)
    return _MODULES[key]


def _open(path: str) -> ModuleInlines | None:
    try:
        with open(path, "rb") as f:
            # mapped, not read: pyelftools reads sections lazily, and the map stays
            # valid after the target (and its /proc/PID/map_files entry) is gone
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        elf = ELFFile(data)
        if not elf.has_dwarf_info() or elf.get_section_by_name(".debug_info") is None:
            return None
        dwarf = elf.get_dwarf_info()
        return ModuleInlines(dwarf, _units(dwarf))
    except Exception:  # unreadable, not ELF, or DWARF that pyelftools' parser rejects: no inline frames
        return None


def _units(dwarf: Any) -> Ranges:
    """(low, high, unit offset) of every compile unit's code, from .debug_aranges
    when the file has it (cheap), else from each unit's top DIE."""
    aranges = dwarf.get_aranges()
    if aranges is not None and aranges.entries:
        return sorted((e.begin_addr, e.begin_addr + e.length, e.info_offset) for e in aranges.entries)
    out = []
    for cu in dwarf.iter_CUs():
        top = cu.get_top_DIE()
        out += [(lo, hi, cu.cu_offset) for lo, hi in _ranges(dwarf, top, _low_pc(top))]
    return sorted(out)


def _read(how: Callable[[Any, int], T], dwarf: Any, offset: int, empty: T) -> T:
    """how(dwarf, offset), or `empty` where pyelftools cannot read the DWARF: no inline frames there."""
    try:
        return how(dwarf, offset)
    except Exception:  # a foreign binary's DWARF that pyelftools' parser rejects, in any of its ways
        return empty


def _functions(dwarf: Any, unit: int) -> Ranges:
    """The code of each function of the compile unit at `unit`."""
    top = dwarf.get_CU_at(unit).get_top_DIE()
    base, out, scopes = _low_pc(top), [], [top]
    while scopes:
        for child in scopes.pop().iter_children():
            if child.tag == "DW_TAG_subprogram":
                out += [(lo, hi, child.offset) for lo, hi in _ranges(dwarf, child, base)]
            elif child.tag == "DW_TAG_namespace":
                scopes.append(child)
    return sorted(out)


def _calls(dwarf: Any, function: int) -> list[Call]:
    """The inlined calls in the function whose DIE is at `function`."""
    die = dwarf.get_DIE_from_refaddr(function)
    out: list[Call] = []
    _walk(dwarf, die, 0, _low_pc(die.cu.get_top_DIE()), out)
    return out


def _walk(dwarf: Any, die: Any, depth: int, base: int, out: list[Call]) -> None:
    for child in die.iter_children():
        inner = depth
        if child.tag == "DW_TAG_inlined_subroutine":
            name = _name(child)
            if name:
                out += [Call(lo, hi, depth, name) for lo, hi in _ranges(dwarf, child, base)]
            inner = depth + 1
        if child.has_children:
            _walk(dwarf, child, inner, base, out)


def _low_pc(die: Any) -> int:
    attr = die.attributes.get("DW_AT_low_pc")
    return int(attr.value) if attr is not None else 0


def _ranges(dwarf: Any, die: Any, base: int) -> list[tuple[int, int]]:
    """A DIE's address ranges: low_pc/high_pc (high an offset unless it is an
    address), or its DW_AT_ranges list; offsets in a list are from `base` (the
    unit's low_pc) until a base-address entry sets another."""
    attrs = die.attributes
    if "DW_AT_low_pc" in attrs and "DW_AT_high_pc" in attrs:
        lo, high = int(attrs["DW_AT_low_pc"].value), attrs["DW_AT_high_pc"]
        return [(lo, int(high.value) if high.form == "DW_FORM_addr" else lo + int(high.value))]
    ranges = attrs.get("DW_AT_ranges")
    lists = dwarf.range_lists()
    if ranges is None or lists is None or ranges.form == "DW_FORM_rnglistx":
        return []
    out = []
    for entry in lists.get_range_list_at_offset(ranges.value, cu=die.cu):
        if isinstance(entry, BaseAddressEntry):
            base = entry.base_address
        elif entry.is_absolute:
            out.append((entry.begin_offset, entry.end_offset))
        else:
            out.append((base + entry.begin_offset, base + entry.end_offset))
    return out


def _name(die: Any) -> str:
    for _ in range(_NAME_HOPS):
        attr = die.attributes.get("DW_AT_name")
        if attr is not None:
            return str(attr.value.decode(errors="replace"))
        ref = next((r for r in ("DW_AT_abstract_origin", "DW_AT_specification") if r in die.attributes), None)
        if ref is None:
            return ""
        die = die.get_DIE_from_attribute(ref)
    return ""
