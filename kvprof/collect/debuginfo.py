"""Function and data symbols of a module, from the best file that has them, as
perf and gdb look for it:

1. the debug file named by the module's build-id,
   `/usr/lib/debug/.build-id/xx/rest.debug` (Debian's `libc6-dbg`, `*-dbgsym`);
2. the file named by its `.gnu_debuglink` (with a CRC32 of the whole file that
   must match): in the module's directory, its `.debug/`, and
   `/usr/lib/debug/<module's directory>`;
3. `.gnu_debugdata`: MiniDebugInfo, an xz-compressed ELF inside the module
   that holds the `.symtab` of the functions `.dynsym` lacks (Fedora's way);
4. a debuginfod server, by build-id, for a module without a full symbol table of
   its own (kvprof.collect.debuginfod);
5. the module's own `.symtab`, else `.dynsym`.

Debug files are looked for under the target's root (a container's own
/usr/lib/debug, through /proc/PID/root), then the host's for a build-id, which
names the build exactly. The module's own symbols are merged in (`.dynsym`
names what a stripped debug file might lack). Where several names share an
address: a sized symbol, then an exported one (in `.dynsym`: the name callers
use, `qsort_r` over glibc's `__qsort_r`), then perf's order: not weak, then
global, then not one of glibc's `__GI_` aliases (its calls from inside
itself), then fewer leading underscores, then the longest name
(`pthread_mutex_lock` over `___pthread_mutex_lock`; `__lll_lock_wait`,
which only the debug file has, over `__GI___lll_lock_wait`).

An address that no symbol covers is named by the function its unwind table
cuts out for it: `module+0xSTART`, the start of the FDE that covers it
(kvprof.collect.unwind.function_start), so one function's addresses share a
name; `module+0xoffset` of the address itself where no FDE covers it; a PLT
stub by what it calls, `name@plt` (kvprof.collect.plt).

Tables are kept per module build (its build-id, plus where the names came
from, so installing a debug package is seen at once) in CACHE_DIR, as the
unwind tables are.
"""

from __future__ import annotations

import bisect
import io
import json
import lzma
import os
import struct
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from kvprof.collect import debuginfod
from kvprof.collect.demangle import demangle
from kvprof.collect.plt import plt_name
from kvprof.collect.procroot import DEBUG_DIR, in_root, mapped_file
from kvprof.collect.unwind import CACHE_DIR as UNWIND_CACHE
from kvprof.collect.unwind import build_id, function_start, module_key

CACHE_DIR = UNWIND_CACHE.parent / "symbols"
CACHE_BYTES = 64 << 20
CACHE_FORMAT = 1  # raised when what a table holds or how names are chosen changes
# where the names came from, best first; the first five carry a full symbol table
SOURCES = ("build-id", "debuglink", "gnu_debugdata", "debuginfod", "symtab", "dynsym", "none")
_FUNC_TYPES = (2, 10)  # STT_FUNC, STT_GNU_IFUNC
_OBJECT = 1
_WEAK, _GLOBAL = 2, 1
PAGE_MASK = ~0xFFF


@dataclass
class Symbols:
    """A module's symbols at link-time addresses: (start, end, name) sorted by start."""

    funcs: list[tuple[int, int, str]] = field(default_factory=list)
    objects: list[tuple[int, int, str]] = field(default_factory=list)
    source: str = "none"  # one of SOURCES
    debug_file: str = ""  # the file read for 1-3, as the target names it
    loads: list[tuple[int, int, int]] = field(default_factory=list)  # PT_LOAD (offset, vaddr, memsz)

    @property
    def full(self) -> bool:
        """Whether the names come from a full symbol table (debug info or .symtab)."""
        return SOURCES.index(self.source) < SOURCES.index("dynsym")

    def function(self, vaddr: int) -> tuple[int, int, str] | None:
        return _find(self.funcs, vaddr)

    def object(self, vaddr: int) -> tuple[int, int, str] | None:
        return _find(self.objects, vaddr)


