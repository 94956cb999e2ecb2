"""Session.start(): every BPF collector compiled as one module, each state
reported, and nothing left attached when attaching is cut short: close()
from another thread, Ctrl-C (KeyboardInterrupt) in the attaching thread, a
collector whose program does not compile.

"Nothing attached" is checked on our own side and the target's: no BPF or
perf-event fd of this process beyond those held before, every BPF program
we loaded unloaded, nothing of ours in uprobe_events, and every kvs
semaphore of the target back to 0 (read from /proc/PID/mem).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest
from bcc import BPF
from support import assert_detached, our_bpf_fds, prog_ids, prog_loaded, wait_until

from kvprof.collect import ATTACH_NICE, CollectOptions
from kvprof.collect.bpf import compile_kept, read_user_flags
from kvprof.collect.session import ALL_COLLECTORS
from kvprof.system.attach import open_session
from kvprof.system.servers import Server

pytestmark = pytest.mark.bpf


def assert_nothing_ours(server: Server, before: dict[int, str], loaded: set[int]) -> None:
    left = {fd: kind for fd, kind in our_bpf_fds().items() if fd not in before}
    assert not left, f"fds still open: {left}"
    # the kernel frees a program once its last reference goes, after an RCU grace
    # period: give it a moment, then name what is still there
    wait_until(lambda: not any(prog_loaded(i) for i in loaded), timeout=10)
    assert not [i for i in loaded if prog_loaded(i)], "BPF programs still loaded"
    assert_detached(server)


def loaded_now(before: dict[int, str]) -> set[int]:
    return prog_ids({fd: k for fd, k in our_bpf_fds().items() if fd not in before})


def nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_states_in_order_and_one_module(kvcached_factory: Callable[..., Server]) -> None:
    """Each collector goes compiling -> attaching -> ok; the BPF ones share one module;
    the attaching thread compiles at nice ATTACH_NICE and is back at its own after."""
    server = kvcached_factory("-t", "2")
    seen: list[tuple[str, str]] = []
    nices: set[int] = set()

    def on_state(name: str, state: str) -> None:
        seen.append((name, state))
        nices.add(nice())

    before = nice()
    s = open_session(server.pid, ALL_COLLECTORS, CollectOptions())
    try:
        s.start(on_state=on_state)
        assert nice() == before, "the attaching thread's priority is restored"
        assert nices == {min(before, ATTACH_NICE)}, nices
        assert s.status.collectors == dict.fromkeys(ALL_COLLECTORS, "ok"), s.status.collectors
        for name in ALL_COLLECTORS:
            assert [st for n, st in seen if n == name] == ["compiling", "attaching", "ok"], seen
        assert len({id(c.module) for c in s.active}) == 1, "one compiled module for every BPF collector"
    finally:
        s.close()
    assert_detached(server)


@pytest.mark.parametrize("when", ["compiling", "attaching"])
def test_close_from_another_thread_while_attaching(
    kvcached_factory: Callable[..., Server], when: str
) -> None:
    """close() from another thread while start() compiles (or has attached some
    collectors): once close() returns nothing of ours is attached, and start()
    ends without error."""
    server = kvcached_factory("-t", "2")
    before = our_bpf_fds()
    reached = threading.Event()
    trigger = ("oncpu", "compiling") if when == "compiling" else ("cachelines", "attaching")
    s = open_session(server.pid, ALL_COLLECTORS, CollectOptions())
    loaded: set[int] = set()
    errors: list[BaseException] = []

    def on_state(name: str, state: str) -> None:
        if (name, state) == trigger:
            loaded.update(loaded_now(before))
            reached.set()

    def run() -> None:
        try:
            s.start(on_state=on_state)
        except BaseException as e:  # start() must not fail because it was closed
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    assert reached.wait(120), "start() never reached the trigger state"
    s.close()
    assert_nothing_ours(server, before, loaded)
    t.join(120)
    assert not t.is_alive() and not errors, errors
    assert not s.active
    if when == "attaching":
        assert loaded, "the collectors before cachelines had loaded programs"
    assert_nothing_ours(server, before, loaded | loaded_now(before))


@pytest.mark.parametrize("at", [("offcpu", "compiling"), ("cachelines", "attaching")])
def test_ctrl_c_while_attaching_leaves_nothing(
    kvcached_factory: Callable[..., Server], at: tuple[str, str]
) -> None:
    """KeyboardInterrupt in the thread running start() (what Ctrl-C raises in
    `record`): it propagates, and nothing stays attached."""
    server = kvcached_factory("-t", "2")
    before = our_bpf_fds()
    loaded: set[int] = set()

    def on_state(name: str, state: str) -> None:
        loaded.update(loaded_now(before))
        if (name, state) == at:
            raise KeyboardInterrupt

    s = open_session(server.pid, ALL_COLLECTORS, CollectOptions())
    with pytest.raises(KeyboardInterrupt):
        s.start(on_state=on_state)
    assert not s.active
    assert_nothing_ours(server, before, loaded)


def test_a_program_that_does_not_compile_sinks_only_its_collector(
    kvcached_factory: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """requests' program broken: the one module fails, each collector is compiled
    alone, requests is reported failed with clang's error, the others count."""
    from kvprof.collect.bpf import Program
    from kvprof.collect.requests import RequestsCollector

    def broken(self: RequestsCollector) -> Program:
        return Program("requests", "int requests_on_done(struct pt_regs *ctx) { return undeclared; }")

    monkeypatch.setattr(RequestsCollector, "program", broken)
    server = kvcached_factory("-t", "2")
    with open_session(server.pid, ALL_COLLECTORS, CollectOptions()) as s:
        assert s.status.collectors["requests"].startswith("failed: cannot compile requests: "), s.status
        assert "undeclared" in s.status.collectors["requests"] and "\n" not in s.status.collectors["requests"]
        assert {n for n, st in s.status.collectors.items() if st == "ok"} == set(ALL_COLLECTORS) - {
            "requests"
        }
        server.stats()  # some traffic for the probes
        p = s.snapshot()
    assert "requests" not in p.collectors and "locks" in p.collectors
    assert_detached(server)


