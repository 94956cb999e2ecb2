"""`kvprof doctor`: the real checks on this machine, and each check's verdict
and fix against fake /proc, /sys and /lib/modules trees."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from support import kvprof

from kvprof.commands.doctor import format_check
from kvprof.system import doctor
from kvprof.system.doctor import Host

REPO = Path(__file__).resolve().parent.parent
RELEASE = "6.18.44-test"


def run_doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return kvprof("doctor", *args, timeout=180)


def _tracing() -> Path:
    return Path("/sys/kernel/tracing")


@pytest.mark.bpf
def test_doctor_on_this_machine() -> None:
    """As root here: every check prints one status line, the facts match the machine, exit 0."""
    done = run_doctor()
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    flat = " ".join(out.split())  # findings wrap at 80 columns
    status = re.compile(r"(ok|info|warn|FAIL) +([^:]+):")
    lines = {m.group(2): line for line in out.splitlines() if (m := status.match(line))}
    expected = {"kernel", "privileges", "BPF syscall", "tracefs", "kprobes", "uprobes", "BTF"}
    expected |= {"kernel headers", "BCC", "hardware PMU", "unwind info"}
    assert expected <= set(lines), out
    assert lines["kernel"].startswith("ok") and os.uname().release in lines["kernel"]
    assert lines["BPF syscall"].startswith("ok") and lines["BCC"].startswith("ok"), out
    # kprobes: info when the kernel has none (as here), never a problem either way.
    if not (_tracing() / "kprobe_events").exists():
        assert lines["kprobes"].startswith("info") and "not needed" in lines["kprobes"], out
    # Headers: this machine links another kernel's headers package.
    build = Path(f"/lib/modules/{os.uname().release}/build").resolve()
    if build.name != f"linux-headers-{os.uname().release}":
        assert "kernel headers: no package for" in flat and f"linked to {build.name}" in flat, out
        assert "never dereferences kernel structs" in flat, out
    # No PMU here: cpu-clock sampling, no perf c2c.
    if not doctor.pmu_available()[0]:
        assert lines["hardware PMU"].startswith("info"), out
        assert "cpu-clock" in flat and "perf c2c cannot run" in flat, out
    assert "ok unwind info: kvcached: present" in flat and "ok unwind info: libc.so.6: present" in flat, out
    assert "ready to profile" in out


@pytest.mark.bpf
def test_doctor_json_parses() -> None:
    """--json prints one object with every check, the fatal ones and the exit status."""
    done = run_doctor("--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["exit_status"] == 0 and data["fatal"] == []
    names = [c["name"] for c in data["checks"]]
    assert {"kernel headers", "tracefs", "unwind info"} <= set(names)
    assert all(c["status"] in ("ok", "info", "warn", "FAIL") for c in data["checks"])


def test_doctor_bad_pid_is_a_warning() -> None:
    """-p with a PID that does not exist is reported on the unwind-info line, no traceback."""
    checks = doctor.check_unwind_info(999_999_999)
    assert checks[0].status == "warn" and "no process with PID 999999999" in checks[0].finding


# ---- fake trees ----------------------------------------------------------------


def fake_host(tmp_path: Path, mounts: str = "", euid: int = 0) -> Host:
    proc, sys_, modules = tmp_path / "proc", tmp_path / "sys", tmp_path / "lib" / "modules"
    for d in (proc / "self", proc / "sys" / "kernel", sys_ / "kernel", modules / RELEASE):
        d.mkdir(parents=True, exist_ok=True)
    (proc / "mounts").write_text(mounts)
    (proc / "self" / "status").write_text("Name:\tx\nCapEff:\t0000000000000000\n")
    (proc / "sys" / "kernel" / "perf_event_paranoid").write_text("2\n")
    return Host(proc=proc, sys=sys_, modules=modules, release=RELEASE, machine="x86_64", euid=euid)


def headers_pkg(tmp_path: Path, name: str, release_file: str | None = None) -> Path:
    d = tmp_path / "usr" / "src" / name
    (d / "include" / "config").mkdir(parents=True)
    if release_file:
        (d / "include" / "config" / "kernel.release").write_text(release_file + "\n")
    return d


def test_headers_matching_package(tmp_path: Path) -> None:
    """build -> linux-headers-<release>: ok, matching."""
    host = fake_host(tmp_path)
    (host.modules / RELEASE / "build").symlink_to(headers_pkg(tmp_path, f"linux-headers-{RELEASE}"))
    c = doctor.check_headers(host)
    assert (c.status, c.finding, c.fix) == ("ok", f"matching: linux-headers-{RELEASE}", None)


def test_headers_kernel_build_tree(tmp_path: Path) -> None:
    """build -> a self-built tree whose kernel.release is the running release: ok, matching."""
    host = fake_host(tmp_path)
    (host.modules / RELEASE / "build").symlink_to(headers_pkg(tmp_path, "linux", RELEASE))
    c = doctor.check_headers(host)
    assert c.status == "ok" and c.finding.startswith("matching: the kernel's build tree")


def test_headers_linked_fallback(tmp_path: Path) -> None:
    """build -> another kernel's package: ok, names the package and why it is safe."""
    host = fake_host(tmp_path)
    pkg = headers_pkg(tmp_path, "linux-headers-6.1.0-57-amd64", "6.1.192")
    (host.modules / RELEASE / "build").symlink_to(pkg)
    c = doctor.check_headers(host)
    assert c.status == "ok" and c.fix is None
    assert f"no package for {RELEASE}" in c.finding
    assert "linked to linux-headers-6.1.0-57-amd64 (headers of 6.1.192)" in c.finding
    assert "never dereferences kernel structs" in c.finding


