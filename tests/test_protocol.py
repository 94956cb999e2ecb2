"""The memcached text protocol as kvcached speaks it: every command, pinned
with real clients (pymemcache) and, where a client library would hide the
wire, with raw transcripts (`>>>` sent, `<<<` expected).

Run the same file against Debian's memcached with
`KVPROF_TEST_AGAINST=memcached`: everything not marked `kvcached_only`
must pass there too, which is what shows these tests pin the protocol and
not kvcached's own habits.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheServerError
from support import Wire, wait_until

from kvprof.system.servers import Server

NONNUMERIC = b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
BAD_DELTA = b"CLIENT_ERROR invalid numeric delta argument\r\n"
TOO_LARGE = b"SERVER_ERROR object too large for cache\r\n"
THIRTY_DAYS = 2592000
MAX_U64 = 2**64 - 1

# What `stats` must report, by memcached's names (docs/kvcached.md, "Stats").
GENERAL_STATS = [
    "pid",
    "uptime",
    "time",
    "version",
    "pointer_size",
    "rusage_user",
    "rusage_system",
    "max_connections",
    "curr_connections",
    "total_connections",
    "rejected_connections",
    "cmd_get",
    "cmd_set",
    "cmd_flush",
    "cmd_touch",
    "get_hits",
    "get_misses",
    "get_expired",
    "get_flushed",
    "delete_hits",
    "delete_misses",
    "incr_hits",
    "incr_misses",
    "decr_hits",
    "decr_misses",
    "cas_hits",
    "cas_misses",
    "cas_badval",
    "touch_hits",
    "touch_misses",
    "bytes_read",
    "bytes_written",
    "limit_maxbytes",
    "threads",
    "bytes",
    "curr_items",
    "total_items",
    "evictions",
    "reclaimed",
    "expired_unfetched",
]


@contextlib.contextmanager
def memcache_client(server: Server) -> Iterator[Client]:
    """pymemcache connected to `server` for the block, then closed."""
    # pymemcache defaults to noreply for stores; the tests want every reply.
    c = Client((server.host, server.port), connect_timeout=5, timeout=5, default_noreply=False)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def client(kvcached: Server) -> Iterator[Client]:
    """pymemcache connected to the `kvcached` fixture's server."""
    with memcache_client(kvcached) as c:
        yield c


@pytest.fixture
def conn(kvcached: Server, wire: Callable[..., Wire]) -> Wire:
    """A raw connection to the `kvcached` fixture's server (its transcript kept for a failure)."""
    return wire(kvcached)


def counters(server: Server, *names: str) -> dict[str, int]:
    stats = server.stats()
    return {name: int(stats[name]) for name in names}


def deltas(before: dict[str, int], server: Server) -> dict[str, int]:
    after = counters(server, *before)
    return {name: after[name] - before[name] for name in before}


# --- retrieval -------------------------------------------------------------


def test_set_then_get_transcript(conn: Wire) -> None:
    """`set` answers STORED and `get` returns the value with its flags and length."""
    assert conn.call(b"set foo 5 0 3\r\nbar\r\n") == b"STORED\r\n"
    assert conn.call(b"get foo\r\n", b"END\r\n") == b"VALUE foo 5 3\r\nbar\r\nEND\r\n"


def test_get_miss_is_bare_end(conn: Wire) -> None:
    """A `get` of a missing key answers END alone."""
    assert conn.call(b"get nothing-here\r\n") == b"END\r\n"


def test_flags_are_32_bit_and_returned_verbatim(conn: Wire) -> None:
    """Client flags round-trip unchanged up to 2^32-1."""
    assert conn.call(b"set f 4294967295 0 1\r\nx\r\n") == b"STORED\r\n"
    assert conn.values(b"get f\r\n")[0].flags == 4294967295


def test_multi_get_returns_hits_in_request_order(conn: Wire) -> None:
    """A multi-key `get` returns one VALUE per hit, in request order, and skips misses."""
    for key in (b"a", b"b", b"c"):
        assert conn.call(b"set %s 0 0 2\r\nv%s\r\n" % (key, key)) == b"STORED\r\n"
    found = conn.values(b"get c miss1 a miss2 b\r\n")
    assert [(v.key, v.data) for v in found] == [(b"c", b"vc"), (b"a", b"va"), (b"b", b"vb")]


def test_multi_get_with_pymemcache(client: Client) -> None:
    """pymemcache's get_many sees hits only, misses left out."""
    client.set_many({"k1": b"one", "k2": b"two"})
    assert client.get_many(["k1", "nope", "k2", "nope2"]) == {"k1": b"one", "k2": b"two"}


def test_get_duplicate_keys_returns_one_value_per_mention(conn: Wire) -> None:
    """A key named twice in one `get` is returned twice."""
    assert conn.call(b"set a 0 0 1\r\nx\r\n") == b"STORED\r\n"
    assert conn.call(b"get a a b\r\n", b"END\r\n") == b"VALUE a 0 1\r\nx\r\nVALUE a 0 1\r\nx\r\nEND\r\n"


def test_gets_cas_unique_is_stable_until_the_item_changes(conn: Wire) -> None:
    """`gets` returns a cas unique that stays the same on re-read and changes on every store."""
    conn.call(b"set a 0 0 1\r\nx\r\n")
    conn.call(b"set b 0 0 1\r\ny\r\n")
    first = {v.key: v.cas for v in conn.values(b"gets a b\r\n")}
    assert set(first) == {b"a", b"b"} and None not in first.values()
    assert first[b"a"] != first[b"b"]
    assert conn.values(b"gets a\r\n")[0].cas == first[b"a"]
    conn.call(b"set a 0 0 1\r\nz\r\n")
    again = conn.values(b"gets a\r\n")[0]
    assert again.data == b"z" and again.cas != first[b"a"]
    conn.call(b"append a 0 0 1\r\n!\r\n")
    assert conn.values(b"gets a\r\n")[0].cas not in (first[b"a"], again.cas)


def test_gat_returns_value_and_gats_its_cas(conn: Wire) -> None:
    """`gat`/`gats` return the value (gats with the same cas as gets); a miss is END."""
    conn.call(b"set k 3 0 5\r\nhello\r\n")
    cas = conn.values(b"gets k\r\n")[0].cas
    assert conn.call(b"gat 100 k\r\n", b"END\r\n") == b"VALUE k 3 5\r\nhello\r\nEND\r\n"
    [value] = conn.values(b"gats 100 k\r\n")
    assert (value.data, value.flags, value.cas) == (b"hello", 3, cas)
    assert conn.call(b"gat 100 missing\r\n") == b"END\r\n"
    assert [v.key for v in conn.values(b"gat 100 missing k\r\n")] == [b"k"]


