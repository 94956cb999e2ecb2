"""USDT probes of a process, read from its executable without BCC.

A USDT probe is an ELF note in `.note.stapsdt` (what `readelf -n` prints):
the probe site's address, the link-time address of `.stapsdt.base`, the
address of its is-enabled semaphore (0 when it has none), and three strings:
provider, name and the argument operands (`-4@%edi 8@%rax ...`). A tracer
raises the 16-bit semaphore while it is attached; reading it from
/proc/PID/mem tells whether anyone is tracing the probe right now.

Also here: the little ELF reading `kvprof doctor` needs to look at function
prologues (symbols and the bytes at an address), so neither needs pyelftools.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

NT_STAPSDT = 3
PT_LOAD = 1
ET_EXEC = 2
SHT_NOBITS = 8
STT_FUNC = 2
PAGE_MASK = ~0xFFF
PF_KTHREAD = 0x00200000


class ProbesError(Exception):
    """The process or its executable cannot be read; the message is one line that says why."""


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    addr: int
    offset: int
    size: int


@dataclass(frozen=True)
class Segment:
    type: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    size: int


class ElfFile:
    """The headers, sections, segments and function symbols of one ELF file (32/64-bit, either endianness)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.data = self.path.read_bytes()
        except OSError as err:
            raise ProbesError(f"cannot read {path}: {err.strerror}") from None
        d = self.data
        if len(d) < 52 or d[:4] != b"\x7fELF":
            raise ProbesError(f"{path} is not an ELF file")
        self.is64 = d[4] == 2
        self.endian = "<" if d[5] == 1 else ">"
        try:
            self._parse_headers()
        except struct.error:
            raise ProbesError(f"{path} is not an ELF file we can read (truncated headers)") from None

    def _parse_headers(self) -> None:
        d = self.data
        e = self.endian
        header = "HHIQQQIHHHHHH" if self.is64 else "HHIIIIIHHHHHH"  # e_type .. e_shstrndx
        (
            self.type,
            self.machine,
            _,
            _,
            phoff,
            shoff,
            _,
            _,
            phentsize,
            phnum,
            shentsize,
            shnum,
            shstrndx,
        ) = struct.unpack_from(e + header, d, 16)
        self.segments: list[Segment] = []
        for i in range(phnum):
            off = phoff + i * phentsize
            if self.is64:
                p_type, _, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = struct.unpack_from(
                    e + "IIQQQQQQ", d, off
                )
            else:
                p_type, p_offset, p_vaddr, _, p_filesz, p_memsz, _, _ = struct.unpack_from(
                    e + "IIIIIIII", d, off
                )
            self.segments.append(Segment(p_type, p_offset, p_vaddr, p_filesz, p_memsz))
        raw: list[tuple[int, int, int, int, int, int, int]] = []
        for i in range(shnum if shoff else 0):
            off = shoff + i * shentsize
            if self.is64:
                name, typ, _, addr, offset, size, link, _, _, entsize = struct.unpack_from(
                    e + "IIQQQQIIQQ", d, off
                )
            else:
                name, typ, _, addr, offset, size, link, _, _, entsize = struct.unpack_from(
                    e + "IIIIIIIIII", d, off
                )
            raw.append((name, typ, addr, offset, size, link, entsize))
        names = raw[shstrndx] if raw and shstrndx < len(raw) else None
        self.sections: list[Section] = []
        self._links: list[tuple[int, int]] = []
        for name, typ, addr, offset, size, link, entsize in raw:
            text = self._cstr(names[3] + name) if names else ""
            self.sections.append(Section(text, typ, addr, offset, size))
            self._links.append((link, entsize))

    def _cstr(self, offset: int) -> str:
        end = self.data.find(b"\0", offset)
        return self.data[offset : end if end >= 0 else len(self.data)].decode(errors="replace")

    @property
    def pie(self) -> bool:
        return bool(self.type != ET_EXEC)

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def symbols(self, table: str, kinds: tuple[int, ...]) -> list[tuple[int, int, str, int]]:
        """(value, size, name, type) of the defined symbols of `table` (.symtab or .dynsym)
        whose type is one of `kinds`, in table order; [] without that table."""
        idx = next((i for i, s in enumerate(self.sections) if s.name == table), None)
        if idx is None:
            return []
        sec = self.sections[idx]
        link, entsize = self._links[idx]
        if sec.type == SHT_NOBITS or link >= len(self.sections):
            return []
        strtab = self.sections[link].offset
        fmt = self.endian + ("IBBHQQ" if self.is64 else "IIIBBH")
        step = entsize or struct.calcsize(fmt)
        end = min(sec.offset + sec.size, len(self.data)) - struct.calcsize(fmt)
        out = []
        for off in range(sec.offset, end + 1, step):
            if self.is64:
                st_name, st_info, _, st_shndx, st_value, st_size = struct.unpack_from(fmt, self.data, off)
            else:
                st_name, st_value, st_size, st_info, _, st_shndx = struct.unpack_from(fmt, self.data, off)
            if st_info & 0xF in kinds and st_shndx != 0 and st_name:
                out.append((st_value, st_size, self._cstr(strtab + st_name), st_info & 0xF))
        return out

    def functions(self) -> list[Symbol]:
        """Defined function symbols with a size, from .symtab, else .dynsym; unique by address."""
        for table in (".symtab", ".dynsym"):
            seen: dict[int, Symbol] = {}
            for value, size, name, _ in self.symbols(table, (STT_FUNC,)):
                if size > 0 and value not in seen:
                    seen[value] = Symbol(name, value, size)
            if seen:
                return sorted(seen.values(), key=lambda s: s.value)
        return []

    def _segment_at(self, vaddr: int) -> Segment | None:
        """The loadable segment whose file bytes hold a link-time address."""
        for seg in self.segments:
            if seg.type == PT_LOAD and seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
                return seg
        return None

    def file_offset(self, vaddr: int) -> int | None:
        """The file offset of a link-time address (None when no segment holds it in the file)."""
        seg = self._segment_at(vaddr)
        return None if seg is None else seg.offset + vaddr - seg.vaddr

    def read_vaddr(self, vaddr: int, size: int) -> bytes:
        """File bytes at a link-time address (b"" when no segment holds them in the file)."""
        seg = self._segment_at(vaddr)
        if seg is None:
            return b""
        start = seg.offset + vaddr - seg.vaddr
        return self.data[start : start + min(size, seg.vaddr + seg.filesz - vaddr)]


