"""`kvprof exporter`: metric names and bounded labels, bad input, and a real Prometheus scraping it.

The end-to-end test runs everything on loopback on free ports for a bounded
time: kvcached (baseline) under kvload, `kvprof exporter` attached to it, and
Debian's `prometheus` scraping the exporter every second; it asks
Prometheus's HTTP API for the series and stops every process by PID.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import KVPROF, exposition, semaphores

from kvprof.commands.exporter import parse_listen
from kvprof.model.profile import Profile
from kvprof.model.topology import Topology
from kvprof.system.servers import Server, die_with_parent, free_port, kvload_binary
from kvprof.views.metrics import OTHER, Labeler, TopFunctions, profile_metrics, target_metrics

HERE = Path(__file__).parent
FIXTURE = HERE / "fixtures" / "top-baseline.json"
PROMETHEUS = shutil.which("prometheus")
PER_THREAD = ("kvprof_lock_waits_total", "kvprof_lock_wait_seconds_total", "kvprof_cacheline_samples_total")


def test_names_follow_prometheus_conventions() -> None:
    """Counters end in _total, times are seconds, per-thread series carry thread, thread_name, socket."""
    p = Profile.load(FIXTURE)
    fam = profile_metrics(p, Labeler(Topology.from_dict(p.host.topology)))
    target_metrics(
        {"general": {"cmd_get": "10", "curr_items": "3", "rusage_user": "1.5", "version": "x"}}, fam
    )
    samples = exposition(fam)
    for name in samples:
        assert name.startswith("kvprof_") and name == name.lower(), name
    for f in fam.families.values():
        if f.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in f.samples), f.name
    assert "kvprof_target_cmd_get_total" in samples and "kvprof_target_curr_items" in samples
    assert "kvprof_target_rusage_user_seconds_total" in samples and "kvprof_target_version" not in samples
    for name in (
        "kvprof_lock_waits_total",
        "kvprof_lock_wait_seconds_total",
        "kvprof_cacheline_samples_total",
    ):
        assert samples[name], name
        for s in samples[name]:
            assert {"thread", "thread_name", "socket"} <= set(s.labels), s
    topkeys = [s for s in samples["kvprof_lock_wait_seconds_total"] if s.labels["lock"] == "topkeys"]
    want = next(lk.wait_ns for lk in p.locks if lk.name == "topkeys") / 1e9
    assert abs(sum(s.value for s in topkeys) - want) < 1e-6
    assert {s.labels["thread_name"] for s in topkeys} == {"kv-worker-0", "kv-worker-1"}
    buckets = samples["kvprof_request_duration_seconds_bucket"]
    assert buckets and all(float(s.labels["le"]) > 0 for s in buckets)


def test_function_label_is_bounded_and_adds_up() -> None:
    """--top 3: at most 3 functions plus `other`, and together every on-CPU sample."""
    p = Profile.load(FIXTURE)
    fam = profile_metrics(p, Labeler(Topology.from_dict(p.host.topology), top=3, max_labels=1))
    cpu = exposition(fam)["kvprof_cpu_samples_total"]
    functions = {s.labels["function"] for s in cpu}
    assert OTHER in functions and len(functions) <= 4, functions
    assert sum(s.value for s in cpu) == sum(s.count for s in p.oncpu)
    threads = {s.labels["thread"] for s in cpu}
    assert len(threads - {OTHER}) <= 1, threads  # max_labels=1: one thread of its own


def test_top_functions_never_go_down() -> None:
    """Functions entering and leaving the top N: every series only grows; each sample counts once."""
    top = TopFunctions(2)
    counts: dict[tuple[str, str], int] = {}
    last: dict[tuple[str, str], float] = {}  # every series ever shown, at its last value
    schedule = [{"a": 5, "b": 1, "c": 0}, {"a": 1, "b": 1, "c": 9}, {"a": 0, "b": 20, "c": 1}, {"d": 50}]
    for step in schedule * 3:
        for fn, n in step.items():
            counts[(fn, "1")] = counts.get((fn, "1"), 0) + n
        out = top.fold(dict(counts))
        assert len({fn for fn, _ in out} - {OTHER}) <= 2
        for key, value in out.items():
            assert value >= last.get(key, 0), (key, value, last)
            last[key] = value
        assert sum(last.values()) == sum(counts.values())


def test_listen_address_parsing() -> None:
    """HOST:PORT, [v6]:PORT and :PORT (loopback); anything else is refused."""
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:9500") == ("::1", 9500)
    assert parse_listen(":9464") == ("127.0.0.1", 9464)
    for bad in ("9464", "host:", "host:99999", "host:x"):
        with pytest.raises(ValueError):
            parse_listen(bad)


def exporter_cmd(pid: int, *args: str) -> list[str]:
    return [*KVPROF, "exporter", "-p", str(pid), *args]


def test_dead_pid_is_one_line() -> None:
    """A PID that is gone: one readable line, exit 2."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    r = subprocess.run(exporter_cmd(proc.pid), capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"kvprof exporter: no process with PID {proc.pid}"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the exporter checks for it before binding")
