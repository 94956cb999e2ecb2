"""Where a process listens, and its memcached-protocol `stats` if it answers.

`kvprof record` keeps the target's own counters from before and after the
window (`stats`, `stats locks`, `stats settings`) next to what the probes
saw: they are the ground truth the collectors are checked against.
"""

from __future__ import annotations

import os
import socket

from kvprof.target import TargetError, stats

_TCP_LISTEN = "0A"


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        pass
    return inodes


def listening_ports(pid: int) -> list[tuple[str, int]]:
    """(host to connect to, port) of the TCP sockets `pid` listens on."""
    inodes = _socket_inodes(pid)
    found: list[tuple[str, int]] = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) < 10 or cols[3] != _TCP_LISTEN or cols[9] not in inodes:
                continue
            addr_hex, port_hex = cols[1].split(":")
            port = int(port_hex, 16)
            if family == socket.AF_INET:
                addr = socket.inet_ntop(family, bytes.fromhex(addr_hex)[::-1])
                host = "127.0.0.1" if addr == "0.0.0.0" else addr
            else:
                raw = bytes.fromhex(addr_hex)
                addr = socket.inet_ntop(family, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
                host = "::1" if addr == "::" else addr
            found.append((host, port))
    return found


def server_stats(pid: int, groups: tuple[str, ...] = ("", "locks", "settings")) -> dict[str, dict[str, str]]:
    """`stats` groups from the first port of `pid` that speaks the memcached protocol; {} if none."""
    for host, port in listening_ports(pid):
        result: dict[str, dict[str, str]] = {}
        for group in groups:
            try:
                result[group or "general"] = stats(host, port, group or None, timeout=2.0)
            except (TargetError, OSError):
                if not group:
                    break  # not a memcached-protocol port
        if result:
            return result
    return {}