@dataclass(frozen=True)
class UsdtProbe:
    """One probe site, addresses as linked (add the load bias for a PIE)."""

    provider: str
    name: str
    location: int
    semaphore: int  # 0: no is-enabled semaphore
    arguments: tuple[str, ...]
    semaphore_field: int = 0  # file offset of the note's semaphore word

    @property
    def full_name(self) -> str:
        return f"{self.provider}:{self.name}"


def read_probes(elf: ElfFile) -> list[UsdtProbe]:
    """Every USDT probe site in the file, in note order."""
    sec = elf.section(".note.stapsdt")
    if sec is None or sec.type == SHT_NOBITS:
        return []
    base_sec = elf.section(".stapsdt.base")
    d, e = elf.data, elf.endian
    word = "Q" if elf.is64 else "I"
    wsize = 8 if elf.is64 else 4
    probes: list[UsdtProbe] = []
    off, end = sec.offset, sec.offset + sec.size
    while off + 12 <= end:
        namesz, descsz, ntype = struct.unpack_from(e + "III", d, off)
        name_off = off + 12
        desc_off = name_off + ((namesz + 3) & ~3)
        off = desc_off + ((descsz + 3) & ~3)
        if ntype != NT_STAPSDT or d[name_off : name_off + namesz].rstrip(b"\0") != b"stapsdt":
            continue
        pc, base, sem = struct.unpack_from(e + word * 3, d, desc_off)
        strings = d[desc_off + 3 * wsize : desc_off + descsz].split(b"\0")
        if len(strings) < 3:
            continue
        provider, name, args = (s.decode(errors="replace") for s in strings[:3])
        # The note holds link-time addresses; prelink or a linker script may
        # have moved the sections since, and .stapsdt.base says by how much.
        if base_sec is not None and base:
            shift = base_sec.addr - base
            pc += shift
            if sem:
                sem += shift
        field_at = desc_off + 2 * wsize
        probes.append(UsdtProbe(provider, name, pc, sem, tuple(args.split()), field_at))
    return probes


