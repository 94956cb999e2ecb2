"""CPU topology (cpu -> core -> socket -> NUMA node) from sysfs.

The root is overridable so tests can point it at a fake multi-socket tree:
`Topology.read(root)` reads `<root>/devices/system/cpu/cpu*/topology/` and
`<root>/devices/system/node/node*/cpulist`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class CpuPlace:
    core: int
    socket: int
    node: int


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


@dataclass
class Topology:
    cpus: dict[int, CpuPlace] = field(default_factory=dict)

    @classmethod
    def read(cls, root: str | Path = "/sys") -> Topology:
        base = Path(root) / "devices" / "system"
        nodes: dict[int, int] = {}
        for node_dir in sorted((base / "node").glob("node[0-9]*")):
            try:
                for cpu in parse_cpulist((node_dir / "cpulist").read_text()):
                    nodes[cpu] = int(node_dir.name[4:])
            except (OSError, ValueError):
                continue
        cpus: dict[int, CpuPlace] = {}
        for cpu_dir in (base / "cpu").glob("cpu[0-9]*"):
            if not re.fullmatch(r"cpu\d+", cpu_dir.name):
                continue
            cpu = int(cpu_dir.name[3:])
            topo = cpu_dir / "topology"
            try:
                core = int((topo / "core_id").read_text())
                socket = int((topo / "physical_package_id").read_text())
            except (OSError, ValueError):
                core, socket = cpu, 0  # offline or no topology: its own core, socket 0
            cpus[cpu] = CpuPlace(core=core, socket=max(socket, 0), node=nodes.get(cpu, 0))
        return cls(dict(sorted(cpus.items())))

    @property
    def sockets(self) -> list[int]:
        return sorted({p.socket for p in self.cpus.values()})

    def socket_of(self, cpu: int) -> int:
        place = self.cpus.get(cpu)
        return place.socket if place else 0

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {str(c): {"core": p.core, "socket": p.socket, "node": p.node} for c, p in self.cpus.items()}

    @classmethod
    def from_dict(cls, data: dict[str, dict[str, int]]) -> Topology:
        return cls({int(c): CpuPlace(p["core"], p["socket"], p["node"]) for c, p in data.items()})
