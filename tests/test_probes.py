"""The kvs USDT probes of kvcached: present in the binary, and each one fires
with the right arguments when real BPF is attached to a running server.

Every BPF test loads one BCC program, drives a workload whose counts are
known, reads the program's maps (or its perf buffer, in timestamp order) and
detaches. Detaching is checked too: nothing of ours is left in
/sys/kernel/tracing/uprobe_events and every probe semaphore of the server is
back to 0 (BCC 0.26 raises the semaphores when the USDT context is created
and lowers them only when that context is closed, not on BPF.cleanup()).

BCC rewrites bpf_usdt_readarg() per probe from the name of the function it
appears in, so it is only ever called in the attached functions themselves,
never in a shared helper (that compiles to a call to nowhere).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import load
import pytest
from support import REPO, Wire, assert_detached, probe_notes, semaphores, worker_tids

from kvprof.collect import cdefs
from kvprof.collect.requests import opcode_names
from kvprof.system.servers import Server, kvcached_binary

KVS_D = REPO / "kvprof" / "probes" / "kvs.d"
CACHELINE = 64
# docs/design.md's probe table.
DESIGN_PROBES = [
    "conn__open", "conn__close", "cmd__start", "cmd__done", "item__create", "item__delete",
    "lock__wait__start", "lock__wait__done", "lock__hold", "atomic__sample", "stats__collect",
]  # fmt: skip


# ---- the provider file: probe names and the documented tables ------------


def _provider_text() -> str:
    return KVS_D.read_text()


def kvs_probe_names() -> list[str]:
    """Probe names declared in probes/kvs.d (comments stripped)."""
    code = re.sub(r"/\*.*?\*/", "", _provider_text(), flags=re.S)
    return re.findall(r"^\s*probe\s+(\w+)\s*\(", code, flags=re.M)


def _enum(path: Path, enum: str, prefix: str) -> dict[str, int]:
    """An enum of kvcached's sources as {member without prefix, lower case: number}."""
    return {m.removeprefix(prefix).lower(): i for i, m in enumerate(cdefs.enum_members(path, enum))}


# What the probes' arguments mean, from where kvcached defines them (tests/test_contracts.py
# checks probes/kvs.d's copies of these tables against the same definitions).
SERVER = REPO / "server"
OPCODES = {name: n for n, name in opcode_names().items()}
STATUS = _enum(SERVER / "opcodes.h", "op_status", "OPS_")
REASONS = _enum(SERVER / "storage" / "life.h", "delete_reason", "DEL_")
LOCK_NAMES = [e[1] for e in cdefs.x_macro(SERVER / "core" / "lock.h", "KV_LOCK_NAMES")]
SITES = ["collect_timings", "on_create_item", "on_delete_item", "account_memory"]


def test_provider_tables_parse() -> None:
    """The opcode, status, reason and lock tables these tests rely on read from kvcached's sources."""
    assert OPCODES["get"] == 0 and OPCODES["flush_all"] == 14 and len(OPCODES) == 15
    assert {"ok", "miss", "exists", "not_stored", "error"} <= STATUS.keys()
    assert {"delete", "expire", "evict", "replace"} <= REASONS.keys()
    assert "topkeys" in LOCK_NAMES


# ---- the binary's notes --------------------------------------------------


def test_readelf_lists_every_probe_with_a_semaphore() -> None:
    """`readelf -n kvcached` lists every probe of probes/kvs.d under provider kvs, each with a semaphore."""
    names = kvs_probe_names()
    assert sorted(names) == sorted(DESIGN_PROBES), "probes/kvs.d and docs/design.md's probe table disagree"
    notes = probe_notes(kvcached_binary())
    kvs = [n for n in notes if n.provider == "kvs"]
    assert sorted({n.name for n in kvs}) == sorted(names)
    without = [n for n in kvs if n.semaphore == 0]
    assert not without, f"probe sites without an is-enabled semaphore: {without}"
    # One semaphore per probe name, shared by all its sites.
    per_name: dict[str, set[int]] = defaultdict(set)
    for n in kvs:
        per_name[n.name].add(n.semaphore)
    assert all(len(s) == 1 for s in per_name.values()), per_name
    assert len({next(iter(s)) for s in per_name.values()}) == len(names)


def test_probe_arguments_are_readable_by_bcc() -> None:
    """No kvs probe argument is a thread-local (%fs:) operand, which BCC 0.26 cannot read."""
    names = set(kvs_probe_names())
    notes = [n for n in probe_notes(kvcached_binary()) if n.provider == "kvs"]
    for n in notes:
        assert len(n.arguments) == _declared_arity(n.name), f"{n.name}: {n.arguments}"
    bad = [
        (n.name, hex(n.location), a)
        for n in notes
        if n.name in names
        for a in n.arguments
        if "%fs:" in a or "%gs:" in a
    ]
    assert not bad, "thread-local operands in probe arguments (copy them to a local first): " + "; ".join(
        f"{name} at {loc}: {arg}" for name, loc, arg in bad
    )


def _declared_arity(probe: str) -> int:
    code = re.sub(r"/\*.*?\*/", "", _provider_text(), flags=re.S)
    m = re.search(rf"probe\s+{probe}\s*\(([^)]*)\)", code)
    assert m, probe
    return len([a for a in m.group(1).split(",") if a.strip()])