def test_gat_extends_ttl(conn: Wire) -> None:
    """`gat` sets a new expiry: an item about to expire survives past its old TTL."""
    conn.call(b"set kept 0 1 1\r\nx\r\n")
    conn.call(b"set control 0 1 1\r\ny\r\n")
    assert [v.key for v in conn.values(b"gat 100 kept\r\n")] == [b"kept"]
    assert wait_until(lambda: conn.get(b"control") is None, timeout=4), "control key did not expire"
    assert conn.get(b"kept") == b"x"


# --- storage ---------------------------------------------------------------


def test_set_overwrites(client: Client) -> None:
    """`set` replaces an existing value and its flags."""
    assert client.set("k", b"one", flags=1)
    assert client.set("k", b"two!", flags=2)
    assert client.raw_command("get k", "END\r\n") == b"VALUE k 2 4\r\ntwo!\r\n"


def test_add_stores_only_missing_keys(conn: Wire) -> None:
    """`add` stores a missing key (STORED) and refuses an existing one (NOT_STORED)."""
    assert conn.call(b"add k 0 0 1\r\na\r\n") == b"STORED\r\n"
    assert conn.call(b"add k 0 0 1\r\nb\r\n") == b"NOT_STORED\r\n"
    assert conn.get(b"k") == b"a"


def test_replace_stores_only_existing_keys(conn: Wire) -> None:
    """`replace` refuses a missing key (NOT_STORED) and replaces an existing one."""
    assert conn.call(b"replace k 0 0 1\r\na\r\n") == b"NOT_STORED\r\n"
    assert conn.get(b"k") is None
    conn.call(b"set k 0 0 1\r\na\r\n")
    assert conn.call(b"replace k 7 0 1\r\nb\r\n") == b"STORED\r\n"
    assert conn.values(b"get k\r\n")[0][1:3] == (7, b"b")


def test_append_and_prepend_extend_the_value_and_keep_its_flags(conn: Wire) -> None:
    """`append`/`prepend` add bytes at either end, ignoring their own flags and TTL."""
    conn.call(b"set k 9 0 3\r\nmid\r\n")
    assert conn.call(b"append k 1 0 4\r\n-end\r\n") == b"STORED\r\n"
    assert conn.call(b"prepend k 2 0 6\r\nstart-\r\n") == b"STORED\r\n"
    [value] = conn.values(b"get k\r\n")
    assert (value.flags, value.data) == (9, b"start-mid-end")


def test_append_and_prepend_on_missing_key_are_not_stored(conn: Wire) -> None:
    """`append`/`prepend` to a missing key answer NOT_STORED and create nothing."""
    assert conn.call(b"append k 0 0 1\r\na\r\n") == b"NOT_STORED\r\n"
    assert conn.call(b"prepend k 0 0 1\r\na\r\n") == b"NOT_STORED\r\n"
    assert conn.get(b"k") is None


def test_cas_success(kvcached: Server, conn: Wire) -> None:
    """`cas` with the current unique stores (STORED) and counts a cas_hit."""
    conn.call(b"set k 0 0 3\r\nold\r\n")
    cas = conn.values(b"gets k\r\n")[0].cas
    before = counters(kvcached, "cas_hits", "cas_badval", "cas_misses")
    assert conn.call(b"cas k 0 0 3 %d\r\nnew\r\n" % cas) == b"STORED\r\n"
    assert conn.get(b"k") == b"new"
    assert deltas(before, kvcached) == {"cas_hits": 1, "cas_badval": 0, "cas_misses": 0}


def test_cas_conflict_is_exists(kvcached: Server, conn: Wire) -> None:
    """`cas` with a stale unique answers EXISTS, keeps the newer value, counts cas_badval."""
    conn.call(b"set k 0 0 3\r\nold\r\n")
    cas = conn.values(b"gets k\r\n")[0].cas
    conn.call(b"set k 0 0 5\r\nnewer\r\n")
    before = counters(kvcached, "cas_hits", "cas_badval", "cas_misses")
    assert conn.call(b"cas k 0 0 4 %d\r\nlost\r\n" % cas) == b"EXISTS\r\n"
    assert conn.get(b"k") == b"newer"
    assert deltas(before, kvcached) == {"cas_hits": 0, "cas_badval": 1, "cas_misses": 0}


def test_cas_on_missing_key_is_not_found(kvcached: Server, conn: Wire) -> None:
    """`cas` on a missing key answers NOT_FOUND, stores nothing, counts cas_misses."""
    before = counters(kvcached, "cas_hits", "cas_badval", "cas_misses")
    assert conn.call(b"cas ghost 0 0 1 12345\r\nx\r\n") == b"NOT_FOUND\r\n"
    assert conn.get(b"ghost") is None
    assert deltas(before, kvcached) == {"cas_hits": 0, "cas_badval": 0, "cas_misses": 1}


def test_cas_with_pymemcache(client: Client) -> None:
    """pymemcache's gets/cas cycle: True on success, False on conflict, None when missing."""
    client.set("k", b"v1")
    _, cas = client.gets("k")
    assert client.cas("k", b"v2", cas) is True
    assert client.cas("k", b"v3", cas) is False
    assert client.get("k") == b"v2"
    assert client.cas("missing", b"x", cas) is None


def test_delete_hit_and_miss(kvcached: Server, conn: Wire) -> None:
    """`delete` answers DELETED for a stored key and NOT_FOUND after, counted in stats."""
    conn.call(b"set k 0 0 1\r\nx\r\n")
    before = counters(kvcached, "delete_hits", "delete_misses", "curr_items")
    assert conn.call(b"delete k\r\n") == b"DELETED\r\n"
    assert conn.call(b"delete k\r\n") == b"NOT_FOUND\r\n"
    assert conn.get(b"k") is None
    assert deltas(before, kvcached) == {"delete_hits": 1, "delete_misses": 1, "curr_items": -1}


# --- incr / decr -----------------------------------------------------------


def test_incr_decr_basic(conn: Wire) -> None:
    """`incr`/`decr` answer the new value and store it; a longer result is stored whole."""
    conn.call(b"set n 0 0 2\r\n10\r\n")
    assert conn.call(b"incr n 5\r\n") == b"15\r\n"
    assert conn.call(b"decr n 3\r\n") == b"12\r\n"
    assert conn.get(b"n") == b"12"
    assert conn.call(b"incr n 88\r\n") == b"100\r\n"
    assert conn.get(b"n") == b"100"
    assert conn.call(b"incr n 0\r\n") == b"100\r\n"


