"""Which registers hold a lock function's lock at an instruction: the mutex a
sample inside pthread_mutex_lock & co. (kvprof.collect.regsample.LOCK_PREFIXES)
acts on, from its registers.

Every lock function of glibc takes its lock as its first argument (`rdi` at
entry): pthread_mutex_lock/unlock/trylock, __pthread_mutex_unlock_usercnt,
__lll_lock_wait (the futex word, the mutex's first field), the rwlock and
spinlock calls. The compiler may keep it in `rdi`, copy it to a callee-saved
register (`mov rbx, rdi` in trylock) or spill it around a call and load it
back. Which register holds it at an address is found by a forward data-flow
over the function's control-flow graph, decoded once per function: the set of
registers (and stack slots, relative to the stack pointer at entry) that
surely hold the entry `rdi`, intersected where paths meet. A `syscall` keeps
`rdi` (the futex call's first argument is the lock word), a `call` loses the
caller-saved registers. Blocks reached only through an indirect jump (a jump
table) start from what held at the jump.

Pure: it reads code bytes given to it (kvprof.collect.decode.Process reads
them from the live process). No bcc here.
"""

from __future__ import annotations

from dataclasses import dataclass

import capstone
from capstone import x86

# the registers a call may change (System V x86-64), and a syscall
CALLER_SAVED = frozenset({"rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11"})
SYSCALL_CLOBBERS = frozenset({"rax", "rcx", "r11"})
MAX_FUNCTION = 1 << 14  # a longer function is not analysed
_STOP = ("ret", "ud2", "hlt")


@dataclass(frozen=True)
class _State:
    regs: frozenset[str]  # 64-bit registers holding the lock
    slots: frozenset[int]  # stack slots holding it, as offsets from the entry rsp
    sp: int | None  # rsp - entry rsp; None once unknown

    def join(self, other: _State) -> _State:
        same_sp = self.sp == other.sp
        return _State(
            self.regs & other.regs,
            self.slots & other.slots if same_sp else frozenset(),
            self.sp if same_sp else None,
        )


_ENTRY = _State(frozenset({"rdi"}), frozenset(), 0)


def _md() -> capstone.Cs:
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    return md


class LockArg:
    """The lock argument's registers at any address of the functions it was asked about."""

    def __init__(self) -> None:
        self._md = _md()
        self._functions: dict[int, _Function | None] = {}

    def registers(self, code: bytes, start: int, ip: int) -> frozenset[str] | None:
        """The registers that hold the lock when the instruction at `ip` is about to run,
        in the function at `start` whose bytes are `code`; None when `ip` is not an
        instruction the analysis reached."""
        fn = self._functions.get(start)
        if start not in self._functions:
            fn = self._functions[start] = _Function.build(self._md, code[:MAX_FUNCTION], start)
        return fn.at(ip) if fn is not None else None


def _reg64(md: capstone.Cs, reg: int) -> str:
    """The 64-bit register a register operand is part of ("" for others)."""
    name = md.reg_name(reg) or ""
    return _FAMILY.get(name, "")


# every register name capstone gives -> the 64-bit register it is part of
_FAMILY: dict[str, str] = {}
for _r, _low in (("ax", "al ah"), ("bx", "bl bh"), ("cx", "cl ch"), ("dx", "dl dh"),
                 ("si", "sil"), ("di", "dil"), ("bp", "bpl"), ("sp", "spl")):  # fmt: skip
    for _n in (f"r{_r}", f"e{_r}", _r, *_low.split()):
        _FAMILY[_n] = f"r{_r}"
for _i in range(8, 16):
    for _s in ("", "d", "w", "b"):
        _FAMILY[f"r{_i}{_s}"] = f"r{_i}"


def _is_reg64(md: capstone.Cs, op: capstone.x86.X86Op) -> str:
    if op.type != x86.X86_OP_REG:
        return ""
    name = md.reg_name(op.reg) or ""
    return name if _FAMILY.get(name) == name else ""


def _stack_slot(md: capstone.Cs, op: capstone.x86.X86Op, sp: int | None) -> int | None:
    """The slot `[rsp + d]` addresses, as an offset from the entry rsp."""
    if op.type != x86.X86_OP_MEM or sp is None or op.mem.index or op.mem.segment:
        return None
    if md.reg_name(op.mem.base) != "rsp":
        return None
    return sp + int(op.mem.disp)


