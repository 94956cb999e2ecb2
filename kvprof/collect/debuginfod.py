"""Debug files from debuginfod servers, by build-id, as gdb and perf fetch them.

The servers are those of `DEBUGINFOD_URLS` (space-separated URLs; set and empty:
none), else those the `*.urls` files of URLS_DIR name when PROFILE_SCRIPT, which
puts them into the variable at login, is there (Fedora, Ubuntu; Debian when its
package's question was answered yes): `sudo` drops the variable, not the files.
A module's debug file is `GET URL/buildid/HEX/debuginfo`, asked of each server
in turn.

What a server sends is untrusted: it is kept only when it is an ELF file whose
build-id note is the one asked for and whose symbol table can be read, within
MAX_BYTES; anything else is refused with one line. Each request waits at most
REQUEST_S for the server, and all fetches of one kvprof process end TOTAL_S after
the first began. A session starts them in the background while it attaches
(start()); a module's names wait for its fetch only until then (debug_file()).

Files are kept in CACHE_DIR (at most CACHE_BYTES, the least recently used dropped
first); a build-id no server has is not asked for again for MISS_S, nor one whose
servers did not answer for DOWN_S.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

URLS_DIR = "/etc/debuginfod"
URLS_DIR_ENV = "KVPROF_DEBUGINFOD_DIR"  # another folder of *.urls files, read as it is (tests)
# URLS_DIR's files count where the system's login script reads them, as a login shell would
PROFILE_SCRIPT = "/etc/profile.d/debuginfod.sh"
REQUEST_S = 5.0  # connecting, and each read of an answer
TOTAL_S = 30.0  # every fetch of one kvprof process, from the first one's start
MAX_BYTES = 500_000_000
MISS_S = 600.0  # a build-id the servers do not have: asked again after this
DOWN_S = 60.0  # ... one whose servers did not answer
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvprof" / "debuginfod"
CACHE_BYTES = 2 << 30
_CHUNK = 1 << 20
_SHF_COMPRESSED = 0x800

Progress = Callable[[str], None] | None


def servers() -> tuple[list[str], str]:
    """The servers' URLs and what named them; no URL and why none when none is asked."""
    env = os.environ.get("DEBUGINFOD_URLS")
    if env is not None:
        urls = _http(env.split())
        return urls, "DEBUGINFOD_URLS" if urls else "DEBUGINFOD_URLS is set and names none"
    custom = os.environ.get(URLS_DIR_ENV)
    folder = Path(custom or URLS_DIR)
    urls = []
    try:
        files = sorted(folder.glob("*.urls"))
    except OSError:
        files = []
    for f in files:
        try:
            urls += f.read_text(errors="replace").split()
        except OSError:
            continue
    urls = _http(urls)
    if not urls:
        return [], f"DEBUGINFOD_URLS is not set, and no {folder}/*.urls file names a server"
    if not custom and not os.path.exists(PROFILE_SCRIPT):  # the system does not use them
        return [], (
            f"{folder}/*.urls name {' '.join(urls)}, but no {PROFILE_SCRIPT} puts them in DEBUGINFOD_URLS "
            "at login (on Debian: its package's question was answered no)"
        )
    return urls, f"{folder}/*.urls"


def _http(urls: list[str]) -> list[str]:
    """The http(s) URLs of `urls`, once each, without a trailing slash."""
    out = [u.rstrip("/") for u in urls if u.startswith(("http://", "https://"))]
    return list(dict.fromkeys(out))


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def describe() -> str:
    """One line: which servers are asked and where they were named, or why none is."""
    urls, where = servers()
    if not urls:
        return f"no server asked: {where}"
    return f"asks {' '.join(urls)} (from {where}) for the debug files of modules without names"


# ---- one fetch --------------------------------------------------------------------


class _Refused(Exception):
    """A server's answer that is not the debug file asked for."""


def _download(url: str, bid: str, dest: Path, deadline: float) -> int:
    """GET the debug file of `bid` from the server at `url` into `dest`; its size.
    HTTPError, URLError, OSError, HTTPException or _Refused when there is none."""
    request = urllib.request.Request(f"{url}/buildid/{bid}/debuginfo", headers={"User-Agent": "kvprof"})
    with urllib.request.urlopen(request, timeout=max(0.1, min(REQUEST_S, deadline - time.monotonic()))) as r:
        length = r.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > MAX_BYTES:
            raise _Refused(f"it is {_size(int(length))}, more than the {_size(MAX_BYTES)} kvprof takes")
        size = 0
        with dest.open("wb") as out:
            # read1: what one read of the socket gives, so a slow sender meets the deadline
            while chunk := r.read1(_CHUNK):
                size += len(chunk)
                if size > MAX_BYTES:
                    raise _Refused(f"it is more than the {_size(MAX_BYTES)} kvprof takes")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not sent within {TOTAL_S:g} s")
                out.write(chunk)
    return size


