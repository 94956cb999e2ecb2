"""Where the lab programs are: kvcached, kvload and atomics, built from the repository's
server/ (`make -C server`) or installed on PATH by its `make install` (docs/install.md)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from kvprof.collect.server_stats import TargetError

# The lab programs built from the repository's server/ (`make -C server`; `make install`
# puts them on PATH): each one's environment variable, and its name once installed.
LAB_PROGRAMS = {
    "kvcached": ("KVCACHED_BIN", "kvcached"),
    "kvload": ("KVLOAD_BIN", "kvload"),
    "atomics": ("ATOMICS_BIN", "kvprof-atomics"),  # server/bench/atomics.c, kvprof bench's
}


def source_build() -> Path | None:
    """server/build of the repository kvprof runs from (a checkout, or its editable
    install: `make demo`, the tests); None for kvprof installed from a wheel."""
    tree = Path(__file__).resolve().parents[2]
    return tree / "server" / "build" if (tree / "server" / "Makefile").is_file() else None


def lab_binary(name: str) -> Path:
    """Lab program `name` (a key of LAB_PROGRAMS): its environment variable's path if set,
    else the repository's build when kvprof runs from one, else the installed one on PATH."""
    variable, installed = LAB_PROGRAMS[name]
    given = os.environ.get(variable)
    if given:
        if not Path(given).is_file():
            raise TargetError(f"${variable}={given}: no such file")
        return Path(given)
    build = source_build()
    if build is not None and (build / name).is_file():
        return build / name
    found = shutil.which(installed)
    if found is not None:
        return Path(found)
    if build is not None:
        raise TargetError(f"{build / name} not found: build it with `make -C server`")
    raise TargetError(
        f"{installed} not found on PATH: `make install PREFIX=/usr/local` in kvprof's repository "
        f"installs it (docs/install.md), or set ${variable} to its path"
    )
