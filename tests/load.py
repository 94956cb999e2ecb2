"""A small pipelined load helper for the tests: raw sockets, exact totals.

Each connection sends batches of memcached text commands (multi-key `get`s
and `set`s) and reads every reply of a batch before sending the next, so a
test knows exactly how many requests reached the server. Work is bounded by
a batch count and by a deadline; the totals say whether everything planned
was sent and answered (`complete`).

Replies are counted, not parsed value by value: keys and values are limited
to lowercase letters, digits and `-_.:`, so a reply token such as `END` or
`STORED` can only ever appear as a server line. That keeps the client cheap
enough to keep two server workers busy from Python.

Connections run in threads (`run`); for more pressure than one Python
interpreter can give, `run_processes` starts this file as separate
processes (`python tests/load.py ...`), each printing its totals as JSON, and
stops any that outlive their deadline by PID.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

_SAFE = re.compile(rb"[a-z0-9\-_.:]+")
# Line-start tokens of the replies a batch can get; data lines never match
# because keys and values are restricted to _SAFE.
# Tokens stop before the final "\n" so that consecutive replies
# ("END\r\nEND\r\n") do not overlap and str.count sees each one.
_REFUSED = (b"\nNOT_STORED\r", b"\nEXISTS\r", b"\nNOT_FOUND\r")
_ERRORS = (b"\nERROR", b"\nCLIENT_ERROR", b"\nSERVER_ERROR")


class LoadError(RuntimeError):
    """The server closed a connection or stopped answering."""


def _safe(token: bytes, what: str) -> bytes:
    if not _SAFE.fullmatch(token):
        raise ValueError(f"{what} {token!r} must match [a-z0-9-_.:]+ so replies can be counted")
    return token


@dataclass(frozen=True)
class Command:
    """One request: its wire bytes and what it counts as."""

    payload: bytes
    kind: str  # "get" or "set"
    keys: tuple[str, ...]

    @property
    def nkeys(self) -> int:
        return len(self.keys)


def get(keys: Sequence[str | bytes]) -> Command:
    """A multi-key `get` (one request, len(keys) keys)."""
    ks = [_safe(k.encode() if isinstance(k, str) else k, "key") for k in keys]
    if not ks:
        raise ValueError("a get needs at least one key")
    return Command(b"get " + b" ".join(ks) + b"\r\n", "get", tuple(k.decode() for k in ks))


def set_(key: str | bytes, value: str | bytes, exptime: int = 0, flags: int = 0) -> Command:
    """A `set` of one key."""
    k = _safe(key.encode() if isinstance(key, str) else key, "key")
    v = _safe(value.encode() if isinstance(value, str) else value, "value") if value else b""
    return Command(b"set %s %d %d %d\r\n%s\r\n" % (k, flags, exptime, len(v), v), "set", (k.decode(),))


@dataclass
class Totals:
    """What was sent and what came back, summed over connections."""

    connections: int = 0
    batches: int = 0  # batches sent (each fully answered unless an error ended the run)
    requests: int = 0  # commands sent: a multi-get is one
    get_requests: int = 0  # get commands sent
    get_keys: int = 0  # keys asked for by those gets
    sets: int = 0  # set commands sent
    responses: int = 0  # complete replies received (a multi-get's END is one)
    hits: int = 0  # VALUE blocks received
    stored: int = 0  # STORED replies
    not_stored: int = 0  # NOT_STORED / EXISTS / NOT_FOUND replies
    errors: int = 0  # ERROR / CLIENT_ERROR / SERVER_ERROR replies
    elapsed_s: float = 0.0  # longest connection's wall time
    complete: bool = True  # every planned batch was sent and answered
    failures: list[str] = field(default_factory=list)

    @property
    def misses(self) -> int:
        return self.get_keys - self.hits

    def __iadd__(self, other: Totals) -> Totals:
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "elapsed_s":
                setattr(self, f.name, max(a, b))
            elif f.name == "complete":
                setattr(self, f.name, a and b)
            else:
                setattr(self, f.name, a + b)
        return self

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Totals:
        return cls(**json.loads(text))


class Connection:
    """One client connection that sends whole batches and counts their replies."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.totals = Totals(connections=1)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batch(self, commands: Sequence[Command]) -> None:
        """Send all commands at once, then read until each has its reply."""
        t = self.totals
        self.sock.sendall(b"".join(c.payload for c in commands))
        t.batches += 1
        for c in commands:
            t.requests += 1
            if c.kind == "get":
                t.get_requests += 1
                t.get_keys += c.nkeys
            else:
                t.sets += 1
        want = len(commands)
        got = 0
        # Count only complete lines; keep the unfinished tail for the next recv.
        # A leading "\n" makes the first line of the reply look like any other.
        tail = b"\n"
        while got < want:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise LoadError(f"server closed the connection with {want - got} replies pending")
            data = tail + chunk
            cut = data.rfind(b"\n")
            lines, tail = data[: cut + 1], data[cut:]
            ends = lines.count(b"\nEND\r")
            stored = lines.count(b"\nSTORED\r")
            refused = sum(lines.count(r) for r in _REFUSED)
            errors = sum(lines.count(e) for e in _ERRORS)
            t.hits += lines.count(b"\nVALUE ")
            t.stored += stored
            t.not_stored += refused
            t.errors += errors
            t.responses += ends + stored + refused + errors
            got += ends + stored + refused + errors
        if got != want:
            raise LoadError(f"expected {want} replies, counted {got}")


