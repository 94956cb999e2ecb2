"""py-spy's output read into kvprof's stacks: `py-spy record --format raw --threads
--function` lines and `py-spy dump --json` traces (kvprof/collect/pyspy.py runs py-spy).

A frame is `function (file:first line)`: `--function` names a frame by the first line
of its function, as every other frame in kvprof is a function, so flame graphs and
findings count it once; first_line() gives a dump's frames the same name."""

from __future__ import annotations

import ast
import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from kvprof.model.profile import CpuStack

_RAW_THREAD = re.compile(r"^thread \((?P<id>0x[0-9A-Fa-f]+|\d+)\)(?:: (?P<name>.*))?$")


@dataclass
class Stacks:
    """Python stacks by thread, as py-spy gave them."""

    stacks: list[CpuStack] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)  # tid -> thread name


def parse_raw(text: str) -> Stacks:
    """py-spy's `--format raw --threads` output: `thread (TID): NAME;frame;... COUNT`.

    A thread py-spy could not match to an OS thread is named by its
    pthread id (`thread (0x7F...)`); it keeps that number as its id."""
    out = Stacks()
    merged: dict[tuple[int, tuple[str, ...]], int] = {}
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        m = _RAW_THREAD.match(frames[0])
        tid = 0
        if m is not None:
            frames = frames[1:]
            tid = int(m["id"], 0)
            if m["name"]:
                out.names[tid] = m["name"]
        key = (tid, tuple(frames))
        merged[key] = merged.get(key, 0) + int(count)
    out.stacks = [CpuStack(tid=tid, frames=list(frames), count=n) for (tid, frames), n in merged.items()]
    return out


@functools.lru_cache(maxsize=256)
def _functions(path: str) -> tuple[tuple[int, int, int], ...]:
    """(first line, last line, the line py-spy --function names it by) of every function in a file."""
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return ()
    return tuple(
        (
            node.lineno,
            node.end_lineno or node.lineno,
            min([node.lineno, *(d.lineno for d in node.decorator_list)]),
        )
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )


def first_line(path: str, line: int) -> int:
    """The first line of the function that `line` of `path` is in (its code object's
    co_firstlineno, as `py-spy record --function` gives it); 1 for module-level code,
    `line` itself when the file cannot be read."""
    if line <= 0 or not path:
        return line
    functions = _functions(path)
    if not functions:
        return line
    inside = [f for f in functions if f[0] <= line <= f[1]]
    return max(inside)[2] if inside else 1


@dataclass
class DumpThread:
    """One thread's stack in one `py-spy dump --json`."""

    tid: int
    name: str
    active: bool
    frames: list[str]  # root first, `name (file:first line)` as `py-spy record --function` writes them


def parse_dump(out: str) -> list[DumpThread]:
    """`py-spy dump --json` output; ValueError when it is not JSON."""
    threads = []
    for t in json.loads(out):
        frames = [
            f"{f.get('name', '?')} ({f.get('short_filename') or f.get('filename', '?')}:"
            f"{first_line(f.get('filename', ''), int(f.get('line') or 0))})"
            for f in reversed(t.get("frames", []))
        ]
        tid = t.get("os_thread_id") or t.get("thread_id") or 0
        threads.append(DumpThread(int(tid), t.get("thread_name") or "", bool(t.get("active")), frames))
    return threads
