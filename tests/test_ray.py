"""Evaluation workers on a real Ray cluster, on the CPU: a head and a second node, both on loopback, each lending one
CPU (so one worker each). A small run spreads over both; a node killed mid-run costs only its evaluation in flight,
which is queued again, and the node that comes back (a new node id) is used again (one run: a cluster's start costs
a CI host ~12 s, the run ~25 s)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytest.importorskip("ray", reason="Ray is not installed (pip install '.[ray]')")
pytestmark = pytest.mark.slow

SOFTMAX = REPO / "benchmarks/tasks/softmax.py"
RAY = str(Path(sys.executable).with_name("ray"))


class Cluster:
    """`ray start --block` processes, each in its own process group: a node is killed (and stopped) by its group,
    never by a machine-wide `ray stop` that would take other people's clusters with it."""

    def __init__(self, home: Path):
        self.temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: Ray's socket paths have a limit
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        # PYTHONPATH: the workers import this checkout's appliance; fast health checks: a dead node is noticed in ~3 s.
        self.env = os.environ | {"APPLIANCE_HOME": str(home), "PYTHONPATH": str(REPO),
                                 "RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "4"}
        self.nodes: list[subprocess.Popen] = []

    def start_node(self, head: bool = False) -> subprocess.Popen:
        where = ["--head", "--port", str(self.port), "--include-dashboard=false", "--temp-dir", str(self.temp)] \
            if head else ["--address", self.address]
        log = self.temp / f"node{len(self.nodes)}.log"
        proc = subprocess.Popen([RAY, "start", *where, "--num-cpus", "1", "--num-gpus", "0", "--disable-usage-stats",
                                 "--block"], env=self.env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.nodes.append(proc)
        deadline = time.monotonic() + 60
        while "Ray runtime started" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start failed:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def stop(self) -> None:
        for proc in reversed(self.nodes):
            self.kill(proc)
        subprocess.run(["rm", "-rf", str(self.temp)], check=False)


@pytest.fixture
def cluster(home):
    c = Cluster(home)
    try:
        c.start_node(head=True)
        c.start_node()
        yield c
    finally:
        c.stop()


def optimize(cluster: Cluster, *args: str, **popen) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "appliance", "optimize", str(SOFTMAX), "--device", "cpu", "--timing-budget", "0.05",
           "--batch", "2", "--executor", cluster.address, "--json", *args]
    return subprocess.Popen(cmd, env=cluster.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def rows(home: Path, query: str) -> list[tuple]:
    if not (home / "appliance.db").exists():
        return []
    with sqlite3.connect(home / "appliance.db") as db:
        try:
            return db.execute(query).fetchall()
        except sqlite3.OperationalError:  # the schema is still being created
            return []


def hosts(home: Path) -> list[str]:
    return [json.loads(d).get("host") for (d,) in rows(home, "SELECT details FROM evaluation ORDER BY id")]


def test_a_run_spreads_over_the_nodes_and_a_node_killed_mid_run_costs_one_evaluation_and_is_used_again_when_back(
        cluster, home):
    proc = optimize(cluster, "--max-candidates", "8")
    try:
        # Both workers busy, after each has finished one: the second node has an evaluation in flight.
        deadline = time.monotonic() + 180
        while not (len(set(hosts(home))) == 2 and
                   rows(home, "SELECT count(*) FROM candidate WHERE status = 'evaluating'") == [(2,)]):
            assert proc.poll() is None and time.monotonic() < deadline, "the run never had both nodes busy"
            time.sleep(0.2)
        before = set(hosts(home))
        cluster.kill(cluster.nodes[1])
        cluster.start_node()  # the host comes back: a new node, where Ray places the lost worker again
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "finished" and summary["evaluated"] == 8 and summary["passed"] == 8, summary
    assert rows(home, "SELECT count(*) FROM evaluation WHERE jailed = 1") == [(8,)]  # the same jail as a local worker
    assert all(hosts(home)), hosts(home)  # "hostname/node id": both nodes' (before the kill) and the new one's
    state = json.loads(rows(home, "SELECT state FROM run WHERE id = 1")[0][0])
    requeued = state.get("requeued_after_infrastructure_failure")
    assert requeued == [requeued[0]], state  # the evaluation lost with the node, queued again once
    per_candidate = rows(home, "SELECT candidate_id, count(*), max(verdict) FROM evaluation GROUP BY candidate_id")
    assert all(n == 1 for _, n, _ in per_candidate)  # a lost evaluation leaves no row: nothing evaluated twice
    assert {v for _, _, v in per_candidate} == {"pass"}  # the re-queued candidate passed on a live worker
    assert set(hosts(home)) - before, "no evaluation ran on the node that came back"


def test_default_slots_on_ray_come_from_the_gpu_hosts_not_the_controller():
    from appliance.ray_executor import slots_for_nodes

    def node(cpus, gpus=0, alive=True):
        return {"Alive": alive, "Resources": {"CPU": cpus, **({"GPU": gpus} if gpus else {})}}

    assert slots_for_nodes([node(2), node(32, 2), node(128, 8)], "cuda") == 8  # 16 and 8 cores per GPU
    assert slots_for_nodes([node(2), node(16, 2), node(128, 8)], "cuda") == 4  # the smallest host decides
    assert slots_for_nodes([node(16, 8), node(8, 8, alive=False)], "cuda") == 3  # at least 3; dead nodes ignored
    assert slots_for_nodes([node(64)], "cpu") == 1


def test_cpu_only_nodes_check_that_kernels_build_for_the_gpu_before_any_gpu_sees_them(cluster, home):
    """Compile-only work on CPU-only nodes: one screen per node (both nodes here lend no GPU), jailed there, building
    the candidate's Triton kernels for sm_90 with Triton's own compiler."""
    from appliance import ray_executor
    from appliance.tasks import load_task

    fixtures = REPO / "tests/fixtures/candidates"
    screens = []
    try:
        screens = ray_executor.compile_screens(cluster.address, 90, unsafe=False)
        assert len(screens) == 2
        task = load_task(SOFTMAX)
        for screen in screens:
            rejected = screen.screen(task, fixtures / "builds_only_in_the_interpreter.py")
            assert rejected is not None and (rejected.verdict, rejected.stage) == ("compile_error", "compile")
            assert "does not build for sm_90" in rejected.reason and rejected.jailed
            assert "builds_only_in_the_interpreter.py" in rejected.reason  # the sender's file, not the node's copy
            assert screen.screen(task, fixtures / "good.py") is None  # builds: on to the GPU
        hosts = {s.screen(load_task(SOFTMAX), fixtures / "compile_error.py").details["screen"]["host"]
                 for s in screens}
        assert len(hosts) == 1  # one machine here; each screen names the host it ran on
    finally:
        for screen in screens:
            screen.close()
        # This test process joined the cluster as a driver: leave it before the cluster stops, or Ray ends the
        # process once it has not reached the cluster for a minute (pytest with it, mid-suite).
        import ray

        ray.shutdown()