def _find(table: list[tuple[int, int, str]], vaddr: int) -> tuple[int, int, str] | None:
    i = bisect.bisect_right(table, (vaddr, 1 << 64, "")) - 1
    for j in range(i, max(i - 4, -1), -1):  # a nested symbol may precede the enclosing one's end
        if table[j][0] <= vaddr < table[j][1]:
            return table[j]
    return None


# ---- reading ELF symbol tables ----------------------------------------------------


Candidate = tuple[str, int, int, bool]  # name, size, binding, exported (.dynsym)


@dataclass
class _Raw:
    """Symbols as read: address -> candidates (name, size, binding, exported), by kind."""

    funcs: dict[int, list[Candidate]] = field(default_factory=dict)
    objects: dict[int, list[Candidate]] = field(default_factory=dict)


def _read_table(elf: ELFFile, name: str, raw: _Raw) -> bool:
    """Add the defined FUNC/OBJECT symbols of section `name` to `raw`; whether it had any."""
    sec = elf.get_section_by_name(name)
    if sec is None or sec["sh_type"] == "SHT_NOBITS" or not sec["sh_entsize"]:
        return False
    strtab = elf.get_section(sec["sh_link"]).data()
    fmt = ("<" if elf.little_endian else ">") + ("IBBHQQ" if elf.elfclass == 64 else "IIIBBH")
    entry = struct.Struct(fmt)
    data = sec.data()
    section_ends = [int(x["sh_addr"]) + int(x["sh_size"]) for x in elf.iter_sections()]
    found = False
    for fields in entry.iter_unpack(data[: len(data) - len(data) % entry.size]):
        if elf.elfclass == 64:
            st_name, info, _, shndx, value, size = fields
        else:
            st_name, value, size, info, _, shndx = fields
        kind = info & 0xF
        if shndx == 0 or not value or not st_name or (kind not in _FUNC_TYPES and kind != _OBJECT):
            continue
        end = strtab.find(b"\0", st_name)
        text = strtab[st_name : end if end >= 0 else len(strtab)].decode(errors="replace").split("@")[0]
        table = raw.funcs if kind in _FUNC_TYPES else raw.objects
        # a symbol without a size ends at the next one, but never past its section
        limit = section_ends[shndx] if shndx < len(section_ends) else value + 1
        table.setdefault(value, []).append((text, size or -limit, info >> 4, name == ".dynsym"))
        found = True
    return found


def _best(candidates: list[Candidate]) -> Candidate:
    """The name of one address: an exported one (in .dynsym: the name callers
    use, `qsort_r` over glibc's `__qsort_r`), then perf's choice
    (tools/perf/util/symbol.c, choose_best_symbol), never a `__GI_` alias."""

    def rank(c: Candidate) -> tuple[bool, bool, bool, bool, bool, int, int]:
        name, size, binding, exported = c
        underscores = len(name) - len(name.lstrip("_"))
        weak, internal = binding == _WEAK, name.startswith("__GI_")
        return (size > 0, exported, not weak, binding == _GLOBAL, not internal, -underscores, len(name))

    return max(candidates, key=rank)


def _ranges(by_addr: dict[int, list[Candidate]]) -> list[tuple[int, int, str]]:
    """Sorted (start, end, name); a symbol without a size (its size is minus where
    its section ends) ends where the next one starts, or its section does."""
    starts = sorted(by_addr)
    out = []
    for i, start in enumerate(starts):
        name, size, _, _ = _best(by_addr[start])
        end = start + size if size > 0 else min(-size, starts[i + 1] if i + 1 < len(starts) else -size)
        out.append((start, max(end, start + 1), name))
    return out


def _open_elf(f: IO[bytes]) -> ELFFile | None:
    try:
        return ELFFile(f)
    except (ELFError, OSError, ValueError):
        return None


# ---- finding the debug file -----------------------------------------------------------


