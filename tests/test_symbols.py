"""Kernel stacks lose the tracing machinery that ran the BPF program: the
stacks below are as BCC resolved them here (off-CPU at sched_switch, with the
program itself resolved from a stale /proc/kallsyms read; an on-CPU sample
that hit a uprobe's program; a futex wait taken at sys_exit_futex)."""

from __future__ import annotations

import pytest

pytest.importorskip("bcc", reason="BCC (python3-bpfcc) is not importable: run scripts/provision.sh")

from kvprof.collect.symbols import without_tracing

SWITCH = ["do_syscall_64_[k]", "exit_to_user_mode_loop_[k]", "schedule_[k]", "__schedule_[k]"]
UPROBE = [
    "entry_SYSCALL_64_after_hwframe_[k]", "do_syscall_64_[k]", "__x64_sys_uprobe_[k]",
    "handle_syscall_uprobe_[k]", "handler_chain_[k]", "uprobe_dispatcher_[k]",
]  # fmt: skip
FUTEX = ["entry_SYSCALL_64_after_hwframe_[k]", "do_syscall_64_[k]", "syscall_exit_work_[k]"]


@pytest.mark.parametrize(
    ("frames", "kept"),
    [
        ([*SWITCH, "bpf_trace_run4_[k]", "_einittext_[k]"], SWITCH),
        ([*SWITCH, "__traceiter_sched_switch_[k]", "bpf_prog_1a_on_switch_[k]"], SWITCH),
        ([*UPROBE, "__uprobe_perf_func_[k]", "bpf_prog_cc7d_on_sample_[k]", "strncpy_from_user_[k]"], UPROBE),
        ([*FUTEX, "perf_syscall_exit_[k]", "trace_call_bpf_[k]", "bpf_prog_99_on_exit_[k]"], FUTEX),
        (SWITCH, SWITCH),
        ([], []),
    ],
)
def test_tracing_frames_are_cut_where_they_start(frames: list[str], kept: list[str]) -> None:
    assert without_tracing(frames) == kept
