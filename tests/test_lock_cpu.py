"""The CPU of the lock machinery, attributed to the lock and its caller
(kvprof.collect.lockarg, the `regsample` collector's lock samples,
kvprof.analysis.findings.lock_cpu).

The data-flow tests run on hand-assembled code; the analysis tests on
hand-made profiles; the BPF tests record real programs: four threads on one
global mutex (tests/programs/glibc_lock.c) against Debian's glibc, and
Debian's memcached under kvload.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from support import kvload, record, start_ready

from kvprof.analysis.findings import find
from kvprof.analysis.findings.lock_cpu import ID_PREFIX, UNKNOWN_CALLER, describe
from kvprof.analysis.whatif import GAIN_KEY, gain_if_fixed
from kvprof.model.delta import delta
from kvprof.model.profile import (
    AddressSample,
    CpuStack,
    LockCpuSample,
    Profile,
    SampledAddresses,
    Target,
    ThreadInfo,
    Window,
)
from kvprof.system.servers import Server
from kvprof.tui.data import cost_line
from kvprof.views.report import render_text, to_json

lockarg = pytest.importorskip("kvprof.collect.lockarg", reason="capstone (python3-capstone) is missing")
is_lock_function = pytest.importorskip("kvprof.collect.regsample", reason="needs BCC").is_lock_function

GLIBC_LOCK = Path(__file__).parent / "programs" / "glibc_lock.c"

# ---- which register holds the lock ---------------------------------------------------------

# A function as a compiler writes a lock call: the lock copied to a callee-saved
# register and spilled around calls, the caller-saved ones lost at each call.
FUNCTION = [
    ("53", "push rbx"),
    ("4889fb", "mov rbx, rdi"),
    ("4883ec10", "sub rsp, 0x10"),
    ("48897c2408", "mov [rsp + 8], rdi"),
    ("e800000000", "call"),
    ("488b7c2408", "mov rdi, [rsp + 8]"),
    ("8b07", "mov eax, [rdi]"),
    ("31ff", "xor edi, edi"),
    ("8b03", "mov eax, [rbx]"),
    ("4883c410", "add rsp, 0x10"),
    ("5b", "pop rbx"),
    ("c3", "ret"),
]


def _assembled(insns: list[tuple[str, str]], start: int = 0x1000) -> tuple[bytes, dict[str, int]]:
    code = b""
    at: dict[str, int] = {}
    for hexa, text in insns:
        at.setdefault(text, start + len(code))
        code += bytes.fromhex(hexa)
    return code, at


def test_lock_register_follows_copies_spills_and_calls() -> None:
    """rdi at entry; rbx once copied; rdi lost at a call and back from its stack slot;
    neither once overwritten."""
    code, at = _assembled(FUNCTION)
    la = lockarg.LockArg()
    assert la.registers(code, 0x1000, at["push rbx"]) == {"rdi"}
    assert la.registers(code, 0x1000, at["sub rsp, 0x10"]) == {"rdi", "rbx"}
    assert la.registers(code, 0x1000, at["mov rdi, [rsp + 8]"]) == {"rbx"}
    assert la.registers(code, 0x1000, at["mov eax, [rdi]"]) == {"rdi", "rbx"}
    assert la.registers(code, 0x1000, at["mov eax, [rbx]"]) == {"rbx"}
    assert la.registers(code, 0x1000, at["ret"]) == frozenset()
    assert la.registers(code, 0x1000, 0x1001 + len(code)) is None  # not an instruction of it


def test_lock_register_where_paths_meet_and_past_a_jump_table() -> None:
    """Where two paths meet only what both keep holds; a block reached only by an
    indirect jump starts from the jump."""
    code, at = _assembled(
        [
            ("4889fb", "mov rbx, rdi"),
            ("85f6", "test esi, esi"),
            ("7403", "je +3"),
            ("4831db", "xor rbx, rbx"),  # one path loses rbx
            ("8b07", "mov eax, [rdi]"),  # paths meet: rdi alone
            ("ffe0", "jmp rax"),
            ("8b03", "mov eax, [rbx]"),  # reached only through the jump table
            ("c3", "ret"),
        ]
    )
    la = lockarg.LockArg()
    assert la.registers(code, 0x1000, at["mov eax, [rdi]"]) == {"rdi"}
    assert la.registers(code, 0x1000, at["mov eax, [rbx]"]) == {"rdi"}


def test_lock_functions_by_name() -> None:
    """glibc's names and aliases of its lock machinery are lock functions; attributes
    and condition waits are not."""
    for name in ("pthread_mutex_lock", "__pthread_mutex_unlock_usercnt", "__GI___lll_lock_wait",
                 "___pthread_mutex_trylock", "__lll_lock_wake_private", "pthread_rwlock_wrlock"):  # fmt: skip
        assert is_lock_function(name), name
    for name in ("pthread_mutexattr_init", "pthread_cond_wait", "worker", "libc.so.6+0x8610f"):
        assert not is_lock_function(name), name


# ---- the finding, on hand-made profiles ------------------------------------------------------


def _sample(
    tid: int, addr: int, symbol: str, function: str, callers: list[str], n: int, kernel: bool = False
) -> LockCpuSample:
    return LockCpuSample(tid, addr, symbol, function, function, callers, kernel, n)


def _profile(
    locks: list[LockCpuSample], per_thread: int = 100, lines: list[AddressSample] | None = None
) -> Profile:
    tids = sorted({s.tid for s in locks})
    return Profile(
        target=Target(pid=1, comm="prog", exe="/usr/bin/prog"),
        window=Window(duration_s=2.0),
        hz=50,
        threads={str(t): ThreadInfo(name=f"w{t}", cpu_samples=per_thread) for t in tids},
        addresses=SampledAddresses(
            samples=lines or [], thread_samples={str(t): per_thread for t in tids}, locks=locks
        ),
    )


LOCK = 0x5000_00A0
TWO_THREADS = [
    _sample(1, LOCK, "big_lock", "pthread_mutex_lock", ["kv_lock", "update_stats", "serve"], 20),
    _sample(2, LOCK, "big_lock", "pthread_mutex_lock", ["kv_lock", "update_stats", "serve"], 10, kernel=True),
    _sample(
        1, LOCK, "big_lock", "__pthread_mutex_unlock_usercnt", ["kv_unlock", "finish_stats", "serve"], 10
    ),
    _sample(2, 0x7000, "heap 0x7000", "pthread_mutex_lock", ["other_fn"], 1),
]


def test_lock_cpu_finding_names_the_lock_and_its_taker() -> None:
    """The samples of one mutex make one finding: its symbol, the function that takes it (wrappers skipped),
    its unlock's samples included, its cost as the CPU share per thread with a gain from the what-if model."""
    p = _profile(TWO_THREADS)
    found = [f for f in find(p) if f.id.startswith(ID_PREFIX)]
    assert [f.where for f in found] == [
        "update_stats"
    ]  # heap 0x7000: 0.5% of the CPU, under the info threshold
    f = found[0]
    assert f.title == "mutex `big_lock` taken in update_stats: 20.0% of the CPU in lock and unlock"
    assert f.sites == ["update_stats", "finish_stats"]
    assert f.severity == "critical"  # 20 % of the CPU samples
    assert f.per_thread["1"]["samples"] == 30 and f.per_thread["2"]["samples"] == 10
    assert f.per_thread["1"]["cpu_s_per_s"] == pytest.approx(30 / 50 / 2.0)
    assert f.cost["kernel_share"] == pytest.approx(0.25) and f.cost["unlock_share"] == pytest.approx(0.25)
    assert f.cost[GAIN_KEY] > 0
    assert "Up to 2 threads took the same lock" in f.explanation