def test_incr_decr_with_pymemcache_and_stats(kvcached: Server, client: Client) -> None:
    """pymemcache incr/decr return ints, None on a missing key; hits and misses are counted."""
    client.set("n", b"7")
    before = counters(kvcached, "incr_hits", "incr_misses", "decr_hits", "decr_misses")
    assert client.incr("n", 3) == 10
    assert client.decr("n", 4) == 6
    assert client.incr("missing", 1) is None
    assert client.decr("missing", 1) is None
    assert deltas(before, kvcached) == {"incr_hits": 1, "incr_misses": 1, "decr_hits": 1, "decr_misses": 1}


def test_incr_on_missing_key_is_not_found(conn: Wire) -> None:
    """`incr`/`decr` of a missing key answer NOT_FOUND and create nothing."""
    assert conn.call(b"incr nope 1\r\n") == b"NOT_FOUND\r\n"
    assert conn.call(b"decr nope 1\r\n") == b"NOT_FOUND\r\n"
    assert conn.get(b"nope") is None


@pytest.mark.parametrize("value", [b"abc", b"12a", b"-5", b""])
def test_incr_non_numeric_value(conn: Wire, value: bytes) -> None:
    """`incr`/`decr` of a value that is not a decimal u64 is a CLIENT_ERROR; the value is kept."""
    conn.call(b"set s 0 0 %d\r\n%s\r\n" % (len(value), value))
    assert conn.call(b"incr s 1\r\n") == NONNUMERIC
    assert conn.call(b"decr s 1\r\n") == NONNUMERIC
    assert conn.get(b"s") == value


@pytest.mark.parametrize("delta", [b"abc", b"-1", b"1x", b"18446744073709551616"])
def test_incr_invalid_delta(conn: Wire, delta: bytes) -> None:
    """A delta that is not a decimal u64 is `CLIENT_ERROR invalid numeric delta argument`."""
    conn.call(b"set n 0 0 1\r\n5\r\n")
    assert conn.call(b"incr n %s\r\n" % delta) == BAD_DELTA
    assert conn.call(b"decr n %s\r\n" % delta) == BAD_DELTA
    assert conn.get(b"n") == b"5"


def test_incr_wraps_at_2_64(conn: Wire) -> None:
    """`incr` is u64 arithmetic: 18446744073709551615 + 1 is 0, + 2 is 1."""
    top = b"%d" % MAX_U64
    conn.call(b"set n 0 0 20\r\n%s\r\n" % top)
    assert conn.call(b"incr n 1\r\n") == b"0\r\n"
    assert int(conn.get(b"n") or b"x") == 0
    conn.call(b"set n 0 0 20\r\n%s\r\n" % top)
    assert conn.call(b"incr n 2\r\n") == b"1\r\n"
    conn.call(b"set n 0 0 20\r\n%s\r\n" % (b"%d" % (MAX_U64 - 1)))
    assert conn.call(b"incr n 1\r\n") == top + b"\r\n"


def test_decr_stops_at_zero(conn: Wire) -> None:
    """`decr` below zero gives 0, not a wrapped number."""
    conn.call(b"set n 0 0 1\r\n5\r\n")
    assert conn.call(b"decr n 10\r\n") == b"0\r\n"
    assert conn.call(b"decr n 1\r\n") == b"0\r\n"
    assert int(conn.get(b"n") or b"x") == 0


def test_decr_shorter_result_reads_back_as_the_number(conn: Wire) -> None:
    """`decr` 100 -> 99 answers 99 and a later `get` parses as 99."""
    conn.call(b"set n 0 0 3\r\n100\r\n")
    assert conn.call(b"decr n 1\r\n") == b"99\r\n"
    assert int(conn.get(b"n") or b"x") == 99


@pytest.mark.kvcached_only("memcached rewrites a shorter result in place, padded with spaces ('99 ')")
def test_decr_shorter_result_has_no_padding(kvcached: Server, conn: Wire) -> None:
    """kvcached stores a shorter incr/decr result without padding: 100 - 1 reads back as `99`."""
    conn.call(b"set n 0 0 3\r\n100\r\n")
    assert conn.call(b"decr n 1\r\n") == b"99\r\n"
    assert conn.call(b"get n\r\n", b"END\r\n") == b"VALUE n 0 2\r\n99\r\nEND\r\n"
    conn.call(b"set n 0 0 20\r\n%d\r\n" % MAX_U64)
    assert conn.call(b"incr n 1\r\n") == b"0\r\n"
    assert conn.get(b"n") == b"0"


# --- touch, expiry ---------------------------------------------------------


def test_touch_hit_and_miss(kvcached: Server, conn: Wire) -> None:
    """`touch` answers TOUCHED for a stored key, NOT_FOUND otherwise, counted in stats."""
    conn.call(b"set k 0 0 1\r\nx\r\n")
    before = counters(kvcached, "cmd_touch", "touch_hits", "touch_misses")
    assert conn.call(b"touch k 100\r\n") == b"TOUCHED\r\n"
    assert conn.call(b"touch nope 100\r\n") == b"NOT_FOUND\r\n"
    assert conn.get(b"k") == b"x"
    assert deltas(before, kvcached) == {"cmd_touch": 2, "touch_hits": 1, "touch_misses": 1}


def test_touch_extends_ttl(conn: Wire) -> None:
    """`touch` sets a new expiry: a 1 s item touched to 100 s outlives an untouched one."""
    conn.call(b"set kept 0 1 1\r\nx\r\n")
    conn.call(b"set control 0 1 1\r\ny\r\n")
    assert conn.call(b"touch kept 100\r\n") == b"TOUCHED\r\n"
    assert wait_until(lambda: conn.get(b"control") is None, timeout=4), "control key did not expire"
    assert conn.get(b"kept") == b"x"


def test_touch_with_negative_ttl_expires_at_once(conn: Wire) -> None:
    """`touch k -1` answers TOUCHED and the item is gone right away."""
    conn.call(b"set k 0 0 1\r\nx\r\n")
    assert conn.call(b"touch k -1\r\n") == b"TOUCHED\r\n"
    assert conn.get(b"k") is None


def test_short_ttl_expires(kvcached: Server, client: Client) -> None:
    """An item set with a 1 s TTL is there at once and gone within ~2 s."""
    assert client.set("short", b"v", expire=1)
    assert client.get("short") == b"v"
    start = time.monotonic()
    assert wait_until(lambda: client.get("short") is None, timeout=4), "1 s item still there after 4 s"
    assert time.monotonic() - start <= 2.5