def _debuglink(elf: ELFFile) -> tuple[str, int] | None:
    sec = elf.get_section_by_name(".gnu_debuglink")
    if sec is None:
        return None
    data = sec.data()
    end = data.find(b"\0")
    if end <= 0 or len(data) < ((end + 4) & ~3) + 4:
        return None
    crc_at = (end + 4) & ~3  # the name, NUL-terminated, padded to 4 bytes, then the CRC
    order = "<" if elf.little_endian else ">"
    return data[:end].decode(errors="replace"), struct.unpack_from(order + "I", data, crc_at)[0]


def _crc32(path: str) -> int | None:
    crc = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                crc = zlib.crc32(chunk, crc)
    except OSError:
        return None
    return crc


def _has_symtab(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            elf = _open_elf(f)
            sec = elf.get_section_by_name(".symtab") if elf is not None else None
            return sec is not None and sec["sh_type"] != "SHT_NOBITS"
    except OSError:
        return False


def debug_candidates(elf: ELFFile, bid: str | None, path: str, root: str) -> list[tuple[str, str]]:
    """(how, file) where a debug file of the module may be, in the order tried:
    `bid` is its build-id, `path` its name in the target, `root` the target's
    root directory ("" for the host's)."""
    out = []
    if bid and len(bid) > 2:
        rel = f"{DEBUG_DIR}/.build-id/{bid[:2]}/{bid[2:]}.debug"
        out += [("build-id", root + rel)] + ([("build-id", rel)] if root else [])
    link = _debuglink(elf)
    if link is not None:
        d, name = os.path.dirname(path), link[0]
        dirs = (d, f"{d}/.debug", f"{DEBUG_DIR}{d}")
        out += [("debuglink", f"{root}{where}/{name}") for where in dirs]
    return out


def find_debug_file(
    elf: ELFFile, image: str, path: str, root: str, bid: str | None
) -> tuple[str, str] | None:
    """(how, file) of the separate debug file of the module whose bytes are at `image`, or None."""
    link = _debuglink(elf)
    for how, candidate in debug_candidates(elf, bid, path, root):
        if not os.path.isfile(candidate) or os.path.realpath(candidate) == os.path.realpath(image):
            continue
        if how == "debuglink" and (link is None or _crc32(candidate) != link[1]):
            continue  # another build's debug file: its addresses would lie
        if _has_symtab(candidate):
            return how, candidate
    return None


def _lacks_names(elf: ELFFile, found: tuple[str, str] | None) -> bool:
    """Whether a debuginfod server's debug file would name the module: it has no debug
    file here (`found`) and no full symbol table of its own."""
    return found is None and not any(elf.get_section_by_name(s) for s in (".symtab", ".gnu_debugdata"))


def lacking_names(pid: int) -> list[tuple[str, str]]:
    """(build-id, name) of each module of the process whose names a debuginfod server's
    debug file would give (kvprof.collect.debuginfod.start fetches them)."""
    out: dict[str, str] = {}
    for m in read_maps(pid):
        if not m.path.startswith("/") or "x" not in m.perms:
            continue
        path, image = m.path.removesuffix(" (deleted)"), mapped_file(pid, m.path, m.start, m.end, m.inode)
        try:
            with open(image, "rb") as f:
                elf, bid = _open_elf(f), build_id(image)
                if elf is None or not bid:
                    continue
                if _lacks_names(elf, find_debug_file(elf, image, path, in_root(pid, ""), bid)):
                    out[bid] = os.path.basename(path)
        except (OSError, ELFError):
            continue
    return list(out.items())


# ---- a module's symbols, cached ----------------------------------------------------------


def _read(elf: ELFFile, image: str, found: tuple[str, str] | None) -> Symbols:
    """The module's own symbols, merged with those of its debug file `found` (how, file)."""
    raw = _Raw()
    has_dynsym = _read_table(elf, ".dynsym", raw)
    source = "symtab" if _read_table(elf, ".symtab", raw) else "dynsym" if has_dynsym else "none"
    debug = ""
    if found is not None:
        with open(found[1], "rb") as f:
            dbg = _open_elf(f)
            if dbg is not None and _read_table(dbg, ".symtab", raw):
                source, debug = found
    elif source != "symtab" and (sec := elf.get_section_by_name(".gnu_debugdata")) is not None:
        try:
            mini = _open_elf(io.BytesIO(lzma.decompress(sec.data())))
        except lzma.LZMAError:
            mini = None
        if mini is not None and _read_table(mini, ".symtab", raw):
            source, debug = "gnu_debugdata", image
    loads = [
        (int(seg["p_offset"]), int(seg["p_vaddr"]), int(seg["p_memsz"]))
        for seg in elf.iter_segments()
        if seg["p_type"] == "PT_LOAD"
    ]
    return Symbols(_ranges(raw.funcs), _ranges(raw.objects), source, debug, loads)


def _cache_file(key: str) -> Path:
    return CACHE_DIR / f"{key}.v{CACHE_FORMAT}.syms"


def _load(key: str) -> Symbols | None:
    try:
        doc = json.loads(_cache_file(key).read_text())
        funcs, objects, loads = ([tuple(x) for x in doc[k]] for k in ("funcs", "objects", "loads"))
        syms = Symbols(funcs, objects, doc["source"], doc["debug_file"], loads)
        os.utime(_cache_file(key))
    except (OSError, ValueError, KeyError, TypeError):  # none, or not one we wrote: read the module
        return None
    return syms


def _store(key: str, syms: Symbols) -> None:
    doc = {"source": syms.source, "debug_file": syms.debug_file, "funcs": syms.funcs, "objects": syms.objects,
           "loads": syms.loads}  # fmt: skip
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = _cache_file(key).with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, separators=(",", ":")))
        tmp.rename(_cache_file(key))
        kept = sorted(CACHE_DIR.glob("*.syms"), key=lambda p: p.stat().st_mtime, reverse=True)
        total = 0
        for p in kept:  # the newest first, until the budget is spent
            total += p.stat().st_size
            if total > CACHE_BYTES:
                p.unlink(missing_ok=True)
    except OSError:  # a read-only home: read the module again next time
        pass


