"""The contracts between kvcached's C and kvprof's Python, read from the C side
where it defines them once, so that a change on one side alone fails here:

- the opcodes (server/opcodes.h `KV_OPCODES`), which kvprof reads at run time;
- the cmd__done statuses, item__delete reasons, lock names and atomic__sample
  site names, as probes/kvs.d documents them and as kvprof's catalog and
  bench name them;
- the order of every BPF program's counter enum, which each collector mirrors
  as a tuple (and of probes/unwind.h's two enums, mirrored in unwind.py);
- the probe list of probes/kvs.d: each probe fired by kvcached, each probe a
  collector attaches to declared there;
- the collectors' registry (kvprof/collect/__init__.py `COLLECTORS`).
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from support import REPO

from kvprof.collect import COLLECTORS, cdefs, collector_class
from kvprof.collect.requests import OPCODES_H, opcode_names

SERVER = REPO / "server"
PROBES = REPO / "kvprof" / "probes"
KVS_D = PROBES / "kvs.d"


def doc_table(start: str, end: str) -> str:
    """The text of probes/kvs.d's header comment from `start` to `end`, on one line."""
    header = KVS_D.read_text().split("*/", 1)[0]
    text = " ".join(line.strip().lstrip("*").strip() for line in header.splitlines())
    return text.split(start, 1)[1].split(end, 1)[0]


def doc_numbered(start: str, end: str) -> list[str]:
    """`0 ok (hit, ...), 1 miss / not found, 3 not stored` -> ["ok", "miss", "not stored"], checking
    that the numbers count from 0."""
    entries = re.findall(r"(?<![\w(])(\d+) ([a-z_]+(?: [a-z_]+)*)", doc_table(start, end))
    assert [int(n) for n, _ in entries] == list(range(len(entries))), entries
    return [name for _, name in entries]


def doc_names(start: str, end: str) -> list[str]:
    return [n.strip() for n in doc_table(start, end).split(",") if n.strip()]


def members(path: Path, enum: str, prefix: str) -> list[str]:
    """An enum's members without their prefix, lower case: OPS_NOT_STORED -> "not_stored"."""
    names = cdefs.enum_members(path, enum)
    assert all(n.startswith(prefix) for n in names), names
    return [n.removeprefix(prefix).lower() for n in names]


def sample_sites() -> list[str]:
    """The atomic__sample site names of server/stats/sites.c, in the order of `enum sample_site`."""
    path = SERVER / "stats" / "sites.c"
    order = cdefs.enum_members(path, "sample_site")[:-1]  # the last is the count
    named = dict(re.findall(r'SAMPLED_UPDATE\(\s*(SAMPLE_\w+),\s*"(\w+)"', path.read_text()))
    assert set(named) == set(order), (named, order)
    return [named[s] for s in order]


# ---- the opcodes -----------------------------------------------------------------


def compiled_opcodes(tmp_path: Path) -> list[str]:
    """opcode_name(0 .. OPS_MAX-1) as kvcached's own compiler sees server/opcodes.h."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "ops.c"
    src.write_text(
        '#include <stdio.h>\n#include "opcodes.h"\n'
        "int main(void) { for (int i = 0; i < OPS_MAX; i++) puts(opcode_name((enum opcode)i)); }\n"
    )
    exe = tmp_path / "ops"
    subprocess.run([cc, "-std=c11", f"-I{SERVER}", "-o", str(exe), str(src)], check=True, timeout=60)
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=10).stdout.split()


def test_opcode_names_are_the_headers(tmp_path: Path) -> None:
    """requests.opcode_names() is KV_OPCODES of server/opcodes.h (a link to the package's
    kvprof/probes/opcodes.h), number for number, as C compiles it."""
    assert OPCODES_H.samefile(SERVER / "opcodes.h")
    names = opcode_names()
    assert list(names) == list(range(len(names)))
    assert list(names.values()) == compiled_opcodes(tmp_path)


def test_opcode_names_follow_an_edit_of_the_header(tmp_path: Path) -> None:
    """An opcode appended to the header is a name kvprof knows at once: nothing else to edit."""
    header = tmp_path / "opcodes.h"
    text = OPCODES_H.read_text()
    header.write_text(text.replace('X(FLUSH_ALL, "flush_all")', 'X(FLUSH_ALL, "flush_all") X(MN, "mn")'))
    names = opcode_names(header)
    assert names[len(names) - 1] == "mn" and len(names) == len(opcode_names()) + 1


def test_the_provider_documents_the_opcodes() -> None:
    """probes/kvs.d's opcode table (its comment, for a reader of the probes) is KV_OPCODES."""
    assert doc_numbered("Opcodes", "Statuses") == list(opcode_names().values())