def test_negative_ttl_expires_at_once(conn: Wire) -> None:
    """A negative exptime stores (STORED) an item that is already expired."""
    conn.call(b"set k 0 0 3\r\nold\r\n")
    assert conn.call(b"set k 0 -1 3\r\nnew\r\n") == b"STORED\r\n"
    assert conn.get(b"k") is None


@pytest.mark.parametrize(
    ("exptime", "present"),
    [
        (lambda now: now + 100, True),
        (lambda now: now - 100, False),
        (lambda now: THIRTY_DAYS + 1, False),
    ],
    ids=["now+100", "now-100", "30days+1s-is-1970"],
)
def test_ttl_over_30_days_is_absolute_unix_time(
    kvcached: Server, wire, exptime: Callable[[int], int], present: bool
) -> None:
    """An exptime over 30 days is a Unix time: in the future the item lives, in the past it is gone."""
    w = wire(kvcached)
    when = exptime(int(time.time()))
    assert w.call(b"set k 0 %d 1\r\nx\r\n" % when) == b"STORED\r\n"
    assert (w.get(b"k") == b"x") is present


def test_ttl_of_exactly_30_days_is_relative(conn: Wire) -> None:
    """An exptime of exactly 2592000 is still relative (30 days from now), not 1970."""
    assert conn.call(b"set k 0 %d 1\r\nx\r\n" % THIRTY_DAYS) == b"STORED\r\n"
    assert conn.get(b"k") == b"x"


# --- flush_all -------------------------------------------------------------


def test_flush_all_immediate(kvcached: Server, conn: Wire) -> None:
    """`flush_all` answers OK and invalidates every item; later stores work."""
    for i in range(10):
        conn.call(b"set k%d 0 0 1\r\nx\r\n" % i)
    before = counters(kvcached, "cmd_flush")
    assert conn.call(b"flush_all\r\n") == b"OK\r\n"
    assert conn.values(b"get " + b" ".join(b"k%d" % i for i in range(10)) + b"\r\n") == []
    assert deltas(before, kvcached) == {"cmd_flush": 1}
    assert conn.call(b"set k0 0 0 1\r\ny\r\n") == b"STORED\r\n"
    assert conn.get(b"k0") == b"y"


def test_flush_all_with_delay(conn: Wire) -> None:
    """`flush_all 2` answers OK, leaves items readable until the delay passes, then they are gone."""
    conn.call(b"set a 0 0 1\r\nx\r\n")
    conn.call(b"set b 0 0 1\r\ny\r\n")
    assert conn.call(b"flush_all 2\r\n") == b"OK\r\n"
    assert conn.get(b"a") == b"x" and conn.get(b"b") == b"y"
    start = time.monotonic()
    assert wait_until(lambda: conn.get(b"a") is None, timeout=5), "items still there 5 s after `flush_all 2`"
    assert time.monotonic() - start <= 3.5
    assert conn.get(b"b") is None


def test_flush_all_noreply(conn: Wire) -> None:
    """`flush_all noreply` sends nothing back and still flushes."""
    conn.call(b"set a 0 0 1\r\nx\r\n")
    conn.send(b"flush_all noreply\r\n")
    assert conn.call(b"get a\r\n") == b"END\r\n"


def test_flush_all_with_pymemcache(client: Client) -> None:
    """pymemcache's flush_all returns True and empties the cache."""
    client.set("a", b"x")
    assert client.flush_all() is True
    assert client.get("a") is None


# --- version, verbosity, quit, unknown -------------------------------------


def test_version(conn: Wire, client: Client) -> None:
    """`version` answers `VERSION <one token>`, the same string `stats` and pymemcache report."""
    reply = conn.call(b"version\r\n")
    # Clients split on whitespace: pymemcache's stats() keeps only the
    # first word of `STAT version ...`, so a version with a space in it
    # reads differently through `version` and `stats`.
    assert re.fullmatch(rb"VERSION \S+\r\n", reply), reply
    version = reply[len(b"VERSION ") : -2]
    assert client.version() == version
    assert client.stats()[b"version"] == version


def test_verbosity(conn: Wire) -> None:
    """`verbosity N` answers OK; with noreply it answers nothing."""
    assert conn.call(b"verbosity 1\r\n") == b"OK\r\n"
    assert conn.call(b"verbosity 0\r\n") == b"OK\r\n"
    conn.send(b"verbosity 0 noreply\r\n")
    assert conn.call(b"version\r\n").startswith(b"VERSION ")


def test_quit_closes_the_connection(kvcached: Server, wire) -> None:
    """`quit` closes the connection without a reply; the server keeps serving others."""
    w = wire(kvcached)
    w.send(b"quit\r\n")
    assert w.closed_by_peer(timeout=5)
    assert w.buf == b""
    assert wire(kvcached).call(b"version\r\n").startswith(b"VERSION ")


def test_unknown_command_is_error(conn: Wire) -> None:
    """An unknown command answers ERROR and the connection stays usable."""
    assert conn.call(b"bogus a b c\r\n") == b"ERROR\r\n"
    assert conn.call(b"version\r\n").startswith(b"VERSION ")


def test_bare_newline_terminated_commands_are_accepted(conn: Wire) -> None:
    """Commands ended by a bare \\n (as telnet users type them) are understood."""
    assert conn.call(b"set k 0 0 1\nx\r\n") == b"STORED\r\n"
    assert conn.call(b"get k\n", b"END\r\n") == b"VALUE k 0 1\r\nx\r\nEND\r\n"


# --- noreply ---------------------------------------------------------------