_TABLES: dict[str, Symbols] = {}  # per kvprof process: a live view asks every second
# each collector of a session names its own addresses: the file a module was read
# from (device, inode, size, mtime, name, root) -> what was found for it
_FILES: dict[tuple[int, int, int, int, str, str], Symbols] = {}


def module_symbols(image: str, path: str = "", root: str = "") -> Symbols:
    """The symbols of the module whose bytes are at `image` (a path the host can
    open), named `path` in a target whose root directory is `root` ("": the host's)."""
    path = path or image
    try:
        st = os.stat(image)
    except OSError:
        return Symbols()
    file = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, path, root)
    if file not in _FILES:
        _FILES[file] = _module_symbols(image, path, root)
    return _FILES[file]


def _module_symbols(image: str, path: str, root: str) -> Symbols:
    try:
        with open(image, "rb") as f:
            elf = _open_elf(f)
            if elf is None:
                return Symbols()
            bid = build_id(image)
            found = find_debug_file(elf, image, path, root, bid)
            # one build stripped or not has one build-id: the key says what this file holds
            own = [s for s in (".symtab", ".gnu_debugdata", ".dynsym") if elf.get_section_by_name(s)]
            if bid and _lacks_names(elf, found):
                served = debuginfod.debug_file(bid, os.path.basename(path))
                found = ("debuginfod", served) if served else None
            how = found[0] if found else "+".join(own) or "none"
            key = f"{bid or module_key(image)}-{how}"
            syms = _TABLES.get(key) or _load(key)
            if syms is None:
                syms = _read(elf, image, found)
                _store(key, syms)
    except OSError:
        return Symbols()
    _TABLES[key] = syms
    # the same build may lie elsewhere this time: say where its names come from now
    shown = dict.fromkeys(("build-id", "debuglink", "debuginfod"), found and found[1])
    shown["gnu_debugdata"] = image
    return replace(syms, debug_file=(shown.get(syms.source) or "").removeprefix(root))