def test_lock_functions_attributed_to_their_locks_are_no_hot_function() -> None:
    """pthread_mutex_lock hot as a leaf is not a `hot function` finding of its own once its
    samples were given to their lock; another hot leaf still is."""
    p = _profile(TWO_THREADS)
    p.oncpu = [
        CpuStack(1, ["serve", "update_stats", "pthread_mutex_lock"], 60),
        CpuStack(1, ["serve", "parse"], 60),
        CpuStack(2, ["serve", "other_fn", "__lll_lock_wake"], 10),
    ]
    ids = {f.id for f in find(p)}
    assert "cpu:parse" in ids and "cpu:pthread_mutex_lock" not in ids
    assert "cpu:__lll_lock_wake" in ids  # no lock sample had it as its leaf


def test_many_locks_of_one_taker_are_named_by_their_region() -> None:
    """An array of mutexes taken in one function is one finding naming the range they
    lie in, or their object."""
    heap = [
        _sample(1, 0x9000 + 40 * i, f"heap 0x{0x9000 + 40 * i:x}", "pthread_mutex_lock", ["item_lock"], 5)
        for i in range(6)
    ]
    assert describe(heap) == "6 mutexes in heap 0x9000-0x90c8"
    arr = [
        _sample(1, 0x9000 + 64 * i, f"item_locks+0x{64 * i:x}", "pthread_mutex_lock", ["item_lock"], 5)
        for i in range(1, 5)
    ]
    assert describe(arr) == "4 mutexes in `item_locks`"
    data = [
        _sample(1, 0x4E2A8 + 8 * i, f"prog+0x{0x4E2A8 + 8 * i:x}", "pthread_mutex_lock", ["f"], 5)
        for i in range(2)
    ]
    # no symbol: no object; a few are listed, more are a range of the module's data
    assert describe(data, "/usr/bin/prog") == "2 mutexes: `prog+0x4e2a8` and `prog+0x4e2b0`"
    more = [
        _sample(1, 0x4E2A8 + 40 * i, f"prog+0x{0x4E2A8 + 40 * i:x}", "pthread_mutex_lock", ["f"], 5)
        for i in range(5)
    ]
    assert describe(more, "/usr/bin/prog") == "5 mutexes in prog+0x4e2a8-0x4e348"