K_IS_A, K_IS_5 = b"set k 0 0 1\r\na\r\n", b"set k 0 0 1\r\n5\r\n"  # set-ups: k holds "a", "5"
# (name, set-up commands, the noreply command, value of "k" afterwards)
NOREPLY = [
    ("set", b"", b"set k 0 0 1 noreply\r\nx\r\n", b"x"),
    ("add", b"", b"add k 0 0 1 noreply\r\nx\r\n", b"x"),
    ("add-refused", K_IS_A, b"add k 0 0 1 noreply\r\nx\r\n", b"a"),
    ("replace", K_IS_A, b"replace k 0 0 1 noreply\r\nx\r\n", b"x"),
    ("replace-refused", b"", b"replace k 0 0 1 noreply\r\nx\r\n", None),
    ("append", K_IS_A, b"append k 0 0 1 noreply\r\nb\r\n", b"ab"),
    ("prepend", K_IS_A, b"prepend k 0 0 1 noreply\r\nb\r\n", b"ba"),
    ("cas", K_IS_A, b"cas k 0 0 1 {cas} noreply\r\nx\r\n", b"x"),
    ("cas-exists", K_IS_A, b"cas k 0 0 1 {stale} noreply\r\nx\r\n", b"a"),
    ("cas-not-found", b"", b"cas k 0 0 1 1 noreply\r\nx\r\n", None),
    ("delete", K_IS_A, b"delete k noreply\r\n", None),
    ("delete-miss", b"", b"delete k noreply\r\n", None),
    ("incr", K_IS_5, b"incr k 2 noreply\r\n", b"7"),
    ("incr-miss", b"", b"incr k 2 noreply\r\n", None),
    ("decr", K_IS_5, b"decr k 2 noreply\r\n", b"3"),
    ("touch", K_IS_A, b"touch k 100 noreply\r\n", b"a"),
    ("touch-miss", b"", b"touch k 100 noreply\r\n", None),
    ("flush_all", K_IS_A, b"flush_all noreply\r\n", None),
    ("flush_all-0", K_IS_A, b"flush_all 0 noreply\r\n", None),
    ("verbosity", K_IS_A, b"verbosity 1 noreply\r\n", b"a"),
]


@pytest.mark.parametrize(
    ("setup", "command", "expected"), [c[1:] for c in NOREPLY], ids=[c[0] for c in NOREPLY]
)
def test_noreply(conn: Wire, setup: bytes, command: bytes, expected: bytes | None) -> None:
    """With `noreply` a command answers nothing, even on failure: the next reply is the next command's."""
    if setup:
        assert conn.call(setup) == b"STORED\r\n"
    if b"{cas}" in command or b"{stale}" in command:
        cas = conn.values(b"gets k\r\n")[0].cas
        assert cas is not None
        command = command.replace(b"{cas}", b"%d" % cas).replace(b"{stale}", b"%d" % (cas + 1000))
    conn.send(command)
    # `get` reads VALUE/END strictly: a stray reply to the noreply command would fail here.
    found = conn.values(b"get k\r\n")
    assert [v.data for v in found] == ([] if expected is None else [expected])


def test_noreply_pipeline_of_many_sets(conn: Wire) -> None:
    """A pipeline of 500 noreply sets then one get: the get's reply is the only bytes read."""
    conn.send(b"".join(b"set k%d 0 0 4 noreply\r\nv%03d\r\n" % (i, i) for i in range(500)))
    found = conn.values(b"get k0 k250 k499\r\n")
    assert [v.data for v in found] == [b"v000", b"v250", b"v499"]
    assert conn.pending(0.1) == b""


# --- stats -----------------------------------------------------------------


def test_stats_general_names_and_values(kvcached: Server, wire) -> None:
    """`stats` reports memcached's general names with values that describe this server."""
    w = wire(kvcached)
    raw = w.call(b"stats\r\n", b"END\r\n")
    lines = raw.split(b"\r\n")[:-2]
    assert all(re.fullmatch(rb"STAT \S+ \S.*", line) for line in lines), raw
    stats = kvcached.stats()
    missing = [name for name in GENERAL_STATS if name not in stats]
    assert not missing, f"missing stats: {missing}"
    assert int(stats["pid"]) == kvcached.pid
    assert abs(int(stats["time"]) - time.time()) <= 5
    assert 0 <= int(stats["uptime"]) <= 60
    assert int(stats["pointer_size"]) in (32, 64)
    assert float(stats["rusage_user"]) >= 0 and float(stats["rusage_system"]) >= 0
    assert int(stats["threads"]) == 2
    assert int(stats["limit_maxbytes"]) == 64 * 1024 * 1024
    assert int(stats["curr_connections"]) >= 2  # `w` and the stats connection itself
    assert int(stats["total_connections"]) >= int(stats["curr_connections"])
    for name in GENERAL_STATS:
        if name not in ("version", "rusage_user", "rusage_system"):
            assert int(stats[name]) >= 0, (name, stats[name])
    assert int(stats["curr_items"]) == 0 and int(stats["bytes"]) == 0


@pytest.mark.kvcached_only(
    "kvcached's own counters; max_connections is -c itself (memcached adds its reserved fds)"
)
def test_stats_general_kvcached_names(kvcached_factory: Callable[..., Server], wire) -> None:
    """kvcached adds item_objects, mem_accounted and probe_sample (0: paced, the default); idle, they
    equal curr_items and bytes."""
    server = kvcached_factory("-t", "2", "-c", "100")
    w = wire(server)
    for i in range(20):
        w.call(b"set k%d 0 0 10\r\n0123456789\r\n" % i)
    stats = server.stats()
    assert int(stats["max_connections"]) == 100
    assert int(stats["probe_sample"]) == 0
    assert int(stats["item_objects"]) == int(stats["curr_items"]) == 20
    assert int(stats["mem_accounted"]) == int(stats["bytes"]) > 20 * 10


def test_stats_settings(kvcached_factory: Callable[..., Server]) -> None:
    """`stats settings` reports the limits and threads the server was started with."""
    server = kvcached_factory("-t", "3", "-m", "32", "-I", "512k")
    settings = server.stats("settings")
    assert int(settings["maxbytes"]) == 32 * 1024 * 1024
    assert int(settings["num_threads"]) == 3
    assert int(settings["item_size_max"]) == 512 * 1024
    assert int(settings["tcpport"]) == server.port
    assert int(settings["maxconns"]) > 0
    assert settings["evictions"] == "on"
    assert "verbosity" in settings


@pytest.mark.kvcached_only("memcached names the address `inter` and has no presets or sites")
def test_stats_settings_kvcached_names(kvcached_factory: Callable[..., Server]) -> None:
    """kvcached's `stats settings` adds interface, preset, the probes' sampling and each site's mode."""
    server = kvcached_factory(
        "-t", "2", "-c", "50", "--preset", "fixed", "--probe-sample", "8", "--probe-rate", "99"
    )
    settings = server.stats("settings")
    assert settings["interface"] == "127.0.0.1"
    assert int(settings["maxconns"]) == 50
    assert settings["preset"] == "fixed"
    assert int(settings["probe_sample"]) == 8
    assert int(settings["probe_rate"]) == 99 and int(settings["lock_sample"]) == 0
    for site in ("collect_timings", "update_topkeys", "on_create_item", "on_delete_item", "account_memory"):
        assert settings[site] == "per-thread", site