# ---- the modules of a process ---------------------------------------------------------------


@dataclass(frozen=True)
class FileMap:
    """One mapping of a file, as /proc/PID/maps shows it."""

    start: int
    end: int
    offset: int
    inode: int
    perms: str  # "r-xp"
    path: str  # as the target names it, " (deleted)" kept; "" anonymous, "[heap]", ...

    @property
    def name(self) -> str:
        return os.path.basename(self.path.removesuffix(" (deleted)"))


def read_maps(pid: int) -> list[FileMap]:
    """Every mapping of the process, by address ([] when it is gone)."""
    out = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                cols = line.split(maxsplit=5)
                lo, hi = cols[0].split("-")
                path = cols[5].strip() if len(cols) > 5 else ""
                out.append(FileMap(int(lo, 16), int(hi, 16), int(cols[2], 16), int(cols[4]), cols[1], path))
    except (OSError, ValueError, IndexError):
        return []
    return out


def _covered(m: FileMap, maps: list[FileMap], starts: list[int]) -> bool:
    """Whether any of `maps` (sorted and disjoint, `starts` their starts) overlaps `m`."""
    i = bisect.bisect_left(starts, m.end)  # maps[:i] start below m's end, maps[i - 1] ends last
    return i > 0 and maps[i - 1].end > m.start


@dataclass(frozen=True)
class Located:
    """An address inside a module's loaded image: the module and its link-time address."""

    map: FileMap
    symbols: Symbols
    vaddr: int


