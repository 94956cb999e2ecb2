"""Lists read from kvcached's and the BPF programs' C sources, where the C side
defines them once: an X-macro's entries (`#define KV_OPCODES(X) X(GET, "get") ...`)
and an enum's members. kvprof reads what it must agree with from there instead of
keeping a copy (the opcode names); tests/test_contracts.py checks the copies it
keeps (the counters' order) against the same readers."""

from __future__ import annotations

import re
from pathlib import Path

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
_ARGS = re.compile(r"\bX\(([^()]*)\)")


def _code(path: Path) -> str:
    return _COMMENT.sub("", path.read_text())


def x_macro(path: Path, macro: str) -> list[list[str]]:
    """The arguments of each X(...) of `#define <macro>(X)` in `path`, in order, strings
    unquoted: [["GET", "get"], ["GETS", "gets"], ...]. KeyError when it is not defined."""
    lines = _code(path).splitlines()
    head = re.compile(rf"^\s*#\s*define\s+{re.escape(macro)}\(X\)")
    try:
        start = next(i for i, line in enumerate(lines) if head.match(line))
    except StopIteration:
        raise KeyError(f"{path.name} defines no {macro}(X)") from None
    body = []
    for line in lines[start:]:  # the macro's lines: each but its last ends in a backslash
        body.append(line)
        if not line.rstrip().endswith("\\"):
            break
    text = "\n".join(body).split(")", 1)[1]  # after `(X)`
    return [[a.strip().strip('"') for a in args.split(",")] for args in _ARGS.findall(text)]


def enum_members(path: Path, enum: str) -> list[str]:
    """The members of `enum <enum> { ... }` in `path`, in order: the enums read here count
    from 0 without gaps (ValueError when one does not). KeyError when it is not defined."""
    found = re.search(rf"\benum\s+{re.escape(enum)}\s*\{{([^}}]*)\}}", _code(path))
    if found is None:
        raise KeyError(f"{path.name} defines no enum {enum}")
    names = []
    for i, member in enumerate(m for m in found.group(1).split(",") if m.strip()):
        name, _, value = member.partition("=")
        if value.strip() and int(value, 0) != i:
            raise ValueError(f"enum {enum} of {path.name}: {name.strip()} is {value.strip()}, not {i}")
        names.append(name.strip())
    return names