def test_busy_port_is_one_line(kvcached: Server) -> None:
    """A port something else listens on: one line naming --listen, exit 2, before any BPF is loaded."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(
            exporter_cmd(kvcached.pid, "--listen", f"127.0.0.1:{port}"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "is in use" in lines[0] and "--listen" in lines[0], r.stderr


# ---- a real Prometheus ----------------------------------------------------------------------


def get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return str(r.read().decode())


def wait_for(what: str, check: Callable[[], bool], timeout: float, *procs: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args!r} exited ({proc.returncode}) while waiting for {what}")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout:.0f} s")


def query(prom: str, expr: str) -> list[dict[str, Any]]:
    body = json.loads(get(f"{prom}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"))
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def growing(series: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Labels of the range-vector series with two scrapes or more whose value went up."""
    out = []
    for s in series:
        values = [float(v) for _, v in s["values"]]
        if len(values) >= 2 and values[-1] > values[0]:
            out.append(s["metric"])
    return out


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; each is stopped by PID at teardown (SIGTERM, then SIGKILL)."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.bpf
@pytest.mark.skipif(PROMETHEUS is None, reason="no `prometheus` (Debian's): run scripts/provision.sh")
def test_prometheus_scrapes_lock_and_cacheline_series(
    kvcached_factory: Callable[..., Server], started: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    """Prometheus scrapes the exporter on baseline kvcached: lock-wait and cache-line series per thread
    and socket grow between scrapes; SIGTERM detaches everything. Every contended wait fires
    the lock probe (--lock-sample 1): with the default sampling a loaded machine can leave a
    scrape interval without a sampled topkeys wait, and the series would not grow."""
    server = kvcached_factory("-t", "2", "--preset", "baseline", "--lock-sample", "1")
    load = [str(kvload_binary()), f"--server={server.address}", "--duration=90", "--quiet"]
    load += ["--num-threads=1", "--connections=8", "--batch-size=8", "--set-pct=20", "--key-dist=zipf:0.99"]
    started.append(subprocess.Popen(load, stdout=subprocess.DEVNULL, text=True, preexec_fn=die_with_parent))

    port = free_port()
    exporter = subprocess.Popen(
        exporter_cmd(server.pid, "--listen", f"127.0.0.1:{port}", "--collectors", "locks,cachelines"),
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent,
    )
    started.append(exporter)
    metrics = f"http://127.0.0.1:{port}/metrics"
    wait_for(
        "attached exporter",
        lambda: 'kvprof_collector_up{collector="cachelines"} 1.0' in get(metrics),
        150,
        exporter,
    )

    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        f"scrape_configs:\n  - job_name: kvprof\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{port}']\n"
    )
    prom_log = (tmp_path / "prometheus.log").open("w")
    prometheus = subprocess.Popen(
        [
            PROMETHEUS or "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--log.level=warn",
        ],
        stdout=prom_log,
        stderr=prom_log,
        text=True,
        preexec_fn=die_with_parent,
    )
    started.append(prometheus)
    prom = f"http://127.0.0.1:{prom_port}"
    wait_for("ready Prometheus", lambda: "Ready" in get(f"{prom}/-/ready"), 60, prometheus)

    found: dict[str, list[dict[str, str]]] = {}

    def scraped_and_growing() -> bool:
        for name in (
            "kvprof_lock_wait_seconds_total",
            "kvprof_lock_waits_total",
            "kvprof_cacheline_samples_total",
        ):
            found[name] = growing(query(prom, f'{name}{{job="kvprof"}}[1m]'))
        return all(found.values())

    wait_for(
        "two scrapes with growing lock and cache-line series", scraped_and_growing, 60, exporter, prometheus
    )
    assert query(prom, 'up{job="kvprof"}')[0]["value"][1] == "1"
    for name, series in found.items():
        for labels in series:
            assert labels["thread"] and labels["thread_name"] and labels["socket"], (name, labels)
    assert any(s["lock"] == "topkeys" for s in found["kvprof_lock_wait_seconds_total"]), found
    workers = {s["thread_name"] for s in found["kvprof_cacheline_samples_total"]}
    assert workers & {"kv-worker-0", "kv-worker-1"}, workers
    assert query(prom, 'kvprof_target_lock_contended_total{lock="topkeys"}')  # the server's own count

    exporter.send_signal(signal.SIGTERM)
    _, err = exporter.communicate(timeout=60)
    assert exporter.returncode == 0, err
    assert "detached after" in err
    assert not {k: v for k, v in semaphores(server).items() if v}, "kvs semaphores still raised"
    assert server.stats()["curr_items"]  # still serving