# ---- attaching and detaching ---------------------------------------------


class Attachment:
    """One loaded BPF program: its maps by name, and perf buffers it owns."""

    def __init__(self, bpf: Any) -> None:
        self.bpf = bpf
        self._perf: list[PerfEvents] = []

    def table(self, name: str) -> Any:
        return self.bpf[name.encode()]

    def perf(self, name: str = "events") -> PerfEvents:
        p = PerfEvents(self.bpf, name)
        self._perf.append(p)
        return p

    def close(self) -> None:
        # Drop our perf tables first so that BPF.cleanup() frees them itself: a
        # reference kept past it makes BCC's PerfEventArray.__del__ fail at exit.
        for p in self._perf:
            p.table = None
        self.bpf.cleanup()


@contextlib.contextmanager
def attached(server: Server, text: str, probes: dict[str, str]) -> Iterator[Attachment]:
    """Load one BPF program with `probes` (probe -> C function) enabled on the
    server; always detach, then check nothing was left behind."""
    from bcc import BPF, USDT

    exe = str(Path(f"/proc/{server.pid}/exe").readlink())
    # BCC attaches uprobes by path: to a rebuilt file, not to the image still running.
    assert not exe.endswith(" (deleted)"), f"{exe}: kvcached was rebuilt while its test ran; rerun"
    assert not any(semaphores(server).values()), "a kvs probe is already enabled on this server"
    usdt = USDT(pid=server.pid)
    att = None
    try:
        for probe, fn in probes.items():
            usdt.enable_probe(probe=f"kvs:{probe}", fn_name=fn)
        att = Attachment(BPF(text=text.encode(), usdt_contexts=[usdt]))
        raised = semaphores(server)
        assert all(raised[p] > 0 for p in probes), f"semaphores not raised while attached: {raised}"
        yield att
    finally:
        if att is not None:
            att.close()
        # Closing the USDT context is what lowers the semaphores (BCC 0.26).
        del usdt, att
        gc.collect()
    assert_detached(server)