class ProcessSymbols:
    """Names of code and data addresses of one process. Its mappings are read
    from /proc/PID/maps (and kept once it exits); each module's Symbols are read
    once, through the target's root or map_files (kvprof.collect.procroot), with
    the debug files under the target's root."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.maps: list[FileMap] = []
        self._starts: list[int] = []
        # (path, inode, start - offset) -> symbols, load bias: the same path mapped
        # again elsewhere (the program exec'd itself) is another module
        self._modules: dict[tuple[str, int, int], tuple[Symbols, int]] = {}

    def refresh(self) -> bool:
        """Read the mappings again; False when the process is gone (the old ones stay).
        A file's mapping that went away stays known until a new one covers its addresses:
        stacks taken before an exec or a dlclose, read after it, keep their names.
        Anonymous memory that went away is forgotten (it comes and goes all the time)."""
        maps = read_maps(self.pid)
        if not maps:
            return False
        starts = [m.start for m in maps]
        gone = [m for m in self.maps if m.path.startswith("/") and not _covered(m, maps, starts)]
        self.maps = sorted(maps + gone, key=lambda m: m.start) if gone else maps
        self._starts = [m.start for m in self.maps]
        return True

    def load_all(self) -> None:
        """Read the symbols of every mapped module now, while the target's files can be reached."""
        self.refresh()
        for m in self.maps:
            if m.path.startswith("/"):
                self.module(m)

    def mapping(self, addr: int) -> FileMap | None:
        i = bisect.bisect_right(self._starts, addr) - 1
        return self.maps[i] if i >= 0 and addr < self.maps[i].end else None

    def module(self, m: FileMap) -> tuple[Symbols, int]:
        """The symbols of the file mapped by `m` and its load bias (runtime - link-time address)."""
        key = (m.path, m.inode, m.start - m.offset)
        got = self._modules.get(key)
        if got is None:
            image = mapped_file(self.pid, m.path, m.start, m.end, m.inode)
            syms = module_symbols(image, m.path.removesuffix(" (deleted)"), in_root(self.pid, ""))
            segs = [s for s in syms.loads if s[0] & PAGE_MASK <= m.offset]
            seg = max(segs, default=(0, 0, 0))
            got = self._modules[key] = (syms, m.start - m.offset + seg[0] - seg[1])
        return got

    def locate(self, addr: int) -> Located | None:
        """The module whose loaded image holds `addr`: a file mapping, or the
        anonymous memory right after one (its .bss)."""
        m = self.mapping(addr)
        if m is None and (not self.refresh() or (m := self.mapping(addr)) is None):
            return None
        if not m.path.startswith("/"):
            if m.path not in ("", "[heap]"):
                return None
            i = bisect.bisect_right(self._starts, addr) - 1
            m = next((x for x in reversed(self.maps[:i]) if x.path.startswith("/")), None)
            if m is None:
                return None
        syms, bias = self.module(m)
        vaddr = addr - bias
        if syms.loads and not any(va <= vaddr < va + size for _, va, size in syms.loads):
            return None
        return Located(m, syms, vaddr)

    def function(self, addr: int) -> tuple[str, int, int] | None:
        """(name, start address in the process, size) of the function holding `addr`."""
        at = self.locate(addr)
        sym = at.symbols.function(at.vaddr) if at is not None else None
        if at is None or sym is None:
            return None
        return demangle(sym[2]), addr - (at.vaddr - sym[0]), sym[1] - sym[0]

    def function_name(self, addr: int) -> str | None:
        """The function holding `addr`; without a symbol, `module+0xSTART`: the start
        (link-time) of the function its unwind table's FDE covers, else `module+0xoffset`
        of `addr` itself; None outside any module."""
        at = self.locate(addr)
        if at is None:
            return None
        sym = at.symbols.function(at.vaddr)
        return demangle(sym[2]) if sym is not None else self.unnamed(at)

    def module_function_name(self, path: str, vaddr: int) -> str | None:
        """The function at link-time address `vaddr` of the module the target maps from
        `path` (a perf sample perf had no symbol for), None when it maps no such module."""
        m = next((m for m in self.maps if m.path == path and "x" in m.perms), None)
        if m is None:
            return None
        syms, _ = self.module(m)
        sym = syms.function(vaddr)
        return demangle(sym[2]) if sym is not None else self.unnamed(Located(m, syms, vaddr))

    def unnamed(self, at: Located) -> str:
        """Code without a symbol: its PLT stub, `name@plt`; else `module+0xSTART`, the start
        of the function whose FDE covers it; else `module+0xoffset` of the address itself."""
        m = at.map
        image = mapped_file(self.pid, m.path, m.start, m.end, m.inode)
        start = function_start(image, at.vaddr)
        return plt_name(image, at.vaddr) or f"{m.name}+0x{at.vaddr if start is None else start:x}"

    def object_name(self, addr: int) -> str | None:
        """`name`, `name+0x8`, `module+0xoffset` for data in a module, None outside any."""
        at = self.locate(addr)
        if at is None:
            return None
        sym = at.symbols.object(at.vaddr)
        if sym is None:
            return f"{at.map.name}+0x{at.vaddr:x}"
        return demangle(sym[2]) + (f"+0x{at.vaddr - sym[0]:x}" if at.vaddr > sym[0] else "")

    def object_address(self, name: str) -> int | None:
        """Where the data object `name` (or `name+0x8`, as object_name() writes it) is in
        the process: the first module that has it in address order (a PIE executable's
        first). The
        reverse of object_name()."""
        base, _, off = name.partition("+")
        try:
            extra = int(off, 16) if off else 0
        except ValueError:
            return None
        self.refresh()
        seen: set[tuple[str, int, int]] = set()
        for m in self.maps:
            key = (m.path, m.inode, m.start - m.offset)
            if not m.path.startswith("/") or key in seen:
                continue
            seen.add(key)
            syms, bias = self.module(m)
            found = next((start for start, _, n in syms.objects if n == base), None)
            if found is not None:
                return found + bias + extra
        return None