def _connection_worker(
    host: str,
    port: int,
    batches: Sequence[Sequence[Command]],
    repeat: int,
    deadline: float,
    out: list[Totals],
    index: int,
) -> None:
    start = time.monotonic()
    totals = Totals(connections=1)
    try:
        with Connection(host, port) as conn:
            done = 0
            for _ in range(repeat):
                for b in batches:
                    if time.monotonic() >= deadline:
                        break
                    conn.batch(b)
                    done += 1
            totals = conn.totals
            totals.complete = done == repeat * len(batches)
    except (OSError, LoadError) as e:
        totals.complete = False
        totals.failures.append(f"connection {index}: {e}")
    totals.elapsed_s = time.monotonic() - start
    out[index] = totals


def run(
    host: str,
    port: int,
    plans: Sequence[Sequence[Sequence[Command]]],
    repeat: int = 1,
    duration: float = 30.0,
) -> Totals:
    """One connection per plan (a list of batches), all at once, in threads.

    Each connection sends its batches in order `repeat` times, stopping early
    (complete=False) once `duration` seconds have passed. All connections are
    open before any sends, so the server has spread them over its workers.
    """
    deadline = time.monotonic() + duration
    out: list[Totals] = [Totals() for _ in plans]
    threads = [
        threading.Thread(
            target=_connection_worker, args=(host, port, p, repeat, deadline, out, i), daemon=True
        )
        for i, p in enumerate(plans)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(duration + 15.0)
    total = Totals()
    for i, th in enumerate(threads):
        if th.is_alive():  # a socket timeout ends it; count it as incomplete meanwhile
            out[i].complete = False
            out[i].failures.append(f"connection {i}: still running after the deadline")
        total += out[i]
    return total


def keys(prefix: str, n: int) -> list[str]:
    """n distinct keys `prefix0` .. `prefix{n-1}`."""
    return [f"{prefix}{i}" for i in range(n)]


def multiget_batches(
    key_space: Sequence[str], keys_per_get: int, gets_per_batch: int, batches: int
) -> list[list[Command]]:
    """`batches` batches of `gets_per_batch` multi-gets, walking key_space in order."""
    out: list[list[Command]] = []
    i = 0
    n = len(key_space)
    for _ in range(batches):
        batch = []
        for _ in range(gets_per_batch):
            batch.append(get([key_space[(i + j) % n] for j in range(keys_per_get)]))
            i += keys_per_get
        out.append(batch)
    return out


def set_batches(
    key_space: Sequence[str], value: str | Callable[[str], str], sets_per_batch: int
) -> list[list[Command]]:
    """Sets of every key in key_space to `value` (or value(key)), in batches."""
    cmds = [set_(k, value(k) if callable(value) else value) for k in key_space]
    return [cmds[i : i + sets_per_batch] for i in range(0, len(cmds), sets_per_batch)]


def run_processes(
    host: str,
    port: int,
    processes: int,
    key_prefix: str,
    nkeys: int,
    keys_per_get: int,
    gets_per_batch: int,
    duration: float,
    max_batches: int = 1_000_000,
) -> Totals:
    """`processes` separate Python processes, one connection each, looping
    multi-gets over `nkeys` keys until `duration` or `max_batches`; summed totals."""
    argv = [
        sys.executable, str(Path(__file__).resolve()), "--host", host, "--port", str(port),
        "--key-prefix", key_prefix, "--nkeys", str(nkeys), "--keys-per-get", str(keys_per_get),
        "--gets-per-batch", str(gets_per_batch), "--duration", str(duration),
        "--max-batches", str(max_batches),
    ]  # fmt: skip
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(processes)]
    total = Totals()
    for p in procs:
        try:
            out, err = p.communicate(timeout=duration + 30.0)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, 9)
            out, err = p.communicate()
        lines = out.decode().strip().splitlines()
        if p.returncode != 0 or not lines:
            total += Totals(
                complete=False, failures=[f"pid {p.pid} exited {p.returncode}: {err.decode()[-500:]}"]
            )
        else:
            total += Totals.from_json(lines[-1])
    return total


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Loop pipelined multi-gets on one connection; print totals as JSON."
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--key-prefix", default="k")
    ap.add_argument("--nkeys", type=int, default=100)
    ap.add_argument("--keys-per-get", type=int, default=50)
    ap.add_argument("--gets-per-batch", type=int, default=8)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--max-batches", type=int, default=1_000_000)
    a = ap.parse_args(argv)
    ks = keys(a.key_prefix, a.nkeys)
    # Build each distinct batch once and cycle through them: building commands
    # in the loop would be the bottleneck, not the server.
    period = a.nkeys // math.gcd(a.nkeys, a.keys_per_get * a.gets_per_batch)
    batches = multiget_batches(ks, a.keys_per_get, a.gets_per_batch, min(period, 64))
    deadline = time.monotonic() + a.duration
    start = time.monotonic()
    totals = Totals(connections=1)
    try:
        with Connection(a.host, a.port) as conn:
            n = 0
            while n < a.max_batches and time.monotonic() < deadline:
                conn.batch(batches[n % len(batches)])
                n += 1
            totals = conn.totals
    except (OSError, LoadError) as e:
        totals.complete = False
        totals.failures.append(str(e))
    totals.elapsed_s = time.monotonic() - start
    print(totals.to_json(), flush=True)
    return 0 if totals.complete else 1


if __name__ == "__main__":
    sys.exit(main())