class PerfEvents:
    """A perf buffer's events, kept in arrival order and sorted by their `ts` on demand."""

    def __init__(self, bpf: Any, name: str) -> None:
        self.bpf = bpf
        self.events: list[Any] = []
        self.lost = 0
        self.table: Any = bpf[name.encode()]

        def on_event(cpu: int, data: Any, size: int) -> None:
            ev = self.table.event(data)
            # Copy out of the ctypes view: the buffer is reused after the callback.
            self.events.append({name: _plain(getattr(ev, name)) for name, _ in ev._fields_})

        def on_lost(n: int) -> None:
            self.lost += n

        self.table.open_perf_buffer(on_event, page_cnt=256, lost_cb=on_lost)

    def poll_until(self, done: Callable[[list[Any]], bool], timeout: float = 5.0) -> list[Any]:
        """Poll until done(events) or timeout; returns events sorted by ts."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.bpf.perf_buffer_poll(timeout=50)
            if done(self.events):
                break
        self.bpf.perf_buffer_poll(timeout=50)  # anything still in flight
        assert self.lost == 0, f"{self.lost} perf events lost"
        return sorted(self.events, key=lambda e: e["ts"])


def _plain(v: Any) -> Any:
    if isinstance(v, bytes):
        return v
    if isinstance(v, ctypes.Array):
        return bytes(v)
    return v


def cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode(errors="replace")


# ---- conn__open / conn__close -------------------------------------------

CONN_BPF = r"""
#include <uapi/linux/ptrace.h>
struct conn_ev { u64 ts; u32 kind; s32 fd; s32 worker; u32 tid; };
BPF_PERF_OUTPUT(events);
static __always_inline int emit(struct pt_regs *ctx, u32 kind, int fd, int worker) {
    struct conn_ev e = {};
    e.ts = bpf_ktime_get_ns();
    e.kind = kind;
    e.fd = fd;
    e.worker = worker;
    e.tid = (u32)bpf_get_current_pid_tgid();
    events.perf_submit(ctx, &e, sizeof(e));
    return 0;
}
int on_open(struct pt_regs *ctx) {
    int fd = 0, worker = 0;
    bpf_usdt_readarg(1, ctx, &fd);
    bpf_usdt_readarg(2, ctx, &worker);
    return emit(ctx, 0, fd, worker);
}
int on_close(struct pt_regs *ctx) {
    int fd = 0, worker = 0;
    bpf_usdt_readarg(1, ctx, &fd);
    bpf_usdt_readarg(2, ctx, &worker);
    return emit(ctx, 1, fd, worker);
}
"""


@pytest.mark.bpf
def test_conn_open_close_fire_once_per_connection(kvcached_factory: Callable[..., Server]) -> None:
    """conn__open/conn__close fire once per connection with fd > 0 and a worker index < -t."""
    threads, nconn = 2, 6
    server = kvcached_factory("-t", str(threads), "--probe-sample", "1")
    with attached(server, CONN_BPF, {"conn__open": "on_open", "conn__close": "on_close"}) as att:
        perf = att.perf()
        for _ in range(nconn):
            w = Wire(server, timeout=10)
            assert w.command("version").startswith(b"VERSION ")
            w.close()
        events = perf.poll_until(lambda ev: sum(e["kind"] == 1 for e in ev) >= nconn)
    opens = [(e["fd"], e["worker"]) for e in events if e["kind"] == 0]
    closes = [(e["fd"], e["worker"]) for e in events if e["kind"] == 1]
    assert len(opens) == nconn and len(closes) == nconn, events
    assert all(fd > 0 and 0 <= w < threads for fd, w in opens + closes), events
    assert Counter(opens) == Counter(closes), "every connection opened was closed on its own worker"
    assert {w for _, w in opens} == set(range(threads)), "connections are spread over every worker"


# ---- cmd__start / cmd__done ----------------------------------------------

CMD_BPF = r"""
#include <uapi/linux/ptrace.h>
struct cmd_ev {
    u64 ts; u64 latency; u64 keyptr;
    u32 kind; s32 worker; s32 opcode; s32 status; s32 keylen;
    char comm[16];
    char key[256];
};
BPF_PERF_OUTPUT(events);
BPF_PERCPU_ARRAY(scratch, struct cmd_ev, 1);
static __always_inline struct cmd_ev *start(u32 kind) {
    int zero = 0;
    struct cmd_ev *e = scratch.lookup(&zero);
    if (!e)
        return 0;
    __builtin_memset(e, 0, sizeof(*e));
    e->ts = bpf_ktime_get_ns();
    e->kind = kind;
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    return e;
}
int on_start(struct pt_regs *ctx) {
    struct cmd_ev *e = start(0);
    if (!e)
        return 0;
    int worker = 0, opcode = 0, keylen = 0;
    u64 key = 0;
    bpf_usdt_readarg(1, ctx, &worker);
    bpf_usdt_readarg(2, ctx, &opcode);
    bpf_usdt_readarg(3, ctx, &key);
    bpf_usdt_readarg(4, ctx, &keylen);
    e->worker = worker; e->opcode = opcode; e->keylen = keylen; e->keyptr = key;
    /* Keys are at most 250 bytes. The mask sits in asm so that clang cannot
     * drop it and the verifier sees the length bounded. */
    u64 n = keylen > 255 ? 255 : keylen;
    asm volatile("%0 &= 0xff" : "+r"(n));
    if (key && n > 0)
        bpf_probe_read_user(e->key, n, (void *)key);
    events.perf_submit(ctx, e, sizeof(*e));
    return 0;
}
int on_done(struct pt_regs *ctx) {
    struct cmd_ev *e = start(1);
    if (!e)
        return 0;
    int worker = 0, opcode = 0, status = 0;
    u64 latency = 0;
    bpf_usdt_readarg(1, ctx, &worker);
    bpf_usdt_readarg(2, ctx, &opcode);
    bpf_usdt_readarg(3, ctx, &status);
    bpf_usdt_readarg(4, ctx, &latency);
    e->worker = worker; e->opcode = opcode; e->status = status; e->latency = latency;
    events.perf_submit(ctx, e, sizeof(*e));
    return 0;
}
"""

# (command line, data block or None, reply prefix, [(opcode, key, status) per request])
CMD_SCRIPT: list[tuple[str, bytes | None, bytes, list[tuple[str, str, str]]]] = [
    ("set pk-alpha 0 0 5", b"hello", b"STORED", [("set", "pk-alpha", "ok")]),
    ("add pk-alpha 0 0 5", b"world", b"NOT_STORED", [("add", "pk-alpha", "not_stored")]),
    (
        "get pk-alpha pk-missing",
        None,
        b"VALUE pk-alpha",
        [("get", "pk-alpha", "ok"), ("get", "pk-missing", "miss")],
    ),
    ("gets pk-alpha", None, b"VALUE pk-alpha", [("gets", "pk-alpha", "ok")]),
    ("replace pk-missing 0 0 1", b"x", b"NOT_STORED", [("replace", "pk-missing", "not_stored")]),
    ("append pk-alpha 0 0 1", b"a", b"STORED", [("append", "pk-alpha", "ok")]),
    ("prepend pk-alpha 0 0 1", b"p", b"STORED", [("prepend", "pk-alpha", "ok")]),
    ("cas pk-alpha 0 0 1 987654321", b"c", b"EXISTS", [("cas", "pk-alpha", "exists")]),
    ("cas pk-missing 0 0 1 1", b"c", b"NOT_FOUND", [("cas", "pk-missing", "miss")]),
    ("touch pk-alpha 100", None, b"TOUCHED", [("touch", "pk-alpha", "ok")]),
    ("gat 100 pk-alpha", None, b"VALUE pk-alpha", [("gat", "pk-alpha", "ok")]),
    ("gats 100 pk-missing", None, b"END", [("gats", "pk-missing", "miss")]),
    ("set pk-num 0 0 2", b"10", b"STORED", [("set", "pk-num", "ok")]),
    ("incr pk-num 5", None, b"15", [("incr", "pk-num", "ok")]),
    ("decr pk-num 3", None, b"12", [("decr", "pk-num", "ok")]),
    ("incr pk-missing 1", None, b"NOT_FOUND", [("incr", "pk-missing", "miss")]),
    ("incr pk-alpha 1", None, b"CLIENT_ERROR", [("incr", "pk-alpha", "error")]),
    ("delete pk-alpha", None, b"DELETED", [("delete", "pk-alpha", "ok")]),
    ("delete pk-alpha", None, b"NOT_FOUND", [("delete", "pk-alpha", "miss")]),
    ("flush_all", None, b"OK", [("flush_all", "", "ok")]),
]


@pytest.mark.bpf
def test_cmd_start_done_report_each_request(kvcached_factory: Callable[..., Server]) -> None:
    """cmd__start/cmd__done fire for every request with its opcode, key, status and a latency > 0."""
    server = kvcached_factory("-t", "2", "--probe-sample", "1")
    expected = [r for *_, reqs in CMD_SCRIPT for r in reqs]
    with attached(server, CMD_BPF, {"cmd__start": "on_start", "cmd__done": "on_done"}) as att:
        perf = att.perf()
        w = Wire(server, timeout=10)
        try:
            for line, data, reply, _ in CMD_SCRIPT:
                got = w.command(line, data)
                assert got.startswith(reply), f"{line!r} -> {got!r}"
        finally:
            w.close()
        events = perf.poll_until(lambda ev: sum(e["kind"] == 1 for e in ev) >= len(expected))
    starts = [e for e in events if e["kind"] == 0]
    dones = [e for e in events if e["kind"] == 1]
    assert [(e["opcode"], e["keylen"], e["key"][: max(e["keylen"], 0)].decode()) for e in starts] == [
        (OPCODES[op], len(key), key) for op, key, _ in expected
    ]
    assert [(e["opcode"], e["status"]) for e in dones] == [
        (OPCODES[op], STATUS[st]) for op, _, st in expected
    ]
    assert starts[-1]["keyptr"] == 0, "flush_all has no key"
    assert all(e["latency"] > 0 for e in dones), [e["latency"] for e in dones]
    # One connection lives on one worker, and the probes say which.
    workers = {e["worker"] for e in events}
    assert len(workers) == 1, workers
    assert {cstr(e["comm"]) for e in events} == {f"kv-worker-{workers.pop()}"}


COUNT_BPF = r"""
#include <uapi/linux/ptrace.h>
BPF_ARRAY(hits, u64, 2);
static __always_inline int count(int i) {
    u64 *v = hits.lookup(&i);
    if (v)
        __sync_fetch_and_add(v, 1);
    return 0;
}
int on_start(struct pt_regs *ctx) { return count(0); }
int on_done(struct pt_regs *ctx) { return count(1); }
"""


WEIGHT_BPF = r"""
#include <uapi/linux/ptrace.h>
BPF_ARRAY(hits, u64, 4);  // cmd__start, cmd__done, the sum of cmd__done's weights, weights < 1
static __always_inline void add(int i, u64 n) {
    u64 *v = hits.lookup(&i);
    if (v)
        __sync_fetch_and_add(v, n);
}
int on_start(struct pt_regs *ctx) { add(0, 1); return 0; }
int on_done(struct pt_regs *ctx) {
    int weight = 0;
    bpf_usdt_readarg(5, ctx, &weight);
    add(1, 1);
    if (weight >= 1)
        add(2, weight);
    else
        add(3, 1);
    return 0;
}
"""


def weighted_requests(server: Server, requests: int) -> tuple[int, int, int, float]:
    """`requests` gets of one connection with cmd__start and cmd__done attached:
    (starts, dones, the sum of the dones' weights, seconds the load took)."""
    ks = load.keys("ps-", 100)
    with attached(server, WEIGHT_BPF, {"cmd__start": "on_start", "cmd__done": "on_done"}) as att:
        t0 = time.monotonic()
        totals = load.run(server.host, server.port, [load.multiget_batches(ks, 100, 8, requests // 800)])
        took = time.monotonic() - t0
        assert totals.complete and totals.get_keys == requests, totals
        hits = att.table("hits")
        starts, dones, weights, bad = (hits[ctypes.c_int(i)].value for i in range(4))
    assert bad == 0, f"{bad} cmd__done without a weight of 1 or more"
    return starts, dones, weights, took


@pytest.mark.bpf
def test_cmd_probes_fire_for_one_request_in_probe_sample(kvcached_factory: Callable[..., Server]) -> None:
    """With --probe-sample 64 and one worker, cmd__start/done fire together for
    1 request in 64 on average (random gaps of 1..127), each done weighing 64
    (the first, which stands for itself, 1)."""
    server = kvcached_factory("-t", "1", "--probe-sample", "64")
    starts, dones, weights, _ = weighted_requests(server, 64000)
    assert starts == dones
    # 1000 expected; the gaps' spread (sd 37 requests) makes that +-19 (1 sd)
    assert 900 <= starts <= 1100, starts
    assert weights == 1 + 64 * (dones - 1)


@pytest.mark.bpf
def test_cmd_probes_paced_by_default(kvcached_factory: Callable[..., Server]) -> None:
    """Without --probe-sample the sampler is paced: it fires about --probe-rate
    times a second whatever the request rate (at most 2.5 R a second, and 8
    firings for each doubling of its 1 in n while it finds the pace), and the
    weights add up to the requests (unbiased). The load is long enough for the
    sampler to reach its pace, so the sum rests on hundreds of firings: a load
    over before the pace is found leaves it to the few firings at the top of
    the ramp, each weighing thousands, whose random gaps moved the sum past
    these bounds on a busy machine."""
    rate, requests = 5000, 640000
    server = kvcached_factory("-t", "1", "--probe-rate", str(rate))
    starts, dones, weights, took = weighted_requests(server, requests)
    assert starts == dones
    assert dones <= 2.5 * rate * took + 8 * 32 + 8, (dones, took)
    assert 0.75 * requests <= weights <= 1.25 * requests, (weights, dones)


SET_SHARE_BPF = r"""
#include <uapi/linux/ptrace.h>
BPF_ARRAY(ops, u64, 64);
int on_done(struct pt_regs *ctx) {
    int op = 0;
    bpf_usdt_readarg(2, ctx, &op);
    u64 *v = ops.lookup(&op);
    if (v)
        __sync_fetch_and_add(v, 1);
    return 0;
}
"""


@pytest.mark.bpf
def test_cmd_sampling_does_not_alias_with_periodic_load(kvcached_factory: Callable[..., Server]) -> None:
    """One set then 31 gets, over and over: a pattern that repeats every 32
    requests, which a fixed 1-in-64 gap would always sample at the same place
    (only sets or only gets). The sampled share of sets is their real share."""
    server = kvcached_factory("-t", "1", "--probe-sample", "64")
    ks = load.keys("alias-", 31)
    batches = [[load.set_(f"alias-set-{i % 7}", "v"), load.get(ks)] for i in range(2000)]
    with attached(server, SET_SHARE_BPF, {"cmd__done": "on_done"}) as att:
        totals = load.run(server.host, server.port, [batches])
        assert totals.complete, totals
        ops = att.table("ops")
        sampled = {i: ops[ctypes.c_int(i)].value for i in range(64) if ops[ctypes.c_int(i)].value}
    by_name = {server_opcode_name(i): n for i, n in sampled.items()}
    total = sum(sampled.values())
    assert 900 <= total <= 1100, by_name  # 64,000 requests, 1 in 64
    # sets are 1 in 32 of the requests: ~31 of ~1000 samples (1 sd ~5.5)
    assert 12 <= by_name.get("set", 0) <= 55, by_name


def server_opcode_name(op: int) -> str:
    """kvcached's opcode numbers (server/opcodes.h), as the probes give them."""
    return opcode_names().get(op, str(op))


# ---- item__create / item__delete -----------------------------------------

ITEM_BPF = r"""
#include <uapi/linux/ptrace.h>
struct item_ev { u64 ts; u64 item; u32 size; s32 reason; u32 kind; };
BPF_PERF_OUTPUT(events);
int on_create(struct pt_regs *ctx) {
    struct item_ev e = {};
    u64 item = 0; u32 size = 0;
    bpf_usdt_readarg(1, ctx, &item);
    bpf_usdt_readarg(2, ctx, &size);
    e.ts = bpf_ktime_get_ns(); e.item = item; e.size = size; e.reason = -1; e.kind = 0;
    events.perf_submit(ctx, &e, sizeof(e));
    return 0;
}
int on_delete(struct pt_regs *ctx) {
    struct item_ev e = {};
    u64 item = 0; u32 size = 0; int reason = 0;
    bpf_usdt_readarg(1, ctx, &item);
    bpf_usdt_readarg(2, ctx, &size);
    bpf_usdt_readarg(3, ctx, &reason);
    e.ts = bpf_ktime_get_ns(); e.item = item; e.size = size; e.reason = reason; e.kind = 1;
    events.perf_submit(ctx, &e, sizeof(e));
    return 0;
}
"""


@pytest.mark.bpf
def test_item_create_delete_with_reasons(kvcached_factory: Callable[..., Server]) -> None:
    """item__create/delete carry address, size and the provoked reason (replace/delete/expire/evict)."""
    server = kvcached_factory("-t", "1", "-m", "4", "--probe-sample", "1")
    small, big = b"v" * 10, b"b" * 20000
    nbig = 300
    with attached(server, ITEM_BPF, {"item__create": "on_create", "item__delete": "on_delete"}) as att:
        perf = att.perf()
        w = Wire(server, timeout=10)
        try:
            stored = 0
            for i in range(5):
                assert w.command(f"set ia-{i} 0 0 {len(small)}", small) == b"STORED\r\n"
            assert w.command(f"set ia-0 0 0 {len(small)}", small) == b"STORED\r\n"  # replace
            assert w.command("delete ia-1") == b"DELETED\r\n"  # delete
            assert w.command(f"set ia-exp 0 1 {len(small)}", small) == b"STORED\r\n"
            stored += 7
            time.sleep(2.2)
            assert w.command("get ia-exp") == b"END\r\n"  # expire, found on access
            before = int(server.stats()["evictions"])
            for i in range(nbig):
                assert w.command(f"set ib-{i} 0 0 {len(big)}", big) == b"STORED\r\n"
            stored += nbig
            evictions = int(server.stats()["evictions"]) - before
        finally:
            w.close()
        expected_deletes = 3 + evictions
        events = perf.poll_until(
            lambda ev: (
                sum(e["kind"] == 0 for e in ev) >= stored
                and sum(e["kind"] == 1 for e in ev) >= expected_deletes
            )
        )
    creates = [e for e in events if e["kind"] == 0]
    deletes = [e for e in events if e["kind"] == 1]
    assert evictions > 0, "the big sets were meant to overflow -m 4"
    assert len(creates) == stored
    reasons = Counter(e["reason"] for e in deletes)
    assert reasons == Counter(
        {REASONS["replace"]: 1, REASONS["delete"]: 1, REASONS["expire"]: 1, REASONS["evict"]: evictions}
    ), reasons
    assert all(e["item"] != 0 for e in events)
    assert all(e["size"] >= len(small) + 4 for e in creates[:7]), creates[:7]
    assert all(e["size"] >= len(big) + 4 for e in creates[7:]), creates[7:]
    # Replayed in time order, every delete removes a live item with the size it was created with.
    live: dict[int, int] = {}
    for e in events:
        if e["kind"] == 0:
            assert e["item"] not in live, f"item {e['item']:#x} created twice without a delete"
            live[e["item"]] = e["size"]
        else:
            assert live.pop(e["item"], None) == e["size"], f"delete of an unknown item: {e}"


# ---- lock__wait__start / lock__wait__done --------------------------------

LOCK_BPF = r"""
#include <uapi/linux/ptrace.h>
struct lkey { char name[16]; };
struct lval { u64 starts; u64 dones; u64 wait_ns; u64 min_ns; u64 lock; u64 other_locks;
              u64 weight; u64 unlocked; };
BPF_HASH(waits, struct lkey, struct lval, 64);
static __always_inline struct lval *slot(u64 name) {
    struct lkey k = {};
    bpf_probe_read_user_str(k.name, sizeof(k.name), (void *)name);
    struct lval zero = {};
    zero.min_ns = ~0ULL;
    return waits.lookup_or_try_init(&k, &zero);
}
int on_start(struct pt_regs *ctx) {
    u64 lock = 0, name = 0;
    bpf_usdt_readarg(1, ctx, &lock);
    bpf_usdt_readarg(2, ctx, &name);
    struct lval *v = slot(name);
    if (!v)
        return 0;
    __sync_fetch_and_add(&v->starts, 1);
    if (v->lock == 0)
        v->lock = lock;
    else if (v->lock != lock)
        v->other_locks = 1;
    return 0;
}
int on_done(struct pt_regs *ctx) {
    u64 lock = 0, name = 0, ns = 0;
    int weight = 0;
    bpf_usdt_readarg(1, ctx, &lock);
    bpf_usdt_readarg(2, ctx, &name);
    bpf_usdt_readarg(3, ctx, &ns);
    bpf_usdt_readarg(4, ctx, &weight);
    struct lval *v = slot(name);
    if (!v)
        return 0;
    // the mutex's word (glibc: 0 = free) read where the probe fires
    int word = -1;
    bpf_probe_read_user(&word, sizeof(word), (void *)lock);
    if (word == 0)
        __sync_fetch_and_add(&v->unlocked, 1);
    __sync_fetch_and_add(&v->weight, weight);
    __sync_fetch_and_add(&v->dones, 1);
    __sync_fetch_and_add(&v->wait_ns, ns);
    if (ns < v->min_ns)
        v->min_ns = ns;
    return 0;
}
"""


def lock_stats(server: Server) -> dict[str, tuple[int, int]]:
    """`stats locks` as name -> (contended, wait_ns)."""
    s = server.stats("locks")
    names = {k.split(":", 1)[0] for k in s}
    return {n: (int(s[f"{n}:contended"]), int(s[f"{n}:wait_ns"])) for n in names}


def contended_waits(
    server: Server, prefix: str
) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]], dict[str, Any]]:
    """Two clients contending for 3 s with LOCK_BPF attached: `stats locks` before and
    after, and what the probes counted by lock name."""
    ks = load.keys(prefix, 200)
    assert load.run(server.host, server.port, [load.set_batches(ks, "x" * 32, 50)]).stored == len(ks)
    with attached(server, LOCK_BPF, {"lock__wait__start": "on_start", "lock__wait__done": "on_done"}) as att:
        before = lock_stats(server)
        totals = load.run_processes(server.host, server.port, 2, prefix, 200, 100, 8, duration=3.0)
        assert totals.failures == [] and totals.hits == totals.get_keys, totals
        after = lock_stats(server)
        table = {cstr(k.name): v for k, v in att.table("waits").items()}
    return before, after, table


@pytest.mark.bpf
def test_lock_waits_fire_under_contention(kvcached_factory: Callable[..., Server]) -> None:
    """With --lock-sample 1, contended locks fire paired lock__wait__* with stable names,
    wait_ns > 0, weight 1, `stats locks` counts; lock__wait__done fires once the lock is
    released (some events see its word free, which is never so while the thread holds it)."""
    server = kvcached_factory("--preset", "baseline", "-t", "2", "--lock-sample", "1")
    before, after, table = contended_waits(server, "lk-")
    assert "topkeys" in table, f"no contended topkeys wait seen; saw {sorted(table)}"
    assert set(table) <= set(LOCK_NAMES), table.keys()
    for name, v in table.items():
        assert v.starts == v.dones, f"{name}: {v.starts} starts vs {v.dones} dones"
        assert v.min_ns > 0, f"{name}: a wait of 0 ns"
        assert v.lock != 0
        delta = after[name][0] - before[name][0]
        assert v.dones == delta, f"{name}: probes saw {v.dones} waits, `stats locks` counted {delta}"
        assert v.weight == v.dones, f"{name}: weights {v.weight} for {v.dones} waits sampled 1 in 1"
    assert table["topkeys"].other_locks == 0, "the shared topkeys mutex is one lock"
    assert table["topkeys"].unlocked > 0, "lock__wait__done fired only while the lock was held"
    for name in set(after) - set(table):
        assert after[name][0] == before[name][0], f"{name} contended without a probe firing"


@pytest.mark.bpf
def test_lock_wait_done_is_sampled(kvcached_factory: Callable[..., Server]) -> None:
    """By default lock__wait__done fires for the long contended waits (weight 1) and a sample of
    the short ones (weight N, --lock-sample N; 16 here, so that 3 s of two clients draw some
    whatever the machine's load): fewer events than `stats locks` counts, lock__wait__start for all."""
    server = kvcached_factory("--preset", "baseline", "-t", "2", "--lock-sample", "16")
    assert server.stats("settings")["lock_sample"] == "16"
    before, after, table = contended_waits(server, "ls-")
    v = table["topkeys"]
    delta = after["topkeys"][0] - before["topkeys"][0]
    assert v.starts == delta, (v.starts, delta)
    assert 0 < v.dones < delta, (v.dones, delta)
    # every event weighs 1 or 16, and some weigh 16
    assert v.weight > v.dones and (v.weight - v.dones) % 15 == 0, (v.dones, v.weight)


# ---- lock__hold ---------------------------------------------------------------

HOLD_BPF = r"""
#include <uapi/linux/ptrace.h>
struct hkey { char name[16]; u64 lock; };
struct hval { u64 fired; u64 weight; u64 hold_ns; u64 min_ns; u64 unlocked; };
BPF_HASH(holds, struct hkey, struct hval, 4096);
int on_hold(struct pt_regs *ctx) {
    struct hkey k = {};
    u64 name = 0, ns = 0;
    int weight = 0;
    bpf_usdt_readarg(1, ctx, &k.lock);
    bpf_usdt_readarg(2, ctx, &name);
    bpf_usdt_readarg(3, ctx, &ns);
    bpf_usdt_readarg(4, ctx, &weight);
    bpf_probe_read_user_str(k.name, sizeof(k.name), (void *)name);
    struct hval zero = {};
    zero.min_ns = ~0ULL;
    struct hval *v = holds.lookup_or_try_init(&k, &zero);
    if (!v)
        return 0;
    int word = -1;
    bpf_probe_read_user(&word, sizeof(word), (void *)k.lock);
    if (word == 0)
        __sync_fetch_and_add(&v->unlocked, 1);
    __sync_fetch_and_add(&v->fired, 1);
    __sync_fetch_and_add(&v->weight, weight);
    __sync_fetch_and_add(&v->hold_ns, ns);
    if (ns < v->min_ns)
        v->min_ns = ns;
    return 0;
}
"""
HOLD_NS = 20_000  # --topkeys-hold-ns: every topkeys hold is at least this long


@pytest.mark.bpf
def test_lock_hold_fires_for_every_acquisition(kvcached_factory: Callable[..., Server]) -> None:
    """With --probe-sample 1, lock__hold fires once per acquisition of each named lock, contended
    or not (one worker: never contended), after the release, weight 1; the shared topkeys mutex
    is one lock, and every hold of it lasts at least --topkeys-hold-ns."""
    server = kvcached_factory("-t", "1", "--probe-sample", "1", "--topkeys-hold-ns", str(HOLD_NS))
    assert server.stats("settings")["topkeys_hold_ns"] == str(HOLD_NS)
    ks = load.keys("hd-", 50)
    assert load.run(server.host, server.port, [load.set_batches(ks, "h" * 16, 25)]).stored == len(ks)
    before = int(server.stats("topkeys")["topkeys_total"])  # `stats topkeys` takes the lock too: not inside
    with attached(server, HOLD_BPF, {"lock__hold": "on_hold"}) as att:
        totals = load.run(server.host, server.port, [load.multiget_batches(ks, 10, 5, 20)])
        assert totals.complete and totals.hits == totals.get_keys, totals
        table = {(cstr(k.name), k.lock): v for k, v in att.table("holds").items()}
    topkeys = {lock: v for (name, lock), v in table.items() if name == "topkeys"}
    assert len(topkeys) == 1, f"the shared topkeys mutex is one lock: {topkeys.keys()}"
    v = next(iter(topkeys.values()))
    counted = int(server.stats("topkeys")["topkeys_total"]) - before
    assert v.fired == counted == totals.get_keys, (v.fired, counted, totals.get_keys)
    assert v.weight == v.fired, "sampled 1 in 1: every firing weighs 1"
    assert v.min_ns >= HOLD_NS, f"a topkeys hold of {v.min_ns} ns, under --topkeys-hold-ns {HOLD_NS}"
    assert v.unlocked == v.fired, "lock__hold fired while the lock was held"
    assert {name for name, _ in table} <= set(LOCK_NAMES)


# ---- atomic__sample ---------------------------------------------------------

ATOMIC_BPF = r"""
#include <uapi/linux/ptrace.h>
struct akey { char site[32]; u64 counter; u32 tid; };
struct aval { u64 samples; u64 cycles; u64 min_cycles; };
BPF_HASH(samples, struct akey, struct aval, 16384);
int on_sample(struct pt_regs *ctx) {
    struct akey k = {};
    u64 site = 0, cycles = 0;
    bpf_usdt_readarg(1, ctx, &k.counter);
    bpf_usdt_readarg(2, ctx, &site);
    bpf_usdt_readarg(3, ctx, &cycles);
    bpf_probe_read_user_str(k.site, sizeof(k.site), (void *)site);
    k.tid = (u32)bpf_get_current_pid_tgid();
    struct aval zero = {};
    zero.min_cycles = ~0ULL;
    struct aval *v = samples.lookup_or_try_init(&k, &zero);
    if (!v)
        return 0;
    __sync_fetch_and_add(&v->samples, 1);
    __sync_fetch_and_add(&v->cycles, cycles);
    if (cycles < v->min_cycles)
        v->min_cycles = cycles;
    return 0;
}
"""


@pytest.mark.bpf
@pytest.mark.parametrize("preset", ["baseline", "fixed"])
def test_atomic_sample_sites_and_addresses(kvcached_factory: Callable[..., Server], preset: str) -> None:
    """atomic__sample names each site; shared counters are one word, per-thread ones lines apart."""
    server = kvcached_factory("--preset", preset, "-t", "2", "--probe-sample", "1")
    with attached(server, ATOMIC_BPF, {"atomic__sample": "on_sample"}) as att:
        plans = []
        for c in range(2):
            ks = load.keys(f"at{c}-", 40)
            plans.append(load.set_batches(ks, "y" * 64, 20) + load.multiget_batches(ks, 20, 4, 25))
        totals = load.run(server.host, server.port, plans)
        assert totals.complete and totals.hits == totals.get_keys, totals
        rows = [
            (cstr(k.site), k.counter, k.tid, v.samples, v.min_cycles) for k, v in att.table("samples").items()
        ]
    tids = worker_tids(server)
    assert set(tids.values()) == {0, 1}
    by_site: dict[str, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
    for site, counter, tid, n, min_cycles in rows:
        assert site in SITES, site
        assert counter != 0 and n > 0
        assert min_cycles > 0, f"{site}: an update of 0 cycles"
        if tid in tids:
            by_site[site][tids[tid]].add(counter)
    assert set(by_site) == set(SITES), f"sites seen: {sorted(by_site)}"
    for site, per_worker in by_site.items():
        assert set(per_worker) == {0, 1}, f"{site}: samples from workers {sorted(per_worker)} only"
        w0, w1 = per_worker[0], per_worker[1]
        if preset == "baseline":
            if site == "collect_timings":
                # One shared histogram: the word is per (opcode, bucket), the same for every worker.
                assert w0 & w1, f"{site}: the workers updated no common word"
            else:
                assert len(w0 | w1) == 1, f"{site}: shared counter at {sorted(map(hex, w0 | w1))}"
        else:
            lines0, lines1 = {a // CACHELINE for a in w0}, {a // CACHELINE for a in w1}
            assert not lines0 & lines1, f"{site}: workers share a cache line"
            if site != "collect_timings":
                assert len(w0) == 1 and len(w1) == 1, f"{site}: {w0} {w1}"
                assert abs(next(iter(w0)) - next(iter(w1))) >= CACHELINE
    if preset == "baseline":
        assert by_site["on_create_item"][0] == by_site["on_delete_item"][0], "one item-object counter"


# ---- stats__collect -----------------------------------------------------------

STATS_BPF = r"""
#include <uapi/linux/ptrace.h>
struct stats_ev { u64 ts; u64 ns; char what[32]; };
BPF_PERF_OUTPUT(events);
int on_collect(struct pt_regs *ctx) {
    struct stats_ev e = {};
    u64 what = 0;
    bpf_usdt_readarg(1, ctx, &what);
    bpf_usdt_readarg(2, ctx, &e.ns);
    bpf_probe_read_user_str(e.what, sizeof(e.what), (void *)what);
    e.ts = bpf_ktime_get_ns();
    events.perf_submit(ctx, &e, sizeof(e));
    return 0;
}
"""


@pytest.mark.bpf
@pytest.mark.parametrize("preset", ["baseline", "fixed"])
def test_stats_collect_names_the_group(kvcached_factory: Callable[..., Server], preset: str) -> None:
    """stats__collect fires once for `stats timings` and once for `stats topkeys`, naming the group."""
    server = kvcached_factory("--preset", preset, "-t", "2")
    with attached(server, STATS_BPF, {"stats__collect": "on_collect"}) as att:
        perf = att.perf()
        w = Wire(server, timeout=10)
        try:
            assert w.command("set sc-key 0 0 1", b"1") == b"STORED\r\n"
            assert w.command("stats timings").endswith(b"END\r\n")
            assert w.command("stats topkeys").endswith(b"END\r\n")
        finally:
            w.close()
        events = perf.poll_until(lambda ev: len(ev) >= 2, timeout=2.0)
    assert [cstr(e["what"]) for e in events] == ["timings", "topkeys"]
