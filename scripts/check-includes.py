#!/usr/bin/env python3
"""The include graph of kvcached's sources (server/), checked for the layering
that docs/server.md describes:

- no cycle between modules (a module is foo.c with foo.h: one node, so
  core/conn.c -> protocol/process.h -> core/conn.h is a cycle of two). A
  function declared in bar.h but defined in foo.c makes every includer of
  bar.h depend on foo too: the declaration is foo's, wherever it sits;
- the layers, lowest first: the headers at the top of the tree (util.h,
  trace.h, opcodes.h, ...), core/, stats/, storage/, protocol/; the programs
  (main.c, fuzz/, tests/, loadgen/, bench/) above them all. No file of a
  layer includes a file of a higher one, directly or through the headers it
  includes (so core/ and stats/ reach nothing of protocol/).

Prints one line per problem and exits 1, or exits 0 silently. --graph prints
the module edges too. Only `#include "..."` that name a file of the tree count
(kvs.h is generated into build/ and is left out)."""

import argparse
import re
import sys
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
SKIP_DIRS = {"build", "build-asan", "build-fuzz", "build-lint"}
# The layers that must not include upwards, lowest first (docs/server.md).
LAYERS = ("core/", "stats/", "storage/", "protocol/")
# A prototype at the start of a line (`const char *opcode_name(enum opcode op);`), and a
# definition (the same, then `{` on the next line or the same one); static ones are local.
_SIGNATURE = (
    r"^(?:__attribute__\(\(\w+\)\)\s*)?(?!static\b|typedef\b|extern\b|return\b|#)"
    r"[A-Za-z_][\w \t*]*?\b(\w+)\s*\([^;{}()]*\)"
)
DECLARATION = re.compile(_SIGNATURE + r"[^;{}]*;", re.MULTILINE)
DEFINITION = re.compile(_SIGNATURE + r"\s*\{", re.MULTILINE)
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)


def sources(root):
    """Every .c and .h of the tree, as paths relative to root."""
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.suffix in (".c", ".h") and path.is_file() and not SKIP_DIRS & set(rel.parts[:-1]):
            found.append(rel.as_posix())
    return found


def includes(root, files):
    """file -> the files of the tree it includes (kvcached builds with -I.)."""
    known = set(files)
    graph = {}
    for name in files:
        text = (root / name).read_text(encoding="utf-8", errors="replace")
        graph[name] = [inc for inc in INCLUDE.findall(text) if inc in known]
    return graph


def module(name):
    return name.rsplit(".", 1)[0]


def owners(root, files):
    """header -> the other modules whose .c defines a function the header declares."""
    defined = {}
    for name in files:
        if name.endswith(".c"):
            text = COMMENT.sub("", (root / name).read_text(encoding="utf-8", errors="replace"))
            for fn in DEFINITION.findall(text):
                defined.setdefault(fn, module(name))
    found = {}
    for name in files:
        if name.endswith(".h"):
            text = COMMENT.sub("", (root / name).read_text(encoding="utf-8", errors="replace"))
            mods = {defined[fn] for fn in DECLARATION.findall(text) if fn in defined}
            found[name] = mods - {module(name)}
    return found


def module_graph(graph, defined_in=None):
    """module -> the modules it includes, and those that define what it includes declares."""
    defined_in = defined_in or {}
    edges = {}
    for name, incs in graph.items():
        deps = edges.setdefault(module(name), set())
        for inc in incs:
            deps.add(module(inc))
            deps.update(defined_in.get(inc, ()))
        deps.discard(module(name))
    return edges


def cycles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer(name):
    """The index of name's layer in LAYERS; -1 for the headers below them all,
    len(LAYERS) for the programs above them."""
    for i, prefix in enumerate(LAYERS):
        if name.startswith(prefix):
            return i
    return -1 if "/" not in name and name.endswith(".h") else len(LAYERS)


def upward(graph):
    """(file, chain) for each file of a layer that reaches a file of a higher layer:
    the shortest such chain of includes."""
    found = []
    for name in sorted(graph):
        own = layer(name)
        if own >= len(LAYERS):
            continue
        seen, todo = {name}, [[name]]
        while todo:
            chain = todo.pop(0)
            if layer(chain[-1]) > own:
                found.append((name, chain))
                break
            for inc in graph[chain[-1]]:
                if inc not in seen:
                    seen.add(inc)
                    todo.append([*chain, inc])
    return found


def upward_line(chain):
    lower, upper = LAYERS[layer(chain[0])], LAYERS[layer(chain[-1])]
    return f"{lower} includes {upper}: {' -> '.join(chain)}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "root",
        nargs="?",
        default=str(Path(__file__).resolve().parent.parent / "server"),
        help="the server's source tree (default: server/ of this repository)",
    )
    ap.add_argument("--graph", action="store_true", help="print the module edges")
    args = ap.parse_args(argv)
    root = Path(args.root)
    if not root.is_dir():
        print(f"check-includes: {root} is not a directory", file=sys.stderr)
        return 2
    files = sources(root)
    graph = includes(root, files)
    edges = module_graph(graph, owners(root, files))
    if args.graph:
        for mod in sorted(edges):
            print(f"{mod} -> {' '.join(sorted(edges[mod])) or '-'}")
    problems = [f"include cycle: {' <-> '.join(scc)}" for scc in cycles(edges)]
    problems += [upward_line(chain) for _, chain in upward(graph)]
    for line in problems:
        print(f"check-includes: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
