"""The layering rules of docs/design.md, checked on the source and on what
importing each room loads: bcc is imported only in kvprof/collect/, textual
only in kvprof/tui/; the import graph of kvprof/ has no cycle (imports
inside functions included); each room loads no module of a later stage; no
module imports another's `_private` names; kvprof/'s top level holds no module
but the command line's; no function in kvprof/ is over 80 lines;
no test module imports another (they share tests/support.py)."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KVPROF = REPO / "kvprof"
TESTS = REPO / "tests"


def imported_roots(path: Path) -> set[str]:
    """Top-level module names a file imports (anywhere in it, lazily or not)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize(("module", "home"), [("bcc", "collect"), ("textual", "tui")])
def test_module_is_imported_only_in_its_package(module: str, home: str) -> None:
    outside = [
        str(p.relative_to(KVPROF.parent))
        for p in sorted(KVPROF.rglob("*.py"))
        if not p.relative_to(KVPROF).as_posix().startswith(home + "/") and module in imported_roots(p)
    ]
    assert not outside, f"{module} imported outside kvprof/{home}/: {outside}"


# ---- the import graph ------------------------------------------------------------------


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(KVPROF.rglob("*.py"))}


def imports_of(name: str) -> Iterator[tuple[ast.ImportFrom | ast.Import, str, str | None]]:
    """(node, the kvprof module it imports, the name taken from it or None) for
    every import in module `name`, at any depth. `from kvprof.x import y` is
    module kvprof.x.y when that is a module, else name y of kvprof.x."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    yield node, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{up}.{base}" if base else up
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    yield node, f"{base}.{alias.name}", None
                elif base in MODULES:
                    yield node, base, alias.name


def import_graph() -> dict[str, set[str]]:
    return {name: {target for _, target, _ in imports_of(name)} - {name} for name in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node, each sorted: the one
    Tarjan walk of the tree, scripts/check-includes.py's (it checks the server's C)."""
    spec = importlib.util.spec_from_file_location("check_includes", REPO / "scripts" / "check-includes.py")
    assert spec is not None and spec.loader is not None
    check_includes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_includes)
    found: list[list[str]] = check_includes.cycles(graph)
    return found