def check(path: Path, bid: str) -> str | None:
    """Why the file at `path` is not a debug file of build-id `bid` whose symbols
    can be read, or None when it is one."""
    from elftools.elf.elffile import ELFFile  # pyelftools: a session imports this module without it

    try:
        with path.open("rb") as f:
            elf = ELFFile(f)
            got = None
            for sec in elf.iter_sections():
                if sec["sh_type"] == "SHT_NOTE":
                    for note in sec.iter_notes():
                        if note["n_type"] == "NT_GNU_BUILD_ID":
                            got = str(note["n_desc"])
            if got != bid:
                return f"its build-id is {got or 'missing'}, not {bid}"
            symtab = elf.get_section_by_name(".symtab")
            if symtab is None or symtab["sh_type"] != "SHT_SYMTAB":
                return "it has no symbol table"
            strtab = elf.get_section(symtab["sh_link"])
            if (symtab["sh_flags"] | strtab["sh_flags"]) & _SHF_COMPRESSED:
                return "its symbol table is compressed"
            symtab.data(), strtab.data()
    except Exception as e:  # untrusted bytes: whatever the ELF parser makes of them is a refusal
        return f"it is not a readable ELF file ({e.__class__.__name__})"
    return None


# ---- the fetches of this process ---------------------------------------------------


@dataclass
class _Said:
    """One line of the status: `head`, the names of the modules it is about, `tail`."""

    head: str
    tail: str
    warning: bool
    names: list[str] = field(default_factory=list)

    def line(self) -> str:
        return f"{self.head}{', '.join(self.names)}{self.tail}"


@dataclass
class _State:
    done: dict[str, threading.Event] = field(default_factory=dict)  # build-id -> set once fetched or not
    files: dict[str, str | None] = field(default_factory=dict)  # build-id -> its debug file, None: none
    deadline: float = 0.0  # no fetch goes on after it (time.monotonic(); 0: none began)
    down: dict[str, str] = field(default_factory=dict)  # server -> why it did not answer
    said: dict[tuple[str, str], _Said] = field(default_factory=dict)


_lock = threading.Lock()
_state = _State()


def forget() -> None:
    """Forget this process's fetches (a test's next server, another cache)."""
    global _state
    with _lock:
        _state = _State()


def said() -> tuple[list[str], list[str]]:
    """(warnings, notes) of the fetches so far, for a profile's status: one line for
    the modules each outcome is about."""
    with _lock:
        lines = list(_state.said.values())
    return [x.line() for x in lines if x.warning], [x.line() for x in lines if not x.warning]


def _say(head: str, name: str, tail: str, warning: bool) -> None:
    with _lock:
        group = _state.said.setdefault((head, tail), _Said(head, tail, warning))
        if name not in group.names:
            group.names.append(name)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _cached(bid: str) -> tuple[str | None, tuple[str, bool, str] | None]:
    """(the cached debug file of `bid` or None, the remembered miss or None): a miss
    is (why, whether no server answered, when it was and until when it is kept)."""
    file = CACHE_DIR / f"{bid}.debug"
    if file.is_file():
        try:
            os.utime(file)
        except OSError:
            pass
        return str(file), None
    try:
        miss = json.loads((CACHE_DIR / f"{bid}.miss").read_text())
        at = (CACHE_DIR / f"{bid}.miss").stat().st_mtime
        until = at + (DOWN_S if miss["down"] else MISS_S)
        if at <= time.time() < until:
            when = f" (at {_clock(at)}; not asked again until {_clock(until)})"
            return None, (str(miss["why"]), bool(miss["down"]), when)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None, None


def _remember_miss(bid: str, why: str, down: bool) -> None:
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        (CACHE_DIR / f"{bid}.miss").write_text(json.dumps({"why": why, "down": down}))
    except OSError:
        pass


def _trim_cache() -> None:
    try:
        files = sorted(CACHE_DIR.glob("*.debug"), key=lambda p: p.stat().st_mtime, reverse=True)
        total = 0
        for p in files:  # the most recently used first, until the budget is spent
            total += p.stat().st_size
            if total > CACHE_BYTES:
                p.unlink(missing_ok=True)
        for p in CACHE_DIR.glob("*.tmp"):  # a kvprof that exited mid-download
            if time.time() - p.stat().st_mtime > TOTAL_S:
                p.unlink(missing_ok=True)
    except OSError:
        pass