@pytest.mark.kvcached_only("memcached has no contention sites to switch")
def test_site_switches_a_site_while_it_serves_and_keeps_counts_exact(
    kvcached_factory: Callable[..., Server],
) -> None:
    """`site FUNCTION|all shared|per-thread` switches a site at run time (`stats settings`
    shows it, `preset` follows); the counters summed over both designs stay exact across
    a switch; a bad site or mode is a CLIENT_ERROR that changes nothing."""
    server = kvcached_factory("-t", "2", "--preset", "baseline")
    wire = Wire(server)
    try:
        for i in range(10):
            assert wire.call(f"set k{i} 0 0 1\r\nx\r\n".encode()) == b"STORED\r\n"
        assert wire.call(b"site on_create_item per-thread\r\n") == b"OK\r\n"
        settings = server.stats("settings")
        assert settings["on_create_item"] == settings["on_delete_item"] == "per-thread"
        assert settings["update_topkeys"] == "shared" and settings["preset"] == "custom"
        for i in range(10, 15):
            assert wire.call(f"set k{i} 0 0 1\r\nx\r\n".encode()) == b"STORED\r\n"
        for i in range(3):  # created under the shared counter, deleted under the per-thread one
            assert wire.call(f"delete k{i}\r\n".encode()) == b"DELETED\r\n"
        assert int(server.stats()["item_objects"]) == 12
        assert wire.call(b"site topkeys per-thread\r\n") == b"OK\r\n"  # its flag's name
        assert server.stats("settings")["update_topkeys"] == "per-thread"
        assert wire.call(b"site all per-thread\r\n") == b"OK\r\n"
        assert server.stats("settings")["preset"] == "fixed"
        assert wire.call(b"site all shared\r\n") == b"OK\r\n"
        assert wire.call(b"delete k3\r\n") == b"DELETED\r\n"
        assert int(server.stats()["item_objects"]) == 11
        assert server.stats("settings")["preset"] == "baseline"
        unknown = wire.call(b"site nope shared\r\n")
        assert unknown.startswith(b"CLIENT_ERROR unknown site: collect_timings (--timings), ")
        assert wire.call(b"site all sideways\r\n") == b"CLIENT_ERROR mode must be shared or per-thread\r\n"
        assert wire.call(b"site all\r\n").startswith(b"CLIENT_ERROR usage: site ")
        assert server.stats("settings")["preset"] == "baseline"
        assert wire.call(b"get k4\r\n", b"END\r\n") == b"VALUE k4 0 1\r\nx\r\nEND\r\n"
    finally:
        wire.close()


def test_stats_items_per_class(kvcached: Server, client: Client) -> None:
    """`stats items` has number/age/evicted/reclaimed/outofmemory per class; numbers sum to curr_items."""
    client.set_many({f"small{i}": b"x" * 10 for i in range(30)})
    client.set_many({f"big{i}": b"y" * 5000 for i in range(7)})
    items = kvcached.stats("items")
    classes = {name.split(":")[1] for name in items if name.startswith("items:")}
    assert len(classes) >= 2, items
    for cls in classes:
        for field in ("number", "age", "evicted", "reclaimed", "outofmemory"):
            assert int(items[f"items:{cls}:{field}"]) >= 0, (cls, field)
    assert sum(int(items[f"items:{cls}:number"]) for cls in classes) == 37
    assert int(kvcached.stats()["curr_items"]) == 37


def test_stats_slabs_per_class(kvcached: Server, client: Client) -> None:
    """`stats slabs` describes each class in use with consistent chunk counts, then totals."""
    client.set_many({f"k{i}": b"z" * 3000 for i in range(40)})
    slabs = kvcached.stats("slabs")
    classes = {name.split(":")[0] for name in slabs if ":" in name}
    assert classes, slabs
    used = {}
    for cls in classes:
        size, total = int(slabs[f"{cls}:chunk_size"]), int(slabs[f"{cls}:total_chunks"])
        per_page, pages = int(slabs[f"{cls}:chunks_per_page"]), int(slabs[f"{cls}:total_pages"])
        in_use, free = int(slabs[f"{cls}:used_chunks"]), int(slabs[f"{cls}:free_chunks"])
        assert size > 0 and per_page > 0 and total == per_page * pages, (cls, slabs)
        assert in_use + free <= total
        used[size] = used.get(size, 0) + in_use
    # the 40 items sit in classes whose chunks can hold them
    assert sum(n for size, n in used.items() if size >= 3000) >= 40, used
    assert int(slabs["active_slabs"]) >= 1
    assert int(slabs["total_malloced"]) >= 40 * 3000


def test_stats_get_counters_count_keys(kvcached: Server, conn: Wire) -> None:
    """cmd_get grows by the keys requested (duplicates and misses too); get_hits + get_misses split it."""
    conn.call(b"set a 0 0 1\r\nx\r\n")
    conn.call(b"set b 0 0 1\r\ny\r\n")
    before = counters(kvcached, "cmd_get", "get_hits", "get_misses")
    conn.values(b"get a b miss1 a\r\n")
    conn.values(b"gets b miss2\r\n")
    conn.values(b"get miss3\r\n")
    assert deltas(before, kvcached) == {"cmd_get": 7, "get_hits": 4, "get_misses": 3}


def test_stats_store_counters(kvcached: Server, conn: Wire) -> None:
    """Each store counts in cmd_set; stored items show in curr_items/total_items and bytes."""
    before = counters(kvcached, "cmd_set", "curr_items", "total_items")
    for i in range(5):
        assert conn.call(b"set k%d 0 0 100\r\n%s\r\n" % (i, b"v" * 100)) == b"STORED\r\n"
    assert conn.call(b"set k0 0 0 100\r\n%s\r\n" % (b"w" * 100)) == b"STORED\r\n"
    assert deltas(before, kvcached) == {"cmd_set": 6, "curr_items": 5, "total_items": 6}
    assert int(kvcached.stats()["bytes"]) >= 5 * 100


def test_stats_bytes_read_and_written_grow(kvcached: Server, conn: Wire) -> None:
    """bytes_read and bytes_written grow by at least what this client sent and received."""
    before = counters(kvcached, "bytes_read", "bytes_written")
    request = b"set k 0 0 1000\r\n" + b"q" * 1000 + b"\r\n"
    conn.call(request)
    conn.values(b"get k\r\n")
    grown = deltas(before, kvcached)
    assert grown["bytes_read"] >= len(request) + len(b"get k\r\n")
    assert grown["bytes_written"] >= 1000


def test_stats_with_pymemcache(client: Client) -> None:
    """pymemcache parses `stats` and `stats settings` without error."""
    client.set("k", b"v")
    stats = client.stats()
    assert int(stats[b"curr_items"]) == 1
    assert int(client.stats("settings")[b"maxbytes"]) == 64 * 1024 * 1024


