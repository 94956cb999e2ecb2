"""Where a process listens, and its own counters if it answers: memcached's
`stats` or Redis's `INFO`, whichever protocol the port speaks.

`kvprof record` keeps the target's own counters from before and after the
window (`stats`, `stats locks`, `stats settings`; for Redis `INFO` with its
`commandstats` and `latencystats` sections) next to what the probes saw:
they are the ground truth the collectors are checked against. The general
group of a Redis server holds `protocol: redis`.
"""

from __future__ import annotations

import os
import socket


class TargetError(RuntimeError):
    """A server could not be started or queried; the message says why."""


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


REDIS_SECTIONS = ("commandstats", "latencystats")


def _redis(host: str, port: int, timeout: float) -> dict[str, dict[str, str]]:
    """INFO (default sections) as "general", plus each of REDIS_SECTIONS the server has."""
    result = {"general": {"protocol": "redis", **redis_info(host, port, timeout=timeout)}}
    for section in REDIS_SECTIONS:
        try:
            values = redis_info(host, port, section, timeout=timeout)
        except (TargetError, OSError):
            continue
        if values:  # an older Redis answers an unknown section with nothing
            result[section] = values
    return result


def general_stats(host: str, port: int, timeout: float = 2.0) -> dict[str, str]:
    """The general counters of a memcached (`stats`) or Redis (`INFO`) port; TargetError if neither."""
    try:
        return {"protocol": "redis", **redis_info(host, port, timeout=timeout)}
    except (TargetError, OSError):
        pass
    return stats(host, port, None, timeout=timeout)


def ops_total(general: dict[str, str]) -> int | None:
    """Operations served so far: memcached's cmd_get + cmd_set, Redis's total_commands_processed."""
    try:
        if general.get("protocol") == "redis":
            return int(general["total_commands_processed"])
        return int(general["cmd_get"]) + int(general["cmd_set"])
    except (KeyError, ValueError):
        return None


DEFAULT_GROUPS = ("", "locks", "settings")  # what `kvprof record` keeps from before and after


def _port_stats(host: str, port: int, groups: tuple[str, ...], timeout: float) -> dict[str, dict[str, str]]:
    """One port's counters: Redis INFO (with REDIS_SECTIONS unless only the general group is
    asked for), or the memcached `stats` groups; {} when it speaks neither."""
    if groups == ("",):  # the general counters alone (a live view's, every second)
        try:
            return {"general": general_stats(host, port, timeout)}
        except (TargetError, OSError):
            return {}
    try:  # Redis first: memcached answers a stray INFO with ERROR at once
        return _redis(host, port, timeout=timeout)
    except (TargetError, OSError):
        pass
    result: dict[str, dict[str, str]] = {}
    for group in groups:
        try:
            result[group or "general"] = stats(host, port, group or None, timeout=timeout)
        except (TargetError, OSError):
            if not group:
                break  # not a memcached-protocol port
    return result


class TargetStats:
    """The counters of a process's first port that answers (Redis INFO or memcached
    `stats`); the port that answered is asked first next time."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._port: tuple[str, int] | None = None

    def read(
        self, groups: tuple[str, ...] = DEFAULT_GROUPS, timeout: float = 2.0
    ) -> dict[str, dict[str, str]]:
        """{"general": {...}, "locks": {...}, ...}; {} when no port answers."""
        ports = [self._port] if self._port else listening_ports(self.pid)
        for host, port in ports:
            result = _port_stats(host, port, groups, timeout)
            if result:
                self._port = (host, port)
                return result
        self._port = None
        return {}


def server_stats(pid: int, groups: tuple[str, ...] = DEFAULT_GROUPS) -> dict[str, dict[str, str]]:
    """The counters of the first port of `pid` that speaks Redis (INFO) or the memcached
    protocol (`stats` groups); {} if none."""
    return TargetStats(pid).read(groups)


def stats(host: str, port: int, group: str | None = None, timeout: float = 5.0) -> dict[str, str]:
    """`stats [group]` over the text protocol, as a dict of name -> value."""
    command = f"stats {group}\r\n" if group else "stats\r\n"
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(command.encode())
        data = b""
        while not data.endswith(b"END\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                raise TargetError(f"{host}:{port} closed the connection during `{command.strip()}`")
            data += chunk
            if data.startswith((b"ERROR", b"CLIENT_ERROR", b"SERVER_ERROR")):
                raise TargetError(f"{host}:{port} answered `{data.decode(errors='replace').strip()}`")
    result: dict[str, str] = {}
    for line in data.decode(errors="replace").split("\r\n"):
        if line.startswith("STAT "):
            _, name, *value = line.split(" ", 2)
            result[name] = value[0] if value else ""
    return result


def redis_info(host: str, port: int, section: str = "", timeout: float = 5.0) -> dict[str, str]:
    """Redis `INFO [section]` (inline command, RESP bulk reply), as a dict of name -> value;
    TargetError when the port does not answer as Redis does."""
    command = f"INFO {section}\r\n" if section else "INFO\r\n"
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(command.encode())
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                raise TargetError(f"{host}:{port} closed the connection during `{command.strip()}`")
            data += chunk
        head, _, body = data.partition(b"\r\n")
        if not head.startswith(b"$") or not head[1:].isdigit():
            raise TargetError(
                f"{host}:{port} is no Redis server (answered {head[:40].decode(errors='replace')!r})"
            )
        size = int(head[1:])
        while len(body) < size:
            chunk = s.recv(65536)
            if not chunk:
                raise TargetError(f"{host}:{port} closed the connection during `{command.strip()}`")
            body += chunk
    result: dict[str, str] = {}
    for line in body[:size].decode(errors="replace").split("\r\n"):
        if line and not line.startswith("#") and ":" in line:
            name, _, value = line.partition(":")
            result[name] = value
    return result
