"""Data addresses of atomic instructions, from a sampled IP and the user registers.

Used by the `regsample` collector (probes/regsample.bpf.c) in user space,
once per distinct IP: read the code around the IP from the live process,
find the instruction that ends at the IP (a cpu-clock sample interrupts after
the stalled instruction retires, so the IP is usually the next one: measured
in docs/cachelines.md) and the one at the IP, and keep it when it is an
atomic read-modify-write on memory: a `lock`-prefixed instruction, `xchg`
with memory (locked without the prefix) or `cmpxchg`. Its effective address
is then computed per sample from the sampled registers.

What cannot be attributed is marked with a reason, never raised:
`unreadable` (the IP's page cannot be read), `undecodable` (no instruction
there), `segment` (%fs:/%gs:-relative: the segment base is not in the
registers), `clobbered` (the instruction itself overwrote a register its
address is made of, so the sampled value is not the one it used).

Data symbols: an address in a file mapping is named from the OBJECT symbols
of the file and its debug file (`shared_items`, `stats+0x8`); anything else
is `heap 0x...` (anonymous memory and [heap]) or `stack 0x...`.

No bcc here: tests drive it on any process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import capstone
from capstone import x86

from kvprof.collect.debuginfo import FileMap, ProcessSymbols
from kvprof.collect.lockarg import MAX_FUNCTION, LockArg

# Register order of `struct sample_t.regs` in probes/regsample.bpf.c.
REGS = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp",
        "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")  # fmt: skip
_ALIASES = {
    "rax": ("eax", "ax", "al", "ah"), "rbx": ("ebx", "bx", "bl", "bh"), "rcx": ("ecx", "cx", "cl", "ch"),
    "rdx": ("edx", "dx", "dl", "dh"), "rsi": ("esi", "si", "sil"), "rdi": ("edi", "di", "dil"),
    "rbp": ("ebp", "bp", "bpl"), "rsp": ("esp", "sp", "spl"),
}  # fmt: skip
# capstone register name -> (index into REGS, mask of the bits an address of that width uses)
_REG: dict[str, tuple[int, int]] = {}
for _i, _name in enumerate(REGS):
    _REG[_name] = (_i, (1 << 64) - 1)
    for _alias in _ALIASES.get(_name, (f"{_name}d", f"{_name}w", f"{_name}b")):
        _REG[_alias] = (_i, (1 << 32) - 1)
MAX_INSN = 15
MAX_SWEEP = 1 << 16  # a function longer than this is decoded by trying lengths instead

UNREADABLE, UNDECODABLE, SEGMENT, CLOBBERED = "unreadable", "undecodable", "segment", "clobbered"


@dataclass(frozen=True)
class Atomic:
    """An atomic RMW instruction and how to compute its data address."""

    address: int  # of the instruction
    size: int
    text: str  # "lock add qword ptr [rdi], 1"
    width: int  # bytes written
    base: str = ""  # capstone register names, "" for none; "rip" for RIP-relative
    index: str = ""
    scale: int = 1
    disp: int = 0
    skid: bool = True  # the IP was the next instruction (registers are after it ran)

    def effective_address(self, regs: list[int] | tuple[int, ...]) -> int:
        """The data address from the sampled registers (REGS order)."""
        if self.base == "rip":
            return (self.address + self.size + self.disp) & ((1 << 64) - 1)
        ea = self.disp
        for reg, scale in ((self.base, 1), (self.index, self.scale)):
            if reg:
                idx, mask = _REG[reg]
                ea += (regs[idx] & mask) * scale
        return ea & ((1 << 64) - 1)


@dataclass(frozen=True)
class Decoded:
    """What one sampled IP is: an atomic (with its address rule), nothing of
    interest (`atomic is None`, `reason == ""`), or not attributable (`reason`)."""

    atomic: Atomic | None = None
    reason: str = ""


def _disassembler() -> capstone.Cs:
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    md.skipdata = False
    return md


def _family(name: str) -> int:
    return _REG[name][0] if name in _REG else -1


def _classify(md: capstone.Cs, insn: capstone.CsInsn, skid: bool) -> Decoded:
    """Decoded for one instruction: an Atomic when it is an atomic RMW on memory."""
    mem = [op for op in insn.operands if op.type == x86.X86_OP_MEM]
    locked = insn.prefix[0] == x86.X86_PREFIX_LOCK
    name = insn.mnemonic.split()[-1]  # "lock add" -> "add"
    if not mem or not (locked or name == "xchg" or name.startswith("cmpxchg")):
        return Decoded()
    m = mem[0].mem
    if m.segment in (x86.X86_REG_FS, x86.X86_REG_GS):
        return Decoded(reason=SEGMENT)
    base = md.reg_name(m.base) if m.base else ""
    index = md.reg_name(m.index) if m.index else ""
    if (base and base != "rip" and base not in _REG) or (index and index not in _REG):
        return Decoded(reason=UNDECODABLE)
    atomic = Atomic(
        address=insn.address, size=insn.size, text=f"{insn.mnemonic} {insn.op_str}".strip(),
        width=mem[0].size, base=base, index=index, scale=m.scale, disp=m.disp, skid=skid,
    )  # fmt: skip
    if skid:  # registers were sampled after it ran: it must not have changed its own address
        written = {_family(md.reg_name(r)) for r in insn.regs_access()[1]}
        written |= {_family(md.reg_name(op.reg)) for op in insn.operands if op.type == x86.X86_OP_REG}
        if name.startswith("cmpxchg"):
            written |= {_family("rax"), _family("rdx")}
        if {_family(base), _family(index)} & (written - {-1}):
            return Decoded(reason=CLOBBERED)
    return Decoded(atomic=atomic)


# ---- the target's memory and symbols ------------------------------------


class Process:
    """Code and data of one live process: instruction bytes from its memory (the
    code that runs, even when the file on disk was replaced), symbols from its
    mapped files and their debug files (kvprof.collect.debuginfo)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.symbols = ProcessSymbols(pid)
        self._md = _disassembler()
        self._lite = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        self._functions: dict[int, dict[int, int]] = {}
        self._decoded: dict[int, Decoded] = {}
        self._lockarg = LockArg()
        self._lock_regs: dict[int, int | None] = {}
        self.refresh()

    def refresh(self) -> None:
        self.symbols.refresh()

    def mapping(self, addr: int) -> FileMap | None:
        return self.symbols.mapping(addr)

    def read(self, addr: int, size: int) -> bytes:
        if not 0 <= addr < 1 << 63:  # no user address: pread takes a signed offset
            return b""
        try:
            fd = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY)
        except OSError:
            return b""
        try:
            return os.pread(fd, size, addr)
        except (OSError, OverflowError, ValueError):
            return b""
        finally:
            os.close(fd)

    def function(self, ip: int) -> tuple[str, int, int] | None:
        """(name, start address in the process, size) of the function holding `ip`."""
        return self.symbols.function(ip)

    def function_name(self, ip: int) -> str:
        """The function holding `ip`, `module+0xoffset` without a symbol, else `0x...`."""
        return self.symbols.function_name(ip) or f"0x{ip:x}"

    def data_symbol(self, addr: int) -> str:
        """`name`, `name+0x8`, or `heap 0x...`/`stack 0x...`."""
        name = self.symbols.object_name(addr)
        if name is not None:
            return name
        m = self.mapping(addr)
        kind = "heap" if m is None or m.path in ("", "[heap]") else m.path.strip("[]").split(":")[0]
        return f"{kind} 0x{addr:x}"

    def lock_register(self, ip: int) -> int | None:
        """The index (REGS order) of a register holding the first argument of the lock
        function at `ip` when the instruction there is about to run (kvprof.collect.lockarg);
        None when the function is unknown or the analysis lost it there."""
        if ip in self._lock_regs:
            return self._lock_regs[ip]
        found = None
        func = self.function(ip)
        if func is not None:
            _, start, size = func
            code = self.read(start, min(size or MAX_FUNCTION, MAX_FUNCTION))
            try:
                regs = self._lockarg.registers(code, start, ip)
            except (capstone.CsError, ValueError):
                regs = None
            if regs:
                found = min(REGS.index(r) for r in regs)
        self._lock_regs[ip] = found
        return found

    def decode(self, ip: int) -> Decoded:
        """What the sample at `ip` touched; decoded once per distinct IP."""
        done = self._decoded.get(ip)
        if done is None:
            try:
                done = self._decode(ip)
            except (capstone.CsError, KeyError, ValueError, OSError):
                done = Decoded(reason=UNDECODABLE)
            self._decoded[ip] = done
        return done

    def _ends(self, start: int, size: int) -> dict[int, int]:
        """end address -> start address of each instruction of the function at
        `start`, decoded once (a linear sweep, without operand details)."""
        ends = self._functions.get(start)
        if ends is None:
            code = self.read(start, size)
            ends = {a + n: a for a, n, _, _ in self._lite.disasm_lite(code, start)}
            self._functions[start] = ends
        return ends

    def _decode(self, ip: int) -> Decoded:
        code = self.read(ip - MAX_INSN, 2 * MAX_INSN)
        base = ip - MAX_INSN
        if len(code) <= MAX_INSN:
            code, base = self.read(ip, MAX_INSN), ip
            if not code:
                return Decoded(reason=UNREADABLE)
        before: capstone.CsInsn | None = None
        func = self.function(ip)
        if func is not None and ip > func[1] and func[2] <= MAX_SWEEP and base < ip:
            begin = self._ends(func[1], max(func[2], ip - func[1]) + MAX_INSN).get(ip)
            if begin is not None and begin >= base:
                before = next(self._md.disasm(code[begin - base : ip - base], begin, 1), None)
        if before is None and base < ip:
            # no symbol (or the sweep did not end at ip): the instruction that ends
            # at ip, trying each length; only an atomic is taken, so a wrong guess is rare
            for n in range(1, MAX_INSN + 1):
                insn = next(self._md.disasm(code[MAX_INSN - n : MAX_INSN], ip - n, 1), None)
                if insn is not None and insn.size == n and _classify(self._md, insn, True) != Decoded():
                    before = insn
                    break
        if before is not None:
            prev = _classify(self._md, before, skid=True)
            if prev != Decoded():
                return prev
        at = next(self._md.disasm(code[ip - base :], ip, 1), None)
        if at is None:
            return Decoded() if before is not None else Decoded(reason=UNDECODABLE)
        return _classify(self._md, at, skid=False)