# --- sizes, eviction, bulk, binary -----------------------------------------


def test_values_up_to_the_item_size_limit_are_stored(kvcached_factory: Callable[..., Server], wire) -> None:
    """With `-I 128k`, values from 0 bytes to well inside 128 KiB are stored and read back intact."""
    server = kvcached_factory("-t", "2", "-I", "128k")
    w = wire(server)
    for size in (0, 1, 1000, 60000, 125000):
        value = bytes((i * 7 + size) % 256 for i in range(size))
        assert w.call(b"set k%d 0 0 %d\r\n%s\r\n" % (size, size, value)) == b"STORED\r\n", size
        assert w.get(b"k%d" % size) == value, size


@pytest.mark.kvcached_only("memcached's -I counts its item header and key too, so 128 KiB values do not fit")
def test_value_of_exactly_the_item_size_limit_is_stored(
    kvcached_factory: Callable[..., Server], wire
) -> None:
    """With `-I 128k`, a value of exactly 131072 bytes is STORED and one of 131073 is refused."""
    server = kvcached_factory("-t", "2", "-I", "128k")
    w = wire(server)
    value = bytes(range(256)) * 512
    assert w.call(b"set k 0 0 131072\r\n" + value + b"\r\n") == b"STORED\r\n"
    assert w.get(b"k") == value
    assert w.call(b"set k2 0 0 131073\r\n" + value + b"!\r\n") == TOO_LARGE
    assert w.get(b"k2") is None


def test_value_over_the_item_size_limit_is_refused(kvcached_factory: Callable[..., Server], wire) -> None:
    """One byte over `-I 128k` is `SERVER_ERROR object too large for cache`; the connection lives on."""
    server = kvcached_factory("-t", "2", "-I", "128k")
    w = wire(server)
    assert w.call(b"set before 0 0 6\r\nintact\r\n") == b"STORED\r\n"
    big = b"b" * (128 * 1024 + 1)
    assert w.call(b"set big 0 0 %d\r\n%s\r\n" % (len(big), big)) == TOO_LARGE
    # the data block was swallowed, not parsed as commands
    assert w.call(b"version\r\n").startswith(b"VERSION ")
    assert w.get(b"big") is None
    assert w.get(b"before") == b"intact"
    assert w.call(b"set after 0 0 2\r\nok\r\n") == b"STORED\r\n"


def test_value_over_the_limit_with_pymemcache(kvcached_factory: Callable[..., Server]) -> None:
    """pymemcache sees the too-large refusal as MemcacheServerError and its connection keeps working."""
    server = kvcached_factory("-t", "2", "-I", "128k")
    with memcache_client(server) as client:
        with pytest.raises(MemcacheServerError, match="object too large for cache"):
            client.set("big", b"x" * (128 * 1024 + 1))
        assert client.set("small", b"y")
        assert client.get("small") == b"y"