def test_an_array_of_locks_taken_in_several_functions_is_one_finding() -> None:
    """Heap locks whose address ranges interleave (an array sampled at different elements from
    each caller) make one finding, named after the function that takes them most; a lock
    elsewhere in the heap stays apart."""

    def at(i: int) -> tuple[int, str]:
        return 0x9000 + 40 * i, f"heap 0x{0x9000 + 40 * i:x}"

    rows = [
        *(_sample(1, *at(i), "pthread_mutex_lock", ["item_get"], 5) for i in (0, 4, 8)),
        *(_sample(2, *at(i), "pthread_mutex_trylock", ["item_bump"], 3) for i in (2, 6)),
        *(_sample(1, *at(i), "pthread_mutex_unlock", ["item_put"], 9) for i in (1, 7)),
        _sample(2, 0x40000, "heap 0x40000", "pthread_mutex_lock", ["stats_add"], 4),
    ]
    found = {f.where: f for f in find(_profile(rows)) if f.id.startswith(ID_PREFIX)}
    assert set(found) == {"item_get", "stats_add"}
    assert found["item_get"].title.startswith("7 mutexes in heap 0x9000-0x9140 taken in item_get: ")
    assert set(found["item_get"].sites) == {"item_get", "item_bump", "item_put"}
    assert "too few samples to say whether threads share it" in found["item_get"].explanation


def test_unknown_caller_and_no_samples() -> None:
    """Without stacks the finding still names the lock; without lock samples there is none."""
    p = _profile([_sample(1, LOCK, "big_lock", "pthread_mutex_lock", [], 10)])
    (f,) = [f for f in find(p) if f.id.startswith(ID_PREFIX)]
    assert f.where == UNKNOWN_CALLER and "`big_lock`" in f.title
    assert "Each lock was taken by one thread only" in f.explanation  # 10 samples, all of one thread
    assert not [f for f in find(_profile([])) if f.id.startswith(ID_PREFIX)]