def test_headers_missing_is_fatal_with_fix(tmp_path: Path) -> None:
    """No build link and no kheaders: FAIL, fixed by installing the headers package."""
    host = fake_host(tmp_path)
    c = doctor.check_headers(host)
    assert c.status == "FAIL" and c.fatal
    assert c.fix == f"apt-get install linux-headers-{RELEASE}"


def test_headers_dangling_link_with_kheaders(tmp_path: Path) -> None:
    """A dangling build link is named; with /sys/kernel/kheaders.tar.xz it is only a warning."""
    host = fake_host(tmp_path)
    (host.modules / RELEASE / "build").symlink_to(tmp_path / "gone")
    (host.sys / "kernel" / "kheaders.tar.xz").write_bytes(b"")
    c = doctor.check_headers(host)
    assert c.status == "warn" and "dangling link" in c.finding and "kheaders.tar.xz" in c.finding


def test_tracefs_missing_is_fatal_with_mount_command(tmp_path: Path) -> None:
    """No tracefs in /proc/mounts: FAIL with the exact mount command, and exit status 1."""
    host = fake_host(tmp_path, mounts="proc /proc proc rw 0 0\n")
    c = doctor.check_tracefs(host)
    assert c.status == "FAIL" and c.fix == "mount -t tracefs tracefs /sys/kernel/tracing"
    assert doctor.exit_status([doctor.check_kernel(host), c]) == 1


def test_tracefs_kprobes_uprobes_from_the_tree(tmp_path: Path) -> None:
    """tracefs mounted with uprobe_events but no kprobe_events: ok, info (not needed), ok."""
    tracing = tmp_path / "sys" / "kernel" / "tracing"
    host = fake_host(tmp_path, mounts=f"tracefs {tracing} tracefs rw 0 0\n")
    tracing.mkdir(parents=True)
    (tracing / "uprobe_events").write_text("")
    assert doctor.check_tracefs(host).status == "ok"
    kprobes = doctor.check_kprobes(host)
    assert kprobes.status == "info" and "not needed" in kprobes.finding
    assert doctor.check_uprobes(host).status == "ok"
    (tracing / "uprobe_events").unlink()
    uprobes = doctor.check_uprobes(host)
    assert uprobes.status == "warn" and uprobes.fix and "CONFIG_UPROBE_EVENTS" in uprobes.fix