def test_the_parser_knows_every_opcode_first() -> None:
    """KV_COMMANDS starts with KV_OPCODES, so CMD_x == OP_x for every request."""
    parse_h = SERVER / "protocol" / "parse.h"
    assert re.search(r"#define KV_COMMANDS\(X\)\s*\\\s*KV_OPCODES\(X\)", parse_h.read_text())
    commands = [e[1] for e in cdefs.x_macro(parse_h, "KV_COMMANDS")]
    assert commands == ["version", "verbosity", "quit", "stats", "site"]


# ---- the other tables of kvs.d -----------------------------------------------------


def test_statuses() -> None:
    """cmd__done's statuses: enum op_status, in the order probes/kvs.d numbers them."""
    c = members(OPCODES_H, "op_status", "OPS_")
    assert [s.replace("_", " ") for s in c] == doc_numbered("Statuses", "Item delete reasons")


def test_item_delete_reasons() -> None:
    """item__delete's reasons: enum delete_reason of server/storage/life.h, as kvs.d numbers them."""
    c = members(SERVER / "storage" / "life.h", "delete_reason", "DEL_")
    assert c == doc_numbered("Item delete reasons", "Lock names")


def test_lock_names() -> None:
    """KV_LOCK_NAMES (server/core/lock.h) is kvs.d's list; the catalog and the demo name real locks."""
    names = [e[1] for e in cdefs.x_macro(SERVER / "core" / "lock.h", "KV_LOCK_NAMES")]
    assert names == doc_names("Lock names (lock__wait__* `name`; server/core/lock.h):", "Site names")
    from kvprof.system.demo import LOCK

    assert LOCK in names
    catalog = tomllib.loads((REPO / "kvprof" / "analysis" / "hotspots.toml").read_text())
    kvcached = {lock for h in catalog["hotspot"] for lock in h.get("locks", ()) if lock in names}
    assert {"topkeys", "item_lock", "lru", "slabs"} <= kvcached


def test_site_names() -> None:
    """atomic__sample's sites (server/stats/sites.c) are kvs.d's list and the catalog's sites."""
    sites = sample_sites()
    assert sites == doc_names("Site names (atomic__sample `site`; server/stats/sites.c):", "\x00")
    catalog = tomllib.loads((REPO / "kvprof" / "analysis" / "hotspots.toml").read_text())
    assert sorted(s for h in catalog["hotspot"] for s in h.get("sites", ())) == sorted(sites)


def test_site_flags() -> None:
    """kvprof bench's sites (bench/variants.SITES) are kvcached's per-site flags (KV_SITES)."""
    from kvprof.bench.variants import SITES

    flags = [e[2] for e in cdefs.x_macro(SERVER / "stats" / "sites.h", "KV_SITES")]
    assert sorted(f"--{s}" for s in SITES) == sorted(flags)


# ---- the BPF programs' enums ------------------------------------------------------


def _mirrors() -> list[tuple[str, tuple[str, ...], Path, str, str]]:
    """(where, Python tuple, C file, enum, member prefix) for each counter enum a collector mirrors."""
    from kvprof.collect import cachelines, locks, offcpu, oncpu, regsample, requests

    return [
        ("oncpu.HEALTH", oncpu.HEALTH, PROBES / "oncpu.bpf.c", "oncpu_health", "ONCPU_"),
        ("offcpu.HEALTH", offcpu.HEALTH, PROBES / "offcpu.bpf.c", "offcpu_health", "OFFCPU_"),
        ("locks.COUNTERS", locks.COUNTERS, PROBES / "locks.bpf.c", "locks_counter", "LOCKS_"),
        (
            "cachelines.COUNTERS",
            cachelines.COUNTERS,
            PROBES / "cachelines.bpf.c",
            "cachelines_counter",
            "CACHELINES_",
        ),
        ("requests.COUNTERS", requests.COUNTERS, PROBES / "requests.bpf.c", "requests_counter", "REQUESTS_"),
        ("regsample.HEALTH", regsample.HEALTH, PROBES / "regsample.bpf.c", "regsample_health", "REGSAMPLE_"),
    ]


def counter_names(path: Path, enum: str, prefix: str) -> list[str]:
    """A counter enum's members as the Python side names them (ONCPU_USER_STACK_ERR ->
    "user_stack_errors"), without the last member: the count the array is sized by."""
    names = members(path, enum, prefix)
    assert names[-1] in ("health", "counters"), f"enum {enum} does not end with its count"
    return [re.sub(r"_err$", "_errors", n) for n in names[:-1]]


def test_every_counter_tuple_is_its_enum() -> None:
    """Each collector's counter tuple names the members of its program's enum, in order."""
    mirrors = _mirrors()
    assert len(mirrors) == 6
    for where, mirror, path, enum, prefix in mirrors:
        assert list(mirror) == counter_names(path, enum, prefix), f"{where} and enum {enum} of {path.name}"


