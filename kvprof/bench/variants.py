"""What a benchmark measures: a server configuration x load-generator settings.

A server is named by a short spec: `baseline` or `fixed` (kvcached's presets),
either followed by `+SITE` for each contention site flipped away from the
preset (`baseline+topkeys` is the study's middle step: the top-keys mutex
gone, every shared atomic still there), or `memcached` (Debian's, as a peer).
"""

from __future__ import annotations

from dataclasses import dataclass

PRESETS = ("baseline", "fixed")
# kvcached's per-site flags, in the order of the study's story.
SITES = ("topkeys", "timings", "item-counter", "memory-counter")
KEY_COMPARES = ("inline", "indirect")  # kvcached --key-compare, its default first
SHARED, PER_THREAD = "shared", "per-thread"
KVCACHED, MEMCACHED = "kvcached", "memcached"
KVLOAD, MEMCASLAP = "kvload", "memcaslap"


@dataclass(frozen=True)
class ServerConfig:
    """One server process: kvcached with a preset and flipped sites, or memcached."""

    kind: str  # KVCACHED or MEMCACHED
    workers: int
    preset: str = ""  # kvcached only
    flipped: tuple[str, ...] = ()  # sites switched away from the preset's mode
    key_compare: str = ""  # kvcached --key-compare (inline / indirect); "": the server's default
    binary: str = ""  # a kvcached built elsewhere (kvprof bench --rev); "": the normal build
    revision: str = ""  # the git revision `binary` was built at, as the user named it
    commit: str = ""  # and its commit id
    load: str = ""  # the load it serves, where a plan runs one configuration under two (not a flag)

    @property
    def label(self) -> str:
        if self.kind == MEMCACHED:
            return MEMCACHED
        label = "+".join((self.preset, *self.flipped))
        label += f" {self.key_compare} keys" if self.key_compare else ""
        return label + (f" @{self.revision}" if self.revision else "")

    def site_modes(self) -> dict[str, str]:
        """Each kvcached site's mode (empty for memcached)."""
        if self.kind == MEMCACHED:
            return {}
        default = SHARED if self.preset == "baseline" else PER_THREAD
        other = PER_THREAD if default == SHARED else SHARED
        return {site: other if site in self.flipped else default for site in SITES}

    def args(self) -> list[str]:
        """The server's own flags (address and port are the starter's)."""
        if self.kind == MEMCACHED:
            return ["-t", str(self.workers)]
        modes = self.site_modes()
        flips = [arg for site in self.flipped for arg in (f"--{site}", modes[site])]
        keys = ["--key-compare", self.key_compare] if self.key_compare else []
        return ["--preset", self.preset, *flips, *keys, "-t", str(self.workers)]


def parse_server(spec: str, workers: int) -> ServerConfig:
    """`baseline`, `fixed+timings`, `memcached`, ... -> ServerConfig; ValueError says what is wrong."""
    if workers < 1:
        raise ValueError(f"worker threads must be >= 1, got {workers}")
    parts = [p.strip() for p in spec.strip().split("+")]
    if parts == [MEMCACHED]:
        return ServerConfig(MEMCACHED, workers)
    preset, sites = parts[0], parts[1:]
    if preset not in PRESETS:
        raise ValueError(f"{spec!r}: start with {', '.join(PRESETS)} or say {MEMCACHED}")
    for site in sites:
        if site not in SITES:
            raise ValueError(f"{spec!r}: unknown site {site!r} (sites: {', '.join(SITES)})")
    if len(set(sites)) != len(sites):
        raise ValueError(f"{spec!r}: a site is flipped twice")
    return ServerConfig(KVCACHED, workers, preset, tuple(sites))


@dataclass(frozen=True)
class ClientConfig:
    """Load-generator settings, in kvload's terms (connections are per client thread)."""

    tool: str = KVLOAD  # KVLOAD or MEMCASLAP
    threads: int = 1
    connections: int = 2
    batch: int = 100  # kvload: requests in flight per connection; memcaslap: keys per multi-get
    num_items: int = 10_000
    value_size: int = 32
    set_pct: int = 0
    key_dist: str = "uniform"

    @property
    def total_connections(self) -> int:
        return self.threads * self.connections

    @property
    def label(self) -> str:
        """Short, for variant names: `1x4 b100`."""
        return f"{self.threads}x{self.connections} b{self.batch}"

    def describe(self) -> str:
        """One line for the table's header."""
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        batch = "multi-get" if self.tool == MEMCASLAP else "batch"
        return (
            f"{self.tool} {threads} x {self.connections} conns, {batch} {self.batch}, "
            f"{self.set_pct} % sets, {self.value_size}-byte values, {self.num_items:,} keys"
        )


@dataclass(frozen=True)
class Variant:
    """One benchmark: a named server x client pair, in a group of comparable ones."""

    name: str
    group: str
    server: ServerConfig
    client: ClientConfig


@dataclass(frozen=True)
class Group:
    """Variants compared with each other; the first is the reference (ratio 1.0)."""

    title: str
    variants: tuple[Variant, ...]


@dataclass(frozen=True)
class Plan:
    """A scenario: groups of variants, run together."""

    scenario: str
    groups: tuple[Group, ...]
    target: float | None = None  # each group's last / first ratio should reach this
    target_means: str = ""  # what reaching the target shows

    @property
    def variants(self) -> list[Variant]:
        return [v for g in self.groups for v in g.variants]

    def servers(self) -> list[ServerConfig]:
        """Distinct server configurations, in first-use order (variants share equal ones)."""
        seen: dict[ServerConfig, None] = {}
        for v in self.variants:
            seen.setdefault(v.server)
        return list(seen)
