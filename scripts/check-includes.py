#!/usr/bin/env python3
"""The include graph of kvcached's sources (server/), checked for the layering
that docs/server.md describes:

- no cycle between modules (a module is foo.c with foo.h: one node, so
  core/conn.c -> protocol/process.h -> core/conn.h is a cycle of two);
- nothing under core/ includes anything from protocol/, directly or through
  the headers it includes.

Prints one line per problem and exits 1, or exits 0 silently. --graph prints
the module edges too. Only `#include "..."` that name a file of the tree count
(kvs.h is generated into build/ and is left out)."""

import argparse
import re
import sys
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
SKIP_DIRS = {"build", "build-asan", "build-fuzz", "build-lint"}
LOWER = "core/"
UPPER = "protocol/"


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


def module_graph(graph):
    edges = {}
    for name, incs in graph.items():
        deps = edges.setdefault(module(name), set())
        deps.update(module(inc) for inc in incs if module(inc) != module(name))
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


def upward(graph):
    """(file, chain) for each file under core/ that reaches protocol/."""
    found = []
    for name in sorted(graph):
        if not name.startswith(LOWER):
            continue
        seen, todo = {name}, [[name]]
        while todo:
            chain = todo.pop(0)
            if chain[-1].startswith(UPPER):
                found.append((name, chain))
                break
            for inc in graph[chain[-1]]:
                if inc not in seen:
                    seen.add(inc)
                    todo.append([*chain, inc])
    return found


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
    graph = includes(root, sources(root))
    edges = module_graph(graph)
    if args.graph:
        for mod in sorted(edges):
            print(f"{mod} -> {' '.join(sorted(edges[mod])) or '-'}")
    problems = [f"include cycle: {' <-> '.join(scc)}" for scc in cycles(edges)]
    problems += [f"{LOWER} includes {UPPER}: {' -> '.join(chain)}" for _, chain in upward(graph)]
    for line in problems:
        print(f"check-includes: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