def test_unprivileged_is_fatal(tmp_path: Path) -> None:
    """A uid without CAP_BPF/CAP_PERFMON: FAIL with sudo as the fix; root: ok."""
    c = doctor.check_privileges(fake_host(tmp_path, euid=1000))
    assert c.status == "FAIL" and c.fix and c.fix.startswith("sudo kvprof")
    assert "perf_event_paranoid 2" in c.finding
    assert doctor.check_privileges(fake_host(tmp_path, euid=0)).status == "ok"


def test_frame_pointer_flags_of_gcc_units() -> None:
    """gcc keeps frame pointers with -fno-omit-frame-pointer (last flag wins) and at -O0."""
    keeps = doctor._unit_keeps_frame_pointer
    assert keeps("GNU C11 12.2.0 -g -O2 -fno-omit-frame-pointer")
    assert not keeps("GNU C11 12.2.0 -g -O2")
    assert not keeps("GNU C11 12.2.0 -O2 -fno-omit-frame-pointer -fomit-frame-pointer")
    assert keeps("GNU C17 12.2.0 -mtune=generic -g -fPIC")
    assert not keeps("GNU C17 12.2.0 -Os")


def test_frame_pointers_of_kvcached_and_libc() -> None:
    """kvcached is built with frame pointers; Debian's glibc is not (sampled prologues)."""
    kvcached = REPO / "server" / "build" / "kvcached"
    if not kvcached.is_file():
        pytest.skip("kvcached is not built (make -C server)")
    assert doctor.frame_pointers(kvcached).verdict == "yes"
    libc = doctor.libc_of(None)
    assert libc is not None
    fp = doctor.frame_pointers(libc)
    assert fp.verdict in ("no", "yes", "partial") and "prologues" in fp.evidence


def test_lines_fit_80_columns() -> None:
    """A long finding wraps under its status, and the fix follows on its own line."""
    text = format_check("warn", "frame pointers", "x " * 100, "kvprof record --backend perf -p PID")
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines[:-1])
    assert lines[0].startswith("warn  frame pointers: ")
    assert lines[-1] == "      fix: kvprof record --backend perf -p PID"


def test_bpf_programs_present() -> None:
    """Every file kvprof loads is in its package's probes folder: ok, with the folder."""
    c = doctor.check_bpf_sources()
    assert c.status == "ok" and str(doctor.PROBES_DIR) in c.finding


def test_bpf_programs_missing_is_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package without its BPF programs (installed without package data): FAIL, naming them."""
    (tmp_path / "common.h").write_text("")
    monkeypatch.setattr(doctor, "PROBES_DIR", tmp_path)
    c = doctor.check_bpf_sources()
    assert c.status == "FAIL" and c.fatal
    assert c.finding.startswith(f"{len(doctor.PROBE_FILES) - 1} of kvprof's files missing from {tmp_path}")
    assert "cachelines.bpf.c" in c.finding and c.fix is not None and "docs/install.md" in c.fix


def test_bcc_fix_names_the_python_that_cannot_see_it(tmp_path: Path) -> None:
    """BCC not importable: from pyenv's Python, a venv of /usr/bin/python3; from a venv
    without system packages, one with them; BCC that imports but cannot compile: headers."""
    missing = "BCC is not importable: No module named 'bcc'"
    pyenv = doctor.bcc_fix(missing, "/root/.pyenv/versions/3.11.7", str(tmp_path))
    assert "/usr/bin/python3 -m venv --system-site-packages" in pyenv and ".pyenv" in pyenv
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    alone = doctor.bcc_fix(missing, "/usr", str(tmp_path))
    assert alone.endswith(f"then kvprof in a venv made with --system-site-packages ({tmp_path} is not)")
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = true\n")
    assert doctor.bcc_fix(missing, "/usr", str(tmp_path)) == "apt-get install python3-bpfcc"
    compile_error = doctor.bcc_fix("Failed to compile BPF module <text>", "/usr", str(tmp_path))
    assert compile_error == f"apt-get install python3-bpfcc linux-headers-{os.uname().release}"