@dataclass
class Process:
    """A live process as /proc shows it."""

    pid: int
    comm: str
    exe: str  # the executable's path (without " (deleted)")
    image: Path  # /proc/PID/exe: the image that runs, even if the file was replaced
    maps: list[tuple[int, int, int, str]] = field(default_factory=list)  # start, end, offset, path


def _stat(root: Path) -> tuple[str, int]:
    """State letter and flags from /proc/PID/stat (the comm in parentheses may hold anything)."""
    try:
        fields = (root / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return "?", 0
    return fields[0], int(fields[6])


def open_process(pid: int, proc: str | Path = "/proc") -> Process:
    """The process, or a ProbesError that says in one line why it cannot be traced."""
    root = Path(proc) / str(pid)
    if pid <= 0 or not root.is_dir():
        raise ProbesError(f"no process with PID {pid}")
    try:
        comm = (root / "comm").read_text().strip()
    except OSError:
        raise ProbesError(f"no process with PID {pid}") from None
    state, flags = _stat(root)
    if state == "Z":
        raise ProbesError(f"PID {pid} ({comm}) has exited (a zombie not yet reaped)")
    if flags & PF_KTHREAD:
        raise ProbesError(f"PID {pid} ({comm}) is a kernel thread: it has no executable to probe")
    try:
        exe = os.readlink(root / "exe")
    except PermissionError:
        raise ProbesError(
            f"PID {pid} ({comm}) is not ours to trace: run kvprof as root (sudo kvprof ...)"
        ) from None
    except OSError:
        raise ProbesError(f"PID {pid} ({comm}) has exited") from None
    p = Process(pid, comm, exe.removesuffix(" (deleted)"), root / "exe")
    try:
        for line in (root / "maps").read_text().splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6:
                lo, hi = parts[0].split("-")
                p.maps.append(
                    (int(lo, 16), int(hi, 16), int(parts[2], 16), parts[5].removesuffix(" (deleted)"))
                )
    except PermissionError:
        raise ProbesError(
            f"PID {pid} ({comm}) is not ours to trace: run kvprof as root (sudo kvprof ...)"
        ) from None
    except OSError:
        raise ProbesError(f"PID {pid} ({comm}) exited") from None
    return p


def load_bias(process: Process, elf: ElfFile, path: str | None = None) -> int:
    """What to add to a link-time address of `elf` to get its address in the process
    (0 for a non-PIE executable); ProbesError when the file is not mapped."""
    if not elf.pie:
        return 0
    path = path or process.exe
    for start, _, offset, mapped in process.maps:
        if mapped != path:
            continue
        for seg in elf.segments:
            if seg.type == PT_LOAD and (seg.offset & PAGE_MASK) == offset:
                return start - (seg.vaddr & PAGE_MASK)
    raise ProbesError(f"{path} is not mapped in PID {process.pid}")


def read_semaphores(process: Process, probes: list[UsdtProbe], bias: int) -> dict[int, int]:
    """Current value of each semaphore (by link-time address) in the running process."""
    values: dict[int, int] = {}
    try:
        with open(f"/proc/{process.pid}/mem", "rb", buffering=0) as mem:
            for p in probes:
                if p.semaphore and p.semaphore not in values:
                    mem.seek(bias + p.semaphore)
                    values[p.semaphore] = int.from_bytes(mem.read(2), "little")
    except PermissionError:
        raise ProbesError(
            f"PID {process.pid} ({process.comm}) is not ours to trace: cannot read its memory; "
            "run kvprof as root (sudo kvprof ...)"
        ) from None
    except OSError:
        raise ProbesError(f"PID {process.pid} ({process.comm}) exited") from None
    return values


def probe_names(probes: list[UsdtProbe]) -> list[tuple[str, str]]:
    """(provider, name) of each probe once, in first-site order."""
    return list(dict.fromkeys((p.provider, p.name) for p in probes))