def test_gain_counts_a_lock_word_stall_once() -> None:
    """The lock word's sampled stalls are samples in the lock functions: fixing the lock and its word together
    gains what the lock-CPU finding alone gains."""
    word = [
        AddressSample(t, 0, LOCK, 0x1234, "pthread_mutex_lock", "lock cmpxchg", "big_lock", 4, 5)
        for t in (1, 2)
    ]
    p = _profile(TWO_THREADS, lines=word)
    findings = find(p)
    mine = next(f for f in findings if f.id.startswith(ID_PREFIX))
    line = next(f for f in findings if f.id.startswith("sampled-line:"))
    assert gain_if_fixed(p, [mine, line]) == pytest.approx(gain_if_fixed(p, [mine]))


def test_lock_samples_survive_the_file_and_a_delta() -> None:
    """The lock samples round-trip through the profile file, and a delta keeps only what is new."""
    p = _profile(TWO_THREADS)
    again = Profile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again.addresses.locks == p.addresses.locks
    later = _profile(
        [*TWO_THREADS[:3], _sample(2, 0x7000, "heap 0x7000", "pthread_mutex_lock", ["other_fn"], 4)]
    )
    d = delta(later, p)
    assert [(s.address, s.count) for s in d.addresses.locks] == [(0x7000, 3)]


# ---- real programs ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def glibc_lock_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler (build-essential)")
    out = tmp_path_factory.mktemp("lock_cpu") / "glibc_lock"
    subprocess.run(["cc", "-O1", "-pthread", "-o", str(out), str(GLIBC_LOCK)], check=True, timeout=60)
    return out


@pytest.mark.bpf
def test_glibc_mutex_cpu_names_the_global_and_its_caller(
    glibc_lock_binary: Path, started: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """Four threads on one global mutex: the lock machinery's samples, user and kernel, act on `lock`,
    taken in `worker`; the finding says so in the report, its JSON and the TUI's findings."""
    proc = start_ready([glibc_lock_binary, "60"], started)
    out = tmp_path / "lock.json"
    r = record(proc.pid, out, "-d", "4", "--hz", "199")
    assert r.returncode == 0, r.stderr
    p = Profile.load(out)
    locks = p.addresses.locks
    n = sum(s.count for s in locks)
    on_lock = [s for s in locks if s.symbol == "lock"]
    assert n > 0 and sum(s.count for s in on_lock) >= 0.9 * n, [
        (s.symbol, s.function, s.count) for s in locks
    ]
    assert p.addresses.lock_unattributed <= 0.25 * n
    assert {s.callers[0] for s in on_lock} == {"worker"}
    assert any(s.kernel for s in on_lock)  # the futex calls under pthread_mutex_lock and the unlock
    assert {s.function for s in on_lock} >= {"pthread_mutex_lock"}
    (f,) = [f for f in p.findings if f.id.startswith(ID_PREFIX)]
    assert f.where == "worker" and f.title.startswith("mutex `lock` taken in worker: ")
    assert f.title in render_text(p)
    assert any(g["id"] == f.id and g["lock"] == "mutex `lock`" for g in to_json(p)["findings"])
    assert cost_line(f).startswith("worker — mutex `lock`: ")


@pytest.mark.bpf
def test_debian_memcached_mutex_cpu_is_a_finding(
    memcached_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """Debian's stripped memcached -t 4 under load: the CPU in pthread_mutex_* is a finding that names
    its mutexes (a data symbol or an address) and a caller outside the lock functions."""
    server = memcached_factory("-t", "4")
    out = tmp_path / "mc.json"
    load = ("--connections=4", "--batch-size=32", "--set-pct=5", "--num-items=10000", "--key-dist=uniform")
    with kvload(server, 20, *load):
        r = record(server.pid, out, "-d", "5", "--hz", "99")
    assert r.returncode == 0, r.stderr
    p = Profile.load(out)
    assert sum(s.count for s in p.addresses.locks) > 0
    found = [f for f in p.findings if f.id.startswith(ID_PREFIX)]
    assert found, [(f.id, f.title) for f in p.findings]
    for f in found:
        assert f.where != UNKNOWN_CALLER and not is_lock_function(f.where), f.title
        assert re.search(r"(heap|stack) 0x[0-9a-f]+|`|\+0x[0-9a-f]+", f.lock), f.lock  # symbol or address
        assert f.title.startswith(f.lock + " taken in " + f.where + ": ")
