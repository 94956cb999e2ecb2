"""The two-socket guest of `make vm-test`: what kvprof recorded inside it.

scripts/vm-test.sh boots Debian's kernel under QEMU TCG as 2 sockets x 2
cores with 2 NUMA nodes, runs kvcached --preset baseline (4 workers pinned
two per socket) under kvload, records it with `kvprof record --collectors
cachelines`, and reads the guest's output back from a disk. These tests read
that output: `make vm-test` passes its folder in KVPROF_VM_OUT; run alone
(`pytest tests/test_vm.py`), the module boots the guest itself (root only).
`make test` runs them through `make vm-test`, not in its main pytest run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import bpf_frames

from kvprof.model.profile import Profile
from kvprof.model.topology import Topology

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def vm_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("KVPROF_VM_OUT")
    if given:
        return Path(given)
    if os.geteuid() != 0:
        pytest.skip("booting the guest needs root (debootstrap, chroot): run `make vm-test`")
    out = tmp_path_factory.mktemp("vm-out")
    # The script prints its stage times; they show with -s or when this fails.
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "vm-test.sh"), "--out", str(out)],
        stdin=subprocess.DEVNULL,
        stdout=sys.stdout,
        stderr=subprocess.STDOUT,
        timeout=900,
    )
    assert done.returncode == 0, f"scripts/vm-test.sh failed ({done.returncode}); see {out}/serial.log"
    return out


@pytest.fixture(scope="module")
def profile(vm_out: Path) -> Profile:
    path = vm_out / "profile.json"
    assert path.is_file(), f"the guest wrote no profile; its console is in {vm_out / 'serial.log'}"
    return Profile.load(path)


def test_guest_topology_is_two_sockets_and_two_nodes(profile: Profile) -> None:
    """kvprof's topology inside the guest: 4 CPUs, 2 sockets of 2 cores, 2 NUMA nodes (one per socket)."""
    topo = Topology.from_dict(profile.host.topology)
    assert sorted(topo.cpus) == [0, 1, 2, 3]
    assert topo.sockets == [0, 1]
    assert sorted({p.node for p in topo.cpus.values()}) == [0, 1]
    for socket in (0, 1):
        cpus = [c for c, p in topo.cpus.items() if p.socket == socket]
        assert len(cpus) == 2, f"socket {socket} has CPUs {cpus}"
        assert {topo.cpus[c].node for c in cpus} == {socket}
        assert len({topo.cpus[c].core for c in cpus}) == 2


def test_recorded_target_is_baseline_kvcached_with_four_workers(profile: Profile, vm_out: Path) -> None:
    """The guest recorded kvcached --preset baseline -t 4, workers 0-1 pinned to socket 0, 2-3 to socket 1."""
    assert profile.target.comm == "kvcached"
    cmdline = " ".join(profile.target.cmdline)
    assert "--preset baseline" in cmdline and "-t 4" in cmdline, cmdline
    pinned = re.findall(
        r"pinned kv-worker-(\d) \(tid \d+\) to CPU \d, socket (\d)", (vm_out / "serial.log").read_text()
    )
    assert sorted(pinned) == [("0", "0"), ("1", "0"), ("2", "1"), ("3", "1")]


def test_on_create_item_line_crosses_sockets_both_ways(profile: Profile) -> None:
    """Baseline's shared item counter (on_create_item) moves between the sockets: cross-socket
    transfers, a 2x2 socket matrix with both off-diagonal cells non-zero, samples from all 4 workers."""
    lines = [c for c in profile.cachelines if c.site == "on_create_item"]
    assert lines, f"no on_create_item line; sites: {sorted({c.site for c in profile.cachelines})}"
    line = max(lines, key=lambda c: c.samples)
    assert line.cross_socket_transfers > 0
    assert len(line.socket_matrix) == 2 and all(len(row) == 2 for row in line.socket_matrix)
    assert line.socket_matrix[0][1] > 0 and line.socket_matrix[1][0] > 0, line.socket_matrix
    workers = {profile.threads[tid].name for tid in line.by_thread if tid in profile.threads}
    assert workers == {f"kv-worker-{n}" for n in range(4)}


def test_no_bpf_frame_in_the_guests_stacks(vm_out: Path) -> None:
    """The guest's second recording (on-CPU, off-CPU timed at every switch, futex waits under load): the
    guest kernel's tracing machinery and BPF programs are cut from every stack."""
    path = vm_out / "stacks.json"
    assert path.is_file(), f"the guest wrote no stacks.json; see {vm_out / 'record-stacks.log'}"
    p = Profile.load(path)
    assert p.oncpu and p.offcpu.stacks and p.offcpu.futex
    assert any(f.endswith("_[k]") for s in p.offcpu.stacks for f in s.frames)  # kernel frames are there
    assert not bpf_frames(p), bpf_frames(p)
