"""A raw memcached text-protocol client for the tests: one connection, every
read bounded by a deadline, everything sent and received kept as a transcript
(the `wire` fixture attaches it to the report of a failing test).
"""

from __future__ import annotations

import socket
import time
from typing import NamedTuple

from kvprof.system.servers import Server

# the commands whose reply runs to an END line
MULTI_LINE = ("get", "gets", "gat", "gats", "stats")
ERRORS = (b"ERROR", b"CLIENT_ERROR", b"SERVER_ERROR")


class Value(NamedTuple):
    """One VALUE block of a retrieval reply."""

    key: bytes
    flags: int
    data: bytes
    cas: int | None


class Wire:
    """One raw text-protocol connection; every read is bounded by a deadline.

    Everything sent and received is kept as a transcript (`>>>` / `<<<`),
    attached to the report when the test fails.
    """

    def __init__(self, server: Server, timeout: float = 5.0) -> None:
        self.timeout = timeout
        self.sock = socket.create_connection((server.host, server.port), timeout=timeout)
        self.buf = b""
        self.log: list[tuple[str, bytes]] = []

    def send(self, data: bytes) -> None:
        self.log.append((">>>", data))
        self.sock.sendall(data)

    def send_until_closed(self, data: bytes, chunk: int = 16384) -> bool:
        """Send `data` in chunks; False when the server closed or reset the connection first."""
        self.log.append((">>>", data))
        try:
            for i in range(0, len(data), chunk):
                self.sock.sendall(data[i : i + chunk])
        except (BrokenPipeError, ConnectionResetError):
            self.log.append(("---", b"send failed: closed by server"))
            return False
        return True

    def _recv(self, deadline: float) -> bytes:
        """One recv before the deadline: b"" on EOF, TimeoutError after it."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no reply within {self.timeout} s; unread {self.buf[:200]!r}")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(1 << 20)
        except TimeoutError:
            raise TimeoutError(f"no reply within {self.timeout} s; unread {self.buf[:200]!r}") from None
        self.log.append(("<<<", chunk) if chunk else ("---", b"EOF"))
        return chunk

    def read_until(self, terminator: bytes, timeout: float | None = None) -> bytes:
        """Everything up to and including `terminator` (the rest stays buffered)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while (i := self.buf.find(terminator)) < 0:
            chunk = self._recv(deadline)
            if not chunk:
                raise ConnectionError(f"closed before {terminator!r}; unread {self.buf[:200]!r}")
            self.buf += chunk
        end = i + len(terminator)
        out, self.buf = self.buf[:end], self.buf[end:]
        return out

    def read_exactly(self, n: int, timeout: float | None = None) -> bytes:
        deadline = time.monotonic() + (timeout or self.timeout)
        while len(self.buf) < n:
            chunk = self._recv(deadline)
            if not chunk:
                raise ConnectionError(f"closed after {len(self.buf)} of {n} bytes")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def line(self, timeout: float | None = None) -> bytes:
        return self.read_until(b"\r\n", timeout)

    def call(self, data: bytes, terminator: bytes = b"\r\n") -> bytes:
        """Send `data`, return the reply up to `terminator`."""
        self.send(data)
        return self.read_until(terminator)

    def command(self, line: str, data: bytes | None = None) -> bytes:
        """Send one command line (and its data block) and return its whole reply: up to
        END for a retrieval or `stats`, else its one line; an error line ends either."""
        self.send(line.encode() + b"\r\n" + (b"" if data is None else data + b"\r\n"))
        multi = line.split()[0] in MULTI_LINE
        reply = b""
        while True:
            got = self.line()
            reply += got
            if not multi or got == b"END\r\n" or got.startswith(ERRORS):
                return reply
            parts = got.split()
            if parts[0] == b"VALUE" and len(parts) in (4, 5):
                reply += self.read_exactly(int(parts[3]) + 2)

    def values(self, command: bytes) -> list[Value]:
        """Send a retrieval command; parse its VALUE blocks by length up to END."""
        self.send(command)
        found = []
        while (line := self.line()) != b"END\r\n":
            parts = line.split()
            if not parts or parts[0] != b"VALUE" or len(parts) not in (4, 5):
                raise AssertionError(f"expected VALUE or END, got {line!r}")
            data = self.read_exactly(int(parts[3]) + 2)
            if not data.endswith(b"\r\n"):
                raise AssertionError(f"value of {parts[1]!r} not followed by CRLF: {data[-10:]!r}")
            cas = int(parts[4]) if len(parts) == 5 else None
            found.append(Value(parts[1], int(parts[2]), data[:-2], cas))
        return found

    def get(self, key: bytes) -> bytes | None:
        """The value stored under `key`, or None."""
        found = self.values(b"get " + key + b"\r\n")
        assert len(found) <= 1 and all(v.key == key for v in found), found
        return found[0].data if found else None

    def pending(self, wait: float = 0.2) -> bytes:
        """Whatever arrives within `wait` seconds (b"" when the server stays silent)."""
        deadline = time.monotonic() + wait
        try:
            while chunk := self._recv(deadline):
                self.buf += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        out, self.buf = self.buf, b""
        return out

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True when the server closes (or resets) the connection within `timeout`."""
        deadline = time.monotonic() + timeout
        try:
            while chunk := self._recv(deadline):
                self.buf += chunk
        except TimeoutError:
            return False
        except ConnectionResetError:
            self.log.append(("---", b"RST"))
        return True

    def drain(self, timeout: float = 5.0) -> bytes:
        """Half-close (the server sees EOF) and return all it sends until it closes."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # already reset by the server
        self.log.append(("---", b"SHUT_WR"))
        if not self.closed_by_peer(timeout):
            raise TimeoutError(f"connection still open {timeout} s after EOF; got {self.buf[:200]!r}")
        out, self.buf = self.buf, b""
        return out

    def close(self) -> None:
        self.sock.close()

    def transcript(self, limit: int = 200) -> str:
        lines = []
        for direction, data in self.log[-limit:]:
            shown = data if len(data) <= 300 else data[:300] + b"...(%d bytes)" % len(data)
            lines.append(f"{direction} {shown!r}")
        return "\n".join(lines)
