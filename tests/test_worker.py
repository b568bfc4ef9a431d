"""Evaluation worker processes (appliance/worker.py): real `appliance worker` processes on real Unix sockets, running
real jailed CPU evaluations (Triton's interpreter); a worker killed mid-evaluation; the controller's own workers."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest

from appliance.errors import InfrastructureError
from appliance.evaluation.pipeline import EvalSettings
from appliance.tasks import load_task
from appliance.worker import WorkerSupervisor, call, claim_socket, socket_path
from tests.conftest import REPO, candidate
from tests.test_controller import free_port, run_status, scrape

SETTINGS = EvalSettings(device="cpu", baselines=("eager",), timing_budget_s=0.05, reuse_inputs=True)


@pytest.fixture
def supervisor(home):
    s = WorkerSupervisor(home, persistent=True)
    yield s
    s.close()


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def test_a_worker_evaluates_over_its_socket_and_refuses_strangers(supervisor, home, softmax_task):
    [pipeline] = supervisor.pipelines([None], SETTINGS, slots=1, unsafe=False)
    path = socket_path(home, None)
    assert path == home / "workers/cpu.sock"
    for private in (path, home / "workers/authkey"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
    assert stat.S_IMODE((home / "workers").stat().st_mode) == 0o700

    outcome = pipeline.evaluate(load_task(softmax_task), candidate("good"))
    assert outcome.verdict == "pass" and outcome.jailed and outcome.device == "cpu", outcome.reason
    worker = outcome.details["worker_pid"]
    assert worker == supervisor.workers[None].proc.pid != os.getpid()

    with pytest.raises(AuthenticationError):
        Client(str(path), "AF_UNIX", authkey=b"not the appliance's key").close()
    assert call(path, supervisor.key, {"op": "ping"})["pid"] == worker  # refusing a stranger cost it nothing

    # A second worker for the same socket refuses to start, and says why.
    second = subprocess.run([sys.executable, "-m", "appliance", "worker", "--gpu", "cpu"], cwd=REPO,
                            env=os.environ | {"APPLIANCE_HOME": str(home)}, capture_output=True, text=True, timeout=60)
    assert second.returncode == 3 and f"in use by a live worker (pid {worker}" in second.stderr, second.stderr


def test_a_stale_socket_is_removed_and_odd_paths_are_refused(tmp_path):
    path = tmp_path / "gpu0.sock"
    with socket.socket(socket.AF_UNIX) as dead:  # what a SIGKILLed worker leaves behind: a file nobody listens on
        dead.bind(str(path))
    removed = []
    claim_socket(path, b"key", removed.append)
    assert not path.exists() and "stale socket" in removed[0]
    path.write_text("not a socket")
    with pytest.raises(InfrastructureError, match="is not a socket"):
        claim_socket(path, b"key")
    with pytest.raises(InfrastructureError, match="too long"):
        claim_socket(tmp_path / ("x" * 120) / "gpu0.sock", b"key")


def test_a_worker_killed_mid_evaluation_fails_that_evaluation_and_its_restart_serves_the_next(supervisor, home,
                                                                                               softmax_task):
    [pipeline] = supervisor.pipelines([None], SETTINGS, slots=1, unsafe=False)
    task, path = load_task(softmax_task), socket_path(home, None)
    first = supervisor.workers[None].proc.pid
    with ThreadPoolExecutor(1) as pool:
        hanging = pool.submit(pipeline.evaluate, task, candidate("hangs"))
        wait_for(lambda: (call(path, supervisor.key, {"op": "ping"}) or {}).get("in_flight"), 30, "the evaluation")
        os.kill(first, signal.SIGKILL)
        with pytest.raises(InfrastructureError, match=r"died mid-evaluation \(killed by SIGKILL\); it is started again"):
            hanging.result(timeout=60)
    assert list((home / "jobs").glob(f"appliance-jobs-{first}-*")), "the killed worker left no folder behind"
    outcome = pipeline.evaluate(task, candidate("good"))
    assert outcome.verdict == "pass", outcome.reason
    assert outcome.details["worker_pid"] == supervisor.workers[None].proc.pid != first
    assert not list((home / "jobs").glob(f"appliance-jobs-{first}-*"))  # swept by the worker started after it


def test_a_run_calls_off_only_its_own_evaluations_that_do_not_measure_yet(supervisor, home, softmax_task):
    """Two runs share a worker (same settings, so one pipeline there): one whose time is up calls off its own
    evaluation, still waiting for the task's baselines, and the other run's goes on to its verdict."""
    from appliance.errors import EvaluationCancelled

    [mine] = supervisor.pipelines([None], SETTINGS, slots=2, unsafe=False)
    [theirs] = supervisor.pipelines([None], SETTINGS, slots=2, unsafe=False)
    task, path = load_task(softmax_task), socket_path(home, None)
    with ThreadPoolExecutor(2) as pool:
        other = pool.submit(theirs.evaluate, task, candidate("good"))
        wait_for(lambda: (call(path, supervisor.key, {"op": "ping"}) or {}).get("in_flight"), 30, "their evaluation")
        called_off = pool.submit(mine.evaluate, task, candidate("good"))
        wait_for(lambda: (call(path, supervisor.key, {"op": "ping"}) or {}).get("in_flight") == 2, 30, "mine")
        assert mine.cancel_unmeasured() in (0, 1)  # 0: asked for, not yet started (called off as it starts)
        with pytest.raises(EvaluationCancelled, match="called off"):
            called_off.result(timeout=120)
        assert other.result(timeout=300).verdict == "pass"
    assert mine.cancel_unmeasured() == 0 and theirs.cancel_unmeasured() == 0


def test_a_unit_worker_that_goes_away_is_replaced_by_a_child_of_the_supervisor(supervisor, home, softmax_task):
    # A worker the supervisor did not start (as systemd's appliance-worker@N would be) serves the first run ...
    path = socket_path(home, None)
    unit = subprocess.Popen([sys.executable, "-m", "appliance", "worker", "--gpu", "cpu", "--slots", "1"], cwd=REPO,
                            env=os.environ | {"APPLIANCE_HOME": str(home)}, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: path.exists() and call(path, supervisor.key, {"op": "ping"}), 60, "the unit's worker")
        [pipeline] = supervisor.pipelines([None], SETTINGS, slots=1, unsafe=False)
        assert supervisor.workers[None].proc is None  # not ours to restart
        assert pipeline.evaluate(load_task(softmax_task), candidate("good")).details["worker_pid"] == unit.pid
    finally:
        unit.terminate()
        unit.wait(30)
    # ... and once it is gone (its unit stopped), the next run gets a worker of the supervisor's own.
    [pipeline] = supervisor.pipelines([None], SETTINGS, slots=1, unsafe=False)
    outcome = pipeline.evaluate(load_task(softmax_task), candidate("good"))
    assert outcome.verdict == "pass" and outcome.details["worker_pid"] == supervisor.workers[None].proc.pid != unit.pid


def test_the_controller_evaluates_in_worker_processes_it_restarts_and_stops(appliance, home):
    queued = appliance("optimize", REPO / "benchmarks/tasks/softmax.py", "--queue", "--max-candidates", "1",
                       "--device", "cpu", "--timing-budget", "0.05", "--json")
    run_id = json.loads(queued.stdout)["run_id"]
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "appliance", "controller", "--metrics-port", str(port),
                             "--metrics-addr", "127.0.0.1", "--poll", "0.2"],
                            env=os.environ | {"APPLIANCE_HOME": str(home)}, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    path = socket_path(home, None)

    def up() -> float:
        return scrape(port).get(("appliance_workers_up", (("gpu", "cpu"), ("host", socket.gethostname()))))

    try:
        wait_for(lambda: proc.poll() is not None or run_status(home, run_id) == "finished", 120, "the run")
        assert proc.poll() is None, proc.stdout.read()
        with sqlite3.connect(home / "appliance.db") as db:
            [(details,)] = db.execute("SELECT details FROM evaluation").fetchall()
        worker = json.loads(details)["worker_pid"]
        assert worker != proc.pid and _parent(worker) == proc.pid  # the controller's child, not the controller
        assert up() == 1

        os.kill(worker, signal.SIGKILL)  # the metric follows the worker, and the controller starts a new one
        wait_for(lambda: up() == 0, 10, "appliance_workers_up to drop")
        restarted = wait_for(lambda: (call(path, _key(home), {"op": "ping"}) or {}).get("pid"), 30, "a new worker")
        assert restarted != worker and _parent(restarted) == proc.pid
        wait_for(lambda: up() == 1, 15, "appliance_workers_up to come back")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert not os.path.exists(f"/proc/{restarted}") and not path.exists(), out  # stopped with the controller


def _parent(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[1])


def _key(home) -> bytes:
    return (home / "workers/authkey").read_bytes().strip()


def test_the_hosts_jail_limits_reach_searches_and_worker_processes(home, softmax_task, monkeypatch):
    """APPLIANCE_JAIL_* are read once, in Settings, by whichever process evaluates: a search in this process and a
    worker process alike (before, only `eval` passed limits to the jail; the rest got the defaults)."""
    from appliance import executors
    from appliance.config import Settings
    from appliance.search.loop import OptimizeConfig

    monkeypatch.setenv("APPLIANCE_JAIL_MEMORY_GIB", "3")
    monkeypatch.setenv("APPLIANCE_JAIL_PIDS", "77")
    monkeypatch.setenv("APPLIANCE_JAIL_DISK_GIB", "2")
    monkeypatch.setenv("APPLIANCE_JAIL_CPU_SECONDS", "900")
    [local] = executors.pipelines(Settings.load(), OptimizeConfig(device="cpu"), None, False, print)
    assert (local.jail.memory_bytes, local.jail.pids_max, local.jail.disk_bytes, local.jail.cpu_seconds) == \
        (3 << 30, 77, 2 << 30, 900)
    local.close()

    supervisor = WorkerSupervisor(home)  # its worker process inherits this environment, as a unit's would
    try:
        [remote] = supervisor.pipelines([None], SETTINGS, slots=1, unsafe=False)
        outcome = remote.evaluate(load_task(softmax_task), candidate("good"))
    finally:
        supervisor.close()
    assert outcome.verdict == "pass", outcome.reason
    limits = outcome.details["jail"]["limits"]
    assert (limits["memory_bytes"], limits["pids_max"], limits["cpu_seconds"]) == (3 << 30, 77, 900)
    assert limits["disk_bytes"] >= 2 << 30 and limits["disk_bytes"] < (2 << 30) + (1 << 30)  # + its outputs