# probes/unwind.h's stop reasons, by member: what kvprof/collect/unwind.py calls them.
UNWIND_REASONS = {
    "UR_ROOT": "root",
    "UR_NO_INFO": "no unwind info",
    "UR_NO_MAPPING": "outside known code",
    "UR_READ": "stack not readable",
    "UR_DEPTH": "depth limit",
    "UR_NO_TABLE": "table full",
}


def test_the_unwinder_enums() -> None:
    """unwind.py's ROW_KINDS and STOP_REASONS are probes/unwind.h's enum unw_kind and unw_reason."""
    from kvprof.collect.unwind import MARKERS, ROW_KINDS, STOP_REASONS

    assert list(ROW_KINDS) == members(PROBES / "unwind.h", "unw_kind", "UK_")
    reasons = cdefs.enum_members(PROBES / "unwind.h", "unw_reason")
    assert list(STOP_REASONS) == [UNWIND_REASONS[r] for r in reasons]
    assert set(MARKERS) == set(STOP_REASONS) - {"root"}


def test_a_one_sided_edit_fails(tmp_path: Path) -> None:
    """The check itself: a counter added to a program's enum alone no longer matches its tuple."""
    _, mirror, path, enum, prefix = _mirrors()[2]
    edited = tmp_path / path.name
    edited.write_text(path.read_text().replace("LOCKS_STACK_ERRORS,", "LOCKS_STACK_ERRORS, LOCKS_NEW,"))
    assert list(mirror) == counter_names(path, enum, prefix)
    assert list(mirror) != counter_names(edited, enum, prefix)


# ---- the probes ---------------------------------------------------------------------


def kvs_probes() -> list[str]:
    code = re.sub(r"/\*.*?\*/", "", KVS_D.read_text(), flags=re.S)
    return re.findall(r"^\s*probe\s+(\w+)\s*\(", code, flags=re.M)


def test_kvcached_fires_every_probe() -> None:
    """Every probe of probes/kvs.d is fired somewhere in server/ (KVS_<NAME>(...)), and no other is."""
    fired: set[str] = set()
    for path in SERVER.rglob("*.[ch]"):
        if not {"build", "build-asan", "build-fuzz"} & set(path.relative_to(SERVER).parts):
            fired |= set(re.findall(r"\bKVS_([A-Z_]+?)(?:_ENABLED)?\(", path.read_text()))
    assert fired == {p.upper().replace("__", "_") for p in kvs_probes()}  # as `dtrace -h` names them


def test_collectors_attach_to_declared_probes() -> None:
    """Each kvs collector's probes, and the ones the analysis scales, are probes of kvs.d."""
    from kvprof.analysis import tables
    from kvprof.collect.cachelines import CachelinesCollector
    from kvprof.collect.locks import LocksCollector
    from kvprof.collect.requests import RequestsCollector

    declared = set(kvs_probes())
    for cls in (CachelinesCollector, LocksCollector, RequestsCollector):
        assert set(cls.probes) <= declared, cls
    assert {tables.LOCK_PROBE, tables.LINE_PROBE, tables.REQUEST_PROBE} <= declared


# ---- the collectors' registry ------------------------------------------------------


def collector_classes_in_sources() -> dict[str, str]:
    """module -> the class of kvprof/collect/<module>.py that sets a non-empty `name` and ends in
    Collector (what the registry must list), read from the source."""
    found = {}
    for path in sorted((REPO / "kvprof" / "collect").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Collector"):
                for stmt in node.body:
                    if (
                        isinstance(stmt, ast.Assign)
                        and any(isinstance(t, ast.Name) and t.id == "name" for t in stmt.targets)
                        and isinstance(stmt.value, ast.Constant)
                        and stmt.value.value
                    ):
                        found[path.stem] = node.name
    return found


def test_the_registry_lists_every_collector() -> None:
    """COLLECTORS names every collector class there is, each under its module, and nothing else."""
    assert collector_classes_in_sources() == COLLECTORS


def test_the_registry_gives_each_collectors_class() -> None:
    """collector_class(module) is the registered class; every session collector name has a module,
    and a module that takes another's name (the on-CPU and off-CPU backends) says whose."""
    from kvprof.collect.session import ALL_COLLECTORS

    assert set(ALL_COLLECTORS) <= set(COLLECTORS)
    for module, cls_name in COLLECTORS.items():
        cls = collector_class(module)
        assert cls.__name__ == cls_name
        taken = {"pyspy": "oncpu", "perf": "oncpu", "offsample": "offcpu"}  # session.modules picks these
        assert cls.name == taken.get(module, module)
