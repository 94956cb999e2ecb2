"""Names of a module's PLT stubs, `pthread_mutex_lock@plt`, as perf and objdump
show them: a stripped binary has no symbol there, and its unwind table has
one FDE for the whole `.plt`, so without these every call through it would be
one frame.

On x86-64 the stub of `.rela.plt` entry i is `.plt.sec`'s i-th 16-byte entry
when there is a `.plt.sec` (IBT), else `.plt`'s (i+1)-th (the first is the
resolver); a lazy stub pushes its relocation's index, which is read where it
is found (`push imm32` at byte 6, or byte 4 after an `endbr64`). A relocation
without a symbol (glibc's IRELATIVE) gives no name.
"""

from __future__ import annotations

import bisect
import struct

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from kvprof.collect.procroot import PerFile

STUB = 16
_PUSH = 0x68


def _pushed(code: bytes, at: int) -> int | None:
    """The relocation index a lazy stub at `at` in `code` pushes, None when it has no push."""
    for where in (at + 6, at + 4):  # jmp *GOT(%rip); push  |  endbr64; push
        if code[where : where + 1] == bytes([_PUSH]) and where + 5 <= len(code):
            return int(struct.unpack_from("<I", code, where + 1)[0])
    return None


def _read(path: str) -> tuple[list[str], int, bytes, bool] | None:
    """The symbol of each `.rela.plt` entry ("" for none), and the stubs' section: its
    address, its code, whether it is `.plt.sec`; None for a module without PLT stubs."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        rela = elf.get_section_by_name(".rela.plt")
        if elf["e_machine"] != "EM_X86_64" or rela is None or not rela["sh_link"]:
            return None
        dynsym = elf.get_section(rela["sh_link"])
        names = [
            dynsym.get_symbol(r["r_info_sym"]).name if r["r_info_sym"] else ""
            for r in rela.iter_relocations()
        ]
        sec = elf.get_section_by_name(".plt.sec") or elf.get_section_by_name(".plt")
        if sec is None:
            return None
        return names, int(sec["sh_addr"]), sec.data(), sec.name == ".plt.sec"


def plt_stubs(path: str) -> list[tuple[int, int, str]]:
    """(start, end, `name@plt`) of the module's PLT stubs, at link-time addresses."""
    try:
        found = _read(path)
    except (OSError, ELFError, ValueError, struct.error):
        return []
    if found is None:
        return []
    names, base, code, sec = found
    out = []
    for slot in range(0 if sec else 1, len(code) // STUB):
        index = None if sec else _pushed(code, slot * STUB)
        i = index if index is not None else slot - (0 if sec else 1)
        if 0 <= i < len(names) and names[i]:
            out.append((base + slot * STUB, base + (slot + 1) * STUB, f"{names[i]}@plt"))
    return out


_STUBS = PerFile(plt_stubs)


def plt_name(path: str, pc: int) -> str | None:
    """`name@plt` when link-time address `pc` of the module at `path` is in a PLT stub."""
    stubs = _STUBS(path) or []
    i = bisect.bisect_right(stubs, (pc, 1 << 64, "")) - 1
    return stubs[i][2] if i >= 0 and stubs[i][0] <= pc < stubs[i][1] else None
