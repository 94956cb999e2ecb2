"""A Python cache client with one known hot loop, for the py-spy tests.

    python tests/programs/pyclient.py HOST:PORT SECONDS [THREADS]

Each thread (named `client-N`, one by default) calls
`hammer_kvcached_with_gets` in a loop: pymemcache multi-gets and a few sets
against the server, for SECONDS at most. The main thread waits for them with
a timed join, a futex wait that times out ten times a second, while the
clients wait for the server's replies in recv: the BPF off-CPU collector
sees both. Prints `ready` once the clients run and `ops N` at the end;
exits 0.
"""

from __future__ import annotations

import sys
import threading
import time

from pymemcache.client.base import Client

KEYS = [f"pykey-{i}" for i in range(64)]
VALUE_SIZE = 512
CHECK_PASSES = 4


def hammer_kvcached_with_gets(client: Client, rounds: int) -> int:
    """The hot function: the one the profile must show at the top, with its file:line.

    Besides the requests it checks every byte it read in a plain loop, CHECK_PASSES
    times, so most of its CPU time is its own: its self samples beat pymemcache's
    internals by a margin that load on the machine does not close (one pass does
    not: docs/python.md, "Tests")."""
    ops = 0
    checksum = 0
    for i in range(rounds):
        found = client.get_many(KEYS[i % 8 : i % 8 + 32])
        ops += 1 + len(found)
        for value in found.values():
            for _ in range(CHECK_PASSES):
                for byte in value:
                    checksum = (checksum * 31 + byte) & 0xFFFFFFFF
        if i % 16 == 0:
            client.set(KEYS[i % len(KEYS)], b"v" * VALUE_SIZE)
            ops += 1
    return ops if checksum >= 0 else -1


def worker(host: str, port: int, deadline: float, totals: list[int]) -> None:
    client = Client((host, port), connect_timeout=5, timeout=5, no_delay=True)
    ops = 0
    try:
        while time.monotonic() < deadline:
            ops += hammer_kvcached_with_gets(client, 50)
    finally:
        client.close()
        totals.append(ops)


def main() -> int:
    host, _, port = sys.argv[1].rpartition(":")
    seconds = float(sys.argv[2])
    nthreads = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    deadline = time.monotonic() + seconds
    probe = Client((host, int(port)), connect_timeout=5, timeout=5)
    for key in KEYS:
        probe.set(key, b"x" * VALUE_SIZE)
    probe.close()
    totals: list[int] = []
    threads = [
        threading.Thread(target=worker, args=(host, int(port), deadline, totals), name=f"client-{n}")
        for n in range(nthreads)
    ]
    for t in threads:
        t.start()
    print("ready", flush=True)
    for t in threads:
        while t.is_alive():
            t.join(0.1)
    print(f"ops {sum(totals)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