def test_cycles_finds_a_cycle() -> None:
    """The check itself: a -> b -> c -> a is one cycle; d, reached from it, is in none."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_graph_sees_imports_inside_functions() -> None:
    """export/__init__ imports export.pprof only inside write(): the graph has the edge."""
    assert "kvprof.export.pprof" in import_graph()["kvprof.export"]


def test_no_import_cycle() -> None:
    graph = import_graph()
    found = cycles(graph)
    described = [{m: sorted(graph[m] & set(c)) for m in c} for c in found]
    assert not found, f"import cycles in kvprof/ (module -> its imports in the cycle): {described}"


def test_no_private_name_is_imported_from_another_module() -> None:
    """`from kvprof.x import _name`, or `x._name` on an imported kvprof module."""
    found = []
    for name, path in MODULES.items():
        aliases = {}  # local name -> kvprof module, for `import kvprof.x as m` / `from kvprof import x`
        for node, target, taken in imports_of(name):
            for alias in node.names:
                if taken is None and target.endswith(alias.name.split(".")[-1]):
                    aliases[alias.asname or alias.name] = target
                if taken == alias.name and taken.startswith("_") and not taken.startswith("__"):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} imports {target}.{taken}")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.append(
                    f"{path.relative_to(REPO)}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}"
                )
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_no_loose_module_at_the_top_level() -> None:
    """Besides cli.py and __main__.py (and the package's __init__.py), kvprof/'s
    modules live in rooms (sub-packages): a command's body in kvprof/commands/
    or the room it names."""
    loose = sorted(
        p.name for p in KVPROF.glob("*.py") if p.name not in ("cli.py", "__main__.py", "__init__.py")
    )
    assert not loose, f"loose modules at kvprof/'s top level: {loose}"


LONGEST_FUNCTION = 80  # lines from `def` to the last line, decorators excluded


def test_no_function_is_over_80_lines() -> None:
    """Every function and method of kvprof/, nested ones too, fits in LONGEST_FUNCTION lines."""
    long = sorted(
        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} lines)"
        for path in KVPROF.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (length := (node.end_lineno or node.lineno) - node.lineno + 1) > LONGEST_FUNCTION
    )
    assert not long, f"functions over {LONGEST_FUNCTION} lines:\n" + "\n".join(long)


def test_the_package_root_imports_nothing_of_kvprof() -> None:
    """kvprof/__init__.py (the version) is loaded by every room."""
    assert not import_graph()["kvprof"]


# ---- the rooms, in the order data flows -------------------------------------------------

# probes -> collectors -> session -> model -> analysis -> views and exports; model is
# the plain-dataclass room every stage may load; system (doctor, the server launcher)
# reads ELF and server stats through collect; bench and the commands are clients.
SESSION = "kvprof.collect.session"
VIEWS = ("kvprof.views", "kvprof.tui")  # what a person reads: report, the exporter's metrics; top
CLIENTS = ("kvprof.commands", "kvprof.cli", "kvprof.bench")
LATER = {
    "kvprof.model": ("kvprof.collect", "kvprof.analysis", *VIEWS, "kvprof.export", "kvprof.system",
                     *CLIENTS),
    "kvprof.collect": (SESSION, "kvprof.analysis", *VIEWS, "kvprof.export", "kvprof.system",
                       *CLIENTS),
    SESSION: ("kvprof.analysis", *VIEWS, "kvprof.export", "kvprof.system", *CLIENTS),
    "kvprof.analysis": ("kvprof.collect", *VIEWS, "kvprof.export", "kvprof.system", *CLIENTS),
    "kvprof.export": ("kvprof.collect", *VIEWS, "kvprof.system", *CLIENTS),
    "kvprof.views": CLIENTS,
    "kvprof.tui": CLIENTS,
    "kvprof.system": ("kvprof.analysis", *VIEWS, "kvprof.export", *CLIENTS),
    "kvprof.bench": ("kvprof.analysis", *VIEWS, "kvprof.export", "kvprof.commands", "kvprof.cli"),
    # building the parser (`kvprof --help`) loads no stage: each command imports its
    # stage when it runs (kvprof.collect only for the collectors' defaults, without bcc)
    "kvprof.commands": ("kvprof.analysis", *VIEWS, "kvprof.export", "kvprof.system", "kvprof.bench",
                        SESSION),
}  # fmt: skip

LOADED = """
import importlib, json, sys
missing = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name.split(".")[0] == "kvprof":
            raise
        missing[name] = e.name  # a Debian package not installed here
print(json.dumps({"loaded": sorted(m for m in sys.modules if m.startswith("kvprof")), "missing": missing}))
"""


def in_room(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


@pytest.mark.parametrize("room", sorted(LATER))
def test_a_room_loads_no_later_stage(room: str) -> None:
    """A fresh interpreter imports every module of the room; sys.modules then holds
    no kvprof module of a room that comes after it."""
    inner = [r for r in LATER if r != room and in_room(r, room)]  # the session, within kvprof.collect
    own = [m for m in MODULES if in_room(m, room) and not any(in_room(m, r) for r in inner)]
    assert own, f"no modules in {room}"
    done = subprocess.run(
        [sys.executable, "-c", LOADED, *own], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    later = [m for m in result["loaded"] if any(in_room(m, r) for r in LATER[room])]
    assert not later, f"importing {room} loads later stages: {later} (missing here: {result['missing']})"


# rooms whose run-time imports (inside functions) may reach a later stage: the
# commands import their stage when they run; top and the exporter open their session
# through kvprof.system.attach and say what stops them with kvprof.commands.fail
LAZY_CLIENTS = ("kvprof.commands", *VIEWS)


@pytest.mark.parametrize("room", sorted(r for r in LATER if r not in LAZY_CLIENTS))
def test_a_room_imports_no_later_stage_even_inside_functions(room: str) -> None:
    """The same order on the import graph, where imports inside functions count too."""
    inner = [r for r in LATER if r != room and in_room(r, room)]
    later = sorted(
        f"{m} -> {target}"
        for m, targets in import_graph().items()
        if in_room(m, room) and not any(in_room(m, r) for r in inner)
        for target in targets
        if any(in_room(target, r) for r in LATER[room])
    )
    assert not later, f"{room} imports later stages: {later}"


def test_no_test_module_imports_another() -> None:
    """Tests share helpers through tests/support.py: none imports a test module or conftest.py."""
    test_modules = {p.stem for p in TESTS.glob("test_*.py")} | {"conftest"}
    found = [
        f"{p.name} imports {root}"
        for p in sorted(TESTS.glob("*.py"))
        for root in sorted(imported_roots(p) & test_modules)
    ]
    assert not found, found
