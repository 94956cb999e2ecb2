"""What the two collectors that walk user stacks with probes/unwind.h (oncpu,
offcpu) share: the programs of one module share its unwind tables (one
Unwinder, kvprof/collect/unwind.py) and its `ustacks` map."""

from __future__ import annotations

from kvprof.collect import CollectOptions, unwind
from kvprof.collect.bpf import BpfCollector, Module, Program, ThreadNames
from kvprof.collect.symbols import Symbolizer


class StackCollector(BpfCollector):
    """A BPF collector whose program walks user stacks with probes/unwind.h: the
    programs of one module share its unwind tables (one Unwinder) and `ustacks`."""

    def __init__(self, pid: int, opts: CollectOptions) -> None:
        super().__init__(pid, opts)
        self.unwinder = unwind.Unwinder(pid)
        self.symbols = Symbolizer(pid, self.unwinder, opts.inline)
        self.names = ThreadNames(pid)
        self._ustacks: dict[int, tuple[list[int], str]] = {}  # what was read of `ustacks`
        self._frames: dict[tuple[int, int], tuple[tuple[str, ...], str | None]] = {}  # frames()

    def program_of(self, flags: list[str]) -> Program:
        """probes/<name>.bpf.c with unwind.h, and `flags` beyond unwind.h's bounds."""
        return Program(
            self.name, unwind.with_unwinder(self.name), [*unwind.cflags(self.opts.stack_storage), *flags]
        )

    def _attach(self, module: Module) -> None:
        self.names.refresh()
        self.symbols.warm()
        self.unwinder = unwind.shared(module, self.unwinder, self.opts.progress, self.name)
        self.symbols.unwinder = self.unwinder

    def refresh(self) -> None:
        """Push what was mapped since attaching (the uprobe trampoline, dlopen)."""
        if self.module is not None:
            self.unwinder.refresh(self.module.bpf)

    def user_frames(self, key: int) -> tuple[list[str], str | None]:
        """The frames (root first) of user stack `key` in `ustacks`, and why its walk
        stopped; [] and None for no stack (key 0: none taken, or no room in the map)."""
        assert self.module is not None
        stack = unwind.read_stack(self.module.table("ustacks"), key, self._ustacks) if key else None
        if not stack or not stack[0]:
            return [], None
        ips, reason = stack
        return self.symbols.unwound(ips, reason), reason

    def frames(self, user_key: int, kernel_id: int) -> tuple[tuple[str, ...], str | None]:
        """The user then the kernel frames of one aggregation key, root first, and
        why the user walk stopped (None: no user stack); each pair is resolved once
        (both stacks are immutable once stored)."""
        pair = (user_key, kernel_id)
        got = self._frames.get(pair)
        if got is None:
            user, reason = self.user_frames(user_key)
            kernel = self.symbols.stack(self.table("stacks"), kernel_id, kernel=True)
            got = (tuple(user + kernel), reason)
            if reason is not None or not user_key:  # a stack not found may be found later
                self._frames[pair] = got
        return got