def _step(md: capstone.Cs, insn: capstone.CsInsn, s: _State) -> _State:
    """The state after `insn` runs."""
    regs, slots, sp = set(s.regs), set(s.slots), s.sp
    name = insn.mnemonic
    ops = insn.operands
    if name == "call":
        return _State(frozenset(regs - CALLER_SAVED), frozenset(slots), sp)
    if name == "syscall":
        return _State(frozenset(regs - SYSCALL_CLOBBERS), frozenset(slots), sp)
    if name == "push" and len(ops) == 1:
        sp = None if sp is None else sp - 8
        src = _is_reg64(md, ops[0])
        if sp is not None:
            slots.discard(sp)
            if src and src in regs:
                slots.add(sp)
        return _State(frozenset(regs), frozenset(slots), sp)
    if name == "pop" and len(ops) == 1:
        dst = _is_reg64(md, ops[0])
        regs.discard(_reg64(md, ops[0].reg) if ops[0].type == x86.X86_OP_REG else "")
        if dst and sp is not None and sp in slots:
            regs.add(dst)
        return _State(frozenset(regs), frozenset(slots), None if sp is None else sp + 8)
    if len(ops) == 2 and name in ("mov", "lea"):
        dst, src = ops
        d64 = _is_reg64(md, dst)
        if name == "mov" and d64 and _is_reg64(md, src):  # mov r64, r64: a copy
            regs.discard(d64)
            if _is_reg64(md, src) in s.regs:
                regs.add(d64)
            return _State(frozenset(regs), frozenset(slots), sp)
        if name == "lea" and d64 and src.mem.index == 0 and src.mem.disp == 0 and src.mem.base:
            base = md.reg_name(src.mem.base) or ""
            regs.discard(d64)
            if base in s.regs:
                regs.add(d64)
            return _State(frozenset(regs), frozenset(slots), sp)
        if name == "mov" and d64 and dst.size == 8 and (slot := _stack_slot(md, src, sp)) is not None:
            regs.discard(d64)
            if slot in slots:
                regs.add(d64)
            return _State(frozenset(regs), frozenset(slots), sp)
        if name == "mov" and (slot := _stack_slot(md, dst, sp)) is not None:
            slots.discard(slot)
            if dst.size == 8 and _is_reg64(md, src) in s.regs:
                slots.add(slot)
            return _State(frozenset(regs), frozenset(slots), sp)
    # anything else: what it writes no longer holds the lock
    _, written = insn.regs_access()
    for reg in written:
        family = _reg64(md, reg)
        if family == "rsp":
            if name in ("sub", "add") and len(ops) == 2 and ops[1].type == x86.X86_OP_IMM and sp is not None:
                sp = sp - ops[1].imm if name == "sub" else sp + ops[1].imm
            elif name != "call":
                sp = None
        elif family:
            regs.discard(family)
    for op in ops:
        if op.type == x86.X86_OP_MEM and op.access & capstone.CS_AC_WRITE:
            slot = _stack_slot(md, op, sp)
            if slot is not None:
                slots.discard(slot)
    if sp is None:
        slots.clear()
    return _State(frozenset(regs), frozenset(slots), sp)


@dataclass
class _Block:
    insns: list[capstone.CsInsn]
    succ: list[int]  # start addresses of the blocks it may go to
    indirect: bool  # ends in a jump whose target is not in the code


@dataclass
class _Function:
    md: capstone.Cs
    blocks: dict[int, _Block]
    state_in: dict[int, _State]

    @classmethod
    def build(cls, md: capstone.Cs, code: bytes, start: int) -> _Function | None:
        try:
            insns = list(md.disasm(code, start))
        except capstone.CsError:
            return None
        if not insns:
            return None
        end = insns[-1].address + insns[-1].size
        addrs = {i.address for i in insns}
        leaders = {start}
        for i, insn in enumerate(insns):
            if _branches(insn) or insn.mnemonic in _STOP:
                target = _target(insn)
                if target is not None and target in addrs:
                    leaders.add(target)
                if i + 1 < len(insns):
                    leaders.add(insns[i + 1].address)
        blocks: dict[int, _Block] = {}
        cur: list[capstone.CsInsn] = []
        for insn in insns:
            if insn.address in leaders and cur:
                blocks[cur[0].address] = _finish(cur, addrs, end)
                cur = []
            cur.append(insn)
        if cur:
            blocks[cur[0].address] = _finish(cur, addrs, end)
        fn = cls(md, blocks, {})
        fn._solve()
        return fn

    def _out(self, b: _Block, s: _State) -> _State:
        for insn in b.insns:
            s = _step(self.md, insn, s)
        return s

    def _flow(self, work: list[int]) -> None:
        while work:
            addr = work.pop()
            b = self.blocks[addr]
            out = self._out(b, self.state_in[addr])
            for nxt in b.succ:
                old = self.state_in.get(nxt)
                new = out if old is None else old.join(out)
                if new != old:
                    self.state_in[nxt] = new
                    work.append(nxt)

    def _solve(self) -> None:
        first = min(self.blocks)
        self.state_in[first] = _ENTRY
        self._flow([first])
        seen = self.state_in
        jumps = [self._out(b, seen[a]) for a, b in self.blocks.items() if b.indirect and a in seen]
        if not jumps:
            return
        at_jump = jumps[0]
        for s in jumps[1:]:
            at_jump = at_jump.join(s)
        unreached = [a for a in self.blocks if a not in self.state_in]
        for a in unreached:
            self.state_in[a] = at_jump
        self._flow(unreached)

    def at(self, ip: int) -> frozenset[str] | None:
        starts = [a for a in self.blocks if a <= ip]
        if not starts:
            return None
        addr = max(starts)
        s = self.state_in.get(addr)
        if s is None:
            return None
        for insn in self.blocks[addr].insns:
            if insn.address == ip:
                return s.regs
            s = _step(self.md, insn, s)
        return None


def _branches(insn: capstone.CsInsn) -> bool:
    return bool(insn.group(x86.X86_GRP_JUMP))


def _target(insn: capstone.CsInsn) -> int | None:
    ops = insn.operands
    return int(ops[0].imm) if len(ops) == 1 and ops[0].type == x86.X86_OP_IMM else None


def _finish(insns: list[capstone.CsInsn], addrs: set[int], end: int) -> _Block:
    last = insns[-1]
    nxt = last.address + last.size
    succ: list[int] = []
    indirect = False
    if _branches(last):
        target = _target(last)
        if target is not None and target in addrs:
            succ.append(target)
        elif target is None:
            indirect = True
        if last.mnemonic != "jmp" and nxt < end:
            succ.append(nxt)
    elif last.mnemonic not in _STOP and nxt < end:
        succ.append(nxt)
    return _Block(insns, succ, indirect)