def test_eviction_under_a_small_memory_limit(
    kvcached_factory: Callable[..., Server], assert_rss_bounded: Callable[[Server, float], None]
) -> None:
    """With `-m 4`, 12 MB of 10 KB values evict old items (counted), keep recent ones, bound RSS."""
    server = kvcached_factory("-t", "2", "-m", "4")
    with memcache_client(server) as client:
        n = 1200
        value = lambda i: (b"%06d" % i) * (10_000 // 6)  # noqa: E731
        for i in range(n):
            assert client.set(f"k{i}", value(i)), f"set k{i} refused"
        stats = server.stats()
        assert int(stats["evictions"]) > 0
        assert int(stats["bytes"]) <= int(stats["limit_maxbytes"]) == 4 * 1024 * 1024
        assert int(stats["curr_items"]) < n
        recent = client.get_many([f"k{i}" for i in range(n - 50, n)])
        assert recent == {f"k{i}": value(i) for i in range(n - 50, n)}
        found = client.get_many([f"k{i}" for i in range(100)])
        assert len(found) < 100  # the oldest went first
        assert all(v == value(int(k[1:])) for k, v in found.items())
        items = server.stats("items")
        assert sum(int(v) for k, v in items.items() if k.endswith(":evicted")) == int(stats["evictions"])
        assert client.version()
        assert_rss_bounded(server, 4)


def test_full_cache_still_stores_values_of_other_sizes(kvcached_factory: Callable[..., Server]) -> None:
    """With `-m 4` full of 10 KB values, a store of any other size still evicts and succeeds."""
    server = kvcached_factory("-t", "2", "-m", "4")
    with memcache_client(server) as client:
        for i in range(1200):
            assert client.set(f"k{i}", b"v" * 10_000), f"set k{i} refused"
        refused = {}
        for size in (1, 100, 1000, 5000, 20_000, 100_000, 500_000):
            try:
                client.set(f"s{size}", b"s" * size)
            except MemcacheServerError as e:
                refused[size] = e.args[0]
                continue
            assert client.get(f"s{size}") == b"s" * size, size
        assert not refused, f"refused after the cache filled with 10 KB values: {refused}"
        assert int(server.stats()["evictions"]) > 0


def test_item_size_limit_above_one_megabyte(kvcached_factory: Callable[..., Server]) -> None:
    """With `-I 2m`, a 1.5 MB value round-trips intact and 2 MiB + 1 is refused as too large."""
    server = kvcached_factory("-t", "2", "-I", "2m")
    with memcache_client(server) as client:
        value = bytes(range(256)) * 6000
        assert client.set("x", value)
        assert client.get("x") == value
        with pytest.raises(MemcacheServerError, match="object too large for cache"):
            client.set("y", b"y" * (2 * 1024 * 1024 + 1))
        assert client.get("x") == value


def test_large_multi_get(conn: Wire) -> None:
    """One `get` of 100 keys x 10 KB returns all 100 values intact and in order."""
    values = {b"key%03d" % i: bytes([i]) * 5000 + (b"%05d" % i) * 1000 for i in range(100)}
    conn.send(b"".join(b"set %s 0 0 %d noreply\r\n%s\r\n" % (k, len(v), v) for k, v in values.items()))
    found = conn.values(b"get " + b" ".join(values) + b"\r\n")
    assert [v.key for v in found] == list(values)
    assert all(v.data == values[v.key] for v in found)


def test_binary_safe_values(conn: Wire, client: Client) -> None:
    """Values carry any bytes: all 256 byte values, NULs, and embedded CRLF/END/VALUE lines."""
    tricky = [
        bytes(range(256)) * 4,
        b"\x00" * 100,
        b"\r\n",
        b"line\r\nEND\r\nVALUE x 0 1\r\nx\r\n",
        b"\r\n\r\n\r",
        b"\n" * 50,
    ]
    for i, value in enumerate(tricky):
        assert conn.call(b"set bin%d 0 0 %d\r\n%s\r\n" % (i, len(value), value)) == b"STORED\r\n"
    found = conn.values(b"get " + b" ".join(b"bin%d" % i for i in range(len(tricky))) + b"\r\n")
    assert [v.data for v in found] == tricky
    assert client.get_many([f"bin{i}" for i in range(len(tricky))]) == {
        f"bin{i}": v for i, v in enumerate(tricky)
    }
    assert client.set("binpy", bytes(range(255, -1, -1)))
    assert conn.get(b"binpy") == bytes(range(255, -1, -1))


def test_250_byte_key_is_accepted(conn: Wire) -> None:
    """A key of exactly 250 bytes is stored and read back."""
    key = b"k" * 250
    assert conn.call(b"set %s 0 0 1\r\nx\r\n" % key) == b"STORED\r\n"
    assert conn.get(key) == b"x"


def test_many_clients_see_each_others_writes(kvcached: Server) -> None:
    """Eight connections (spread over the workers) share one cache."""
    with contextlib.ExitStack() as stack:
        clients = [stack.enter_context(memcache_client(kvcached)) for _ in range(8)]
        for i, c in enumerate(clients):
            assert c.set(f"from{i}", b"%d" % i)
        for c in clients:
            assert c.get_many([f"from{i}" for i in range(8)]) == {f"from{i}": b"%d" % i for i in range(8)}


# --- pipelining and framing ------------------------------------------------


def test_pipelined_mixed_commands_reply_in_order(conn: Wire) -> None:
    """Commands sent in one write are answered in order, one reply each."""
    conn.send(
        b"set a 0 0 1\r\n1\r\n"
        b"get a\r\n"
        b"incr a 41\r\n"
        b"add a 0 0 1\r\nx\r\n"
        b"gets nope\r\n"
        b"delete a\r\n"
        b"delete a\r\n"
        b"bogus\r\n"
        b"touch a 10\r\n"
        b"version\r\n"
    )
    expected = [
        b"STORED\r\n",
        b"VALUE a 0 1\r\n1\r\nEND\r\n",
        b"42\r\n",
        b"NOT_STORED\r\n",
        b"END\r\n",
        b"DELETED\r\n",
        b"NOT_FOUND\r\n",
        b"ERROR\r\n",
        b"NOT_FOUND\r\n",
    ]
    for reply in expected:
        assert conn.read_exactly(len(reply)) == reply
    assert conn.line().startswith(b"VERSION ")


def test_thousand_pipelined_gets(conn: Wire) -> None:
    """1000 `get`s in one write (well past one read buffer) get 1000 replies, in order."""
    for i in range(10):
        conn.call(b"set p%d 0 0 3\r\nv%02d\r\n" % (i, i))
    conn.send(b"".join(b"get p%d\r\n" % (i % 13) for i in range(1000)))
    for i in range(1000):
        n = i % 13
        expected = b"VALUE p%d 0 3\r\nv%02d\r\nEND\r\n" % (n, n) if n < 10 else b"END\r\n"
        assert conn.read_exactly(len(expected)) == expected, i


def test_command_dribbled_one_byte_at_a_time(conn: Wire) -> None:
    """A command and its data block arriving one byte per packet are understood as if sent at once."""
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one byte per segment
    for byte in b"set slow 3 0 5\r\nab\r\nc\r\nget slow\r\n":
        conn.sock.sendall(bytes([byte]))
        time.sleep(0.002)
    assert conn.read_until(b"END\r\n") == b"STORED\r\nVALUE slow 3 5\r\nab\r\nc\r\nEND\r\n"


def test_multi_get_of_2000_keys_in_one_line(conn: Wire) -> None:
    """A `get` naming 2000 keys (a ~15 KB line) answers every hit in order."""
    keys = [b"key-%04d" % i for i in range(2000)]
    conn.send(b"".join(b"set %s 0 0 4 noreply\r\n%s\r\n" % (k, k[-4:]) for k in keys[::2]))
    found = conn.values(b"get " + b" ".join(keys) + b"\r\n")
    assert [(v.key, v.data) for v in found] == [(k, k[-4:]) for k in keys[::2]]


def test_one_megabyte_value_under_default_limit(kvcached: Server, client: Client) -> None:
    """With the default `-I 1m`, a 1,000,000-byte value round-trips intact."""
    value = bytes(range(250)) * 4000
    assert client.set("mb", value)
    assert client.get("mb") == value


# --- concurrency -----------------------------------------------------------


def _in_threads(n: int, work: Callable[[int], None]) -> None:
    """Run work(0..n-1) in n threads; re-raise the first failure."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as e:  # handed to the test thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "worker threads still running after 60 s"
    if errors:
        raise errors[0]


def test_concurrent_incr_loses_no_update(kvcached: Server, client: Client) -> None:
    """8 clients x 300 `incr 1` on one key end at exactly 2400."""
    client.set("counter", b"0")

    def work(_: int) -> None:
        with memcache_client(kvcached) as c:
            for _ in range(300):
                assert c.incr("counter", 1) is not None

    _in_threads(8, work)
    assert client.get("counter") == b"2400"


def test_concurrent_cas_loses_no_update(kvcached: Server, client: Client) -> None:
    """8 clients doing gets/cas read-modify-write loops: the count equals the successful cas total."""
    client.set("n", b"0")
    wins = [0] * 8

    def work(i: int) -> None:
        with memcache_client(kvcached) as c:
            while wins[i] < 50:
                value, cas = c.gets("n")
                if c.cas("n", b"%d" % (int(value) + 1), cas):
                    wins[i] += 1

    _in_threads(8, work)
    assert client.get("n") == b"%d" % sum(wins) == b"400"


def test_concurrent_readers_never_see_torn_values(kvcached: Server, client: Client) -> None:
    """While writers swap a 100 KB value between all-'a' and all-'b', every read is one or the other."""
    a, b = b"a" * 100_000, b"b" * 100_000
    client.set("swap", a)
    stop = time.monotonic() + 1.5

    def work(i: int) -> None:
        with memcache_client(kvcached) as c:
            while time.monotonic() < stop:
                if i < 2:
                    assert c.set("swap", a if i == 0 else b)
                else:
                    assert c.get("swap") in (a, b), "torn read"

    _in_threads(6, work)