READS_USER = """
#include <uapi/linux/ptrace.h>
int kv_reads_user(struct pt_regs *ctx) {
    char s[16] = {};
    u64 v = 0;
    bpf_probe_read_user(&v, sizeof(v), (void *)PT_REGS_SP(ctx));
    bpf_probe_read_user_str(s, sizeof(s), (void *)PT_REGS_PARM1(ctx));
    return (int)v + s[0];
}
"""

# the helpers' numbers in the kernel's UAPI (enum bpf_func_id)
PROBE_READ_USER, PROBE_READ_USER_STR = 112, 114


def test_read_user_helpers_compiled_under_other_names_are_the_same_helpers() -> None:
    """compile_kept() calls bpf_probe_read_user{,_str} by other names (BCC's front
    end would look each call up in the kernel's symbols): where the kernel has
    the helpers, the program still calls exactly them and loads; on a kernel
    before 5.5 (or a release that cannot be read) BCC's own fallback stays."""
    assert read_user_flags("5.4.0-150-generic") == []
    assert read_user_flags("not-a-release") == []
    assert read_user_flags(os.uname().release), "this kernel has the helpers (5.5 and later)"
    bpf = compile_kept(READS_USER, [])
    try:
        bpf.load_func(b"kv_reads_user", BPF.KPROBE)  # loading runs the verifier; nothing is attached
        code = bpf.dump_func(b"kv_reads_user")
        calls = [
            int.from_bytes(code[i + 4 : i + 8], "little")
            for i in range(0, len(code), 8)
            if code[i] == 0x85  # BPF_JMP | BPF_CALL: imm is the helper's number
        ]
        assert PROBE_READ_USER in calls and PROBE_READ_USER_STR in calls, calls
    finally:
        bpf.cleanup()
