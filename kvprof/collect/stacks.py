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
        self.symbols = Symbolizer(pid, self.unwinder)
        self.names = ThreadNames(pid)
        self._ustacks: dict[int, tuple[list[int], str]] = {}  # what was read of `ustacks`

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

    def user_stacks(self) -> dict[int, tuple[list[int], str]]:
        """`ustacks`: key -> (ips leaf first, why the walk stopped)."""
        assert self.module is not None
        return unwind.read_stacks(self.module.table("ustacks"), self._ustacks)