def _missing(name: str, why: str, down: bool, when: str = "") -> None:
    """Say that no server gave module `name` its debug file: `why`, per server; `down`:
    none answered, said first (a terminal shows a progress line's start); `when`: a
    remembered miss's times."""
    if down:
        _say(f"debuginfod: {why}: no debug file for ", name, when, True)
    else:
        _say("debuginfod: no debug file for ", name, f": {why}{when}", False)


def _fetch(bid: str, name: str, urls: list[str], progress: Progress) -> str | None:
    """Ask each server in turn for the debug file of module `name` (build-id `bid`);
    `progress` hears of each file fetched."""
    with _lock:
        if not _state.deadline:
            _state.deadline = time.monotonic() + TOTAL_S
        deadline = _state.deadline
    missing: list[str] = []
    for url in urls:
        with _lock:
            silent = _state.down.get(url)
        if silent is not None:
            missing.append(f"{url} did not answer ({silent})")
            continue
        if time.monotonic() >= deadline:
            _say(
                "debuginfod: not asked for the debug file of ",
                name,
                f": fetches end {TOTAL_S:g} s after the first",
                True,
            )
            return None
        try:
            CACHE_DIR.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            _say(
                f"debuginfod: cannot keep debug files in {CACHE_DIR} ({e.strerror}): ",
                name,
                " not fetched",
                True,
            )
            return None
        tmp = CACHE_DIR / f"{bid}.{os.getpid()}.{threading.get_native_id()}.tmp"
        start = time.monotonic()
        try:
            size = _download(url, bid, tmp, deadline)
            why = check(tmp, bid)
            if why is not None:
                raise _Refused(why)
            file = CACHE_DIR / f"{bid}.debug"
            tmp.rename(file)
        except urllib.error.HTTPError as e:
            missing.append(f"{url} has none" if e.code == 404 else f"{url} answered HTTP {e.code}")
            continue
        except _Refused as e:
            _say("debuginfod: refused the debug file of ", name, f" from {url}: {e}", True)
            continue
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
            reason = getattr(e, "reason", None) or e
            why = getattr(reason, "strerror", None) or str(reason) or e.__class__.__name__
            with _lock:
                _state.down[url] = why
            missing.append(f"{url} did not answer ({why})")
            continue
        finally:
            tmp.unlink(missing_ok=True)
        if progress is not None:
            took = time.monotonic() - start
            progress(f"debuginfod: {name}'s debug file ({_size(size)}) from {url} in {took:.1f} s")
        _say("debuginfod: names of ", name, f" from debug files of {url}", False)
        _trim_cache()
        return str(file)
    if missing:
        down = all("did not answer" in m for m in missing)
        _missing(name, "; ".join(missing), down)
        _remember_miss(bid, "; ".join(missing), down)
    return None


def debug_file(bid: str, name: str, progress: Progress = None) -> str | None:
    """The debug file of module `name` (build-id `bid`) from the cache or a server, None
    when no server is named or none has it; a fetch under way (start()) is waited for
    until the fetches' deadline."""
    urls, _ = servers()
    if not urls:
        return None
    with _lock:
        other = _state.done.get(bid)
        event = _state.done[bid] = other or threading.Event()
    if other is not None:
        with _lock:
            deadline = _state.deadline or time.monotonic() + TOTAL_S
        event.wait(max(0.0, deadline - time.monotonic()))
        with _lock:
            return _state.files.get(bid)
    try:
        file, remembered = _cached(bid)
        if file is not None:
            _say("debuginfod: names of ", name, f" from debug files kept in {CACHE_DIR}", False)
        elif remembered:
            _missing(name, *remembered)
        else:
            file = _fetch(bid, name, urls, progress)
        with _lock:
            _state.files[bid] = file
    finally:
        event.set()
    return file


def start(pid: int, progress: Progress, lacking: Callable[[int], list[tuple[str, str]]]) -> None:
    """Fetch, in a thread of its own, the debug files of the modules of process `pid`
    that lack names (`lacking(pid)`: build-id and name of each): a session's attach goes
    on meanwhile. `progress` hears what is asked, each file fetched, and at the end what
    was not. Nothing when no server is named."""
    urls, where = servers()
    if not urls:
        return

    def run() -> None:
        try:  # pyelftools: without it no module is named, and the collectors say so
            modules = lacking(pid)
        except ImportError:
            return
        todo = [(bid, name) for bid, name in modules if _cached(bid) == (None, None)]
        if todo and progress is not None:
            names = ", ".join(name for _, name in todo)
            progress(f"debuginfod: asking {' '.join(urls)} (from {where}) for the debug files of {names}")
        for bid, name in modules:
            debug_file(bid, name, progress)
        if progress is not None:
            warnings, notes = said()
            for line in warnings + [n for n in notes if "no debug file for" in n]:
                progress(line)

    threading.Thread(target=run, name="kvprof-debuginfod", daemon=True).start()
