"""Inline frames from DWARF: for an address in a module, the functions the
compiler inlined there (`DW_TAG_inlined_subroutine`), outermost first, as
`perf report --inline` and `addr2line -i` show them.

A module's DWARF is read one compile unit at a time, the first time an
address in that unit is asked about: `.debug_aranges` (else each unit's own
address ranges) says which unit holds an address, and the unit's inlined
calls become ranges (low, high, nesting depth, name). The tables of a module
are kept per build-id for the life of the process, so the collectors of one
session (and a live view's every refresh) read each unit once.

Names come from the inlined call's abstract origin (`DW_AT_name`, through
`DW_AT_specification` for C++ members). Range lists by index
(`DW_FORM_rnglistx`, clang's DWARF 5) are not read: such calls are left out.
"""

from __future__ import annotations

import bisect
import mmap
from dataclasses import dataclass, field
from typing import Any

from elftools.common.exceptions import DWARFError, ELFError
from elftools.dwarf.ranges import BaseAddressEntry
from elftools.elf.elffile import ELFFile

from kvprof.collect.unwind import module_key

_NAME_HOPS = 4  # abstract origin -> specification -> ... before giving up on a name


@dataclass(frozen=True)
class Call:
    """One address range of one inlined call."""

    low: int
    high: int
    depth: int  # 0: inlined into the out-of-line function; 1: into a depth-0 call; ...
    name: str


@dataclass
class ModuleInlines:
    """The inlined calls of one ELF file's DWARF, read per compile unit on demand."""

    dwarf: Any  # elftools DWARFInfo
    units: list[tuple[int, int, int]]  # (low, high, unit offset), sorted
    calls: dict[int, list[Call]] = field(default_factory=dict)  # unit offset -> its calls

    def chain(self, pc: int) -> list[str]:
        """The functions inlined at module-relative `pc`, outermost first; [] for none."""
        i = bisect.bisect_right(self.units, (pc, 1 << 64, 0)) - 1
        if i < 0 or not self.units[i][0] <= pc < self.units[i][1]:
            return []
        offset = self.units[i][2]
        calls = self.calls.get(offset)
        if calls is None:
            calls = self.calls[offset] = _unit_calls(self.dwarf, offset)
        return [c.name for c in sorted((c for c in calls if c.low <= pc < c.high), key=lambda c: c.depth)]


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
    except (OSError, ValueError, ELFError, DWARFError):
        return None


def _units(dwarf: Any) -> list[tuple[int, int, int]]:
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


def _unit_calls(dwarf: Any, offset: int) -> list[Call]:
    try:
        cu = dwarf.get_CU_at(offset)
        top = cu.get_top_DIE()
        out: list[Call] = []
        _walk(dwarf, top, 0, _low_pc(top), out)
        return out
    except (ELFError, DWARFError, KeyError, ValueError):  # a unit pyelftools cannot read: no inline frames
        return []


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
