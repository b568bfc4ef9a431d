"""The controller daemon: runs a queued optimize run and serves Prometheus metrics, scraped live over HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO

SOFTMAX = REPO / "benchmarks/tasks/softmax.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def run_status(home, run_id: int) -> str:
    with sqlite3.connect(home / "appliance.db") as db:
        return db.execute("SELECT status FROM run WHERE id = ?", (run_id,)).fetchone()[0]


def test_controller_runs_a_queued_run_and_serves_metrics(appliance, home):
    queued = appliance("optimize", str(SOFTMAX), "--queue", "--max-candidates", "2", "--device", "cpu",
                       "--timing-budget", "0.05", "--json")
    run_id = json.loads(queued.stdout)["run_id"]
    assert run_status(home, run_id) == "queued"

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "appliance", "controller", "--metrics-port", str(port),
                             "--metrics-addr", "127.0.0.1", "--poll", "0.2"],
                            env=os.environ | {"APPLIANCE_HOME": str(home)}, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while run_status(home, run_id) != "finished":
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the controller did not finish the run"
            time.sleep(0.5)
        metrics = scrape(port)
        assert metrics[("appliance_candidates_total", (("proposer", "seed"), ("verdict", "pass")))] == 1
        assert metrics[("appliance_candidates_total", (("proposer", "tune"), ("verdict", "pass")))] == 1
        assert metrics[("appliance_evaluation_seconds_count", (("stage", "candidate"),))] == 2
        assert metrics[("appliance_evaluation_seconds_count", (("stage", "prepare"),))] == 1  # reused afterwards
        assert metrics[("appliance_workers_up", (("gpu", "cpu"), ("host", socket.gethostname())))] == 1
        # No GPU here: GPU seconds and energy are exported, and 0 (never invented).
        assert metrics[("appliance_gpu_seconds_total", (("gpu", "cpu"), ("host", socket.gethostname())))] == 0
        assert metrics[("appliance_energy_joules_total", (("gpu", "cpu"), ("host", socket.gethostname())))] == 0
        assert metrics[("appliance_run_best_speedup", (("baseline", "eager"), ("run", str(run_id))))] > 0
        assert ("appliance_queue_depth", ()) in metrics
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "controller: stopped" in out


def test_grafana_dashboard_queries_only_metrics_the_controller_exports():
    import re

    from appliance.metrics import Metrics

    exported = set()
    for family in Metrics().registry.collect():
        exported |= {family.name, f"{family.name}_total", f"{family.name}_bucket", f"{family.name}_count",
                     f"{family.name}_sum"}
    dashboard = json.loads((REPO / "systemd/grafana-dashboard.json").read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"\bappliance_[a-z_]+", target["expr"])}
    assert used and used <= exported, used - exported


def test_gpu_seconds_and_energy_are_counted_per_host_and_gpu_of_the_evaluating_worker():
    """A Ray or worker-process evaluation records its host; the metrics charge that host's GPU, not the controller's."""
    from prometheus_client import generate_latest

    from appliance.evaluation.pipeline import Outcome
    from appliance.metrics import Metrics

    m = Metrics()

    def outcome(host, gpu, held, joules):
        return Outcome(verdict="pass", stage="done", reason="", jailed=True, device="cuda", mode="full",
                       details={"gpu_index": gpu, "host": host, "device_turns": {"held_s": held, "joules": joules}})

    m.evaluation(outcome("gpu-a/0123", 0, 1.5, 900.0), "tune")
    m.evaluation(outcome("gpu-b/4567", 0, 2.0, 1200.0), "tune")
    m.evaluation(outcome("gpu-b/4567", 0, 1.0, 600.0), "tune")
    text = generate_latest(m.registry).decode()
    assert 'appliance_gpu_seconds_total{gpu="0",host="gpu-a/0123"} 1.5' in text
    assert 'appliance_gpu_seconds_total{gpu="0",host="gpu-b/4567"} 3.0' in text
    assert 'appliance_energy_joules_total{gpu="0",host="gpu-b/4567"} 1800.0' in text


def test_sigterm_finishes_the_evaluation_in_flight_and_a_new_controller_completes_the_run(appliance, home):
    queued = appliance("optimize", str(SOFTMAX), "--queue", "--max-candidates", "3", "--batch", "1",
                       "--device", "cpu", "--timing-budget", "0.05", "--json")
    run_id = json.loads(queued.stdout)["run_id"]

    def start():
        return subprocess.Popen([sys.executable, "-m", "appliance", "controller", "--metrics-port", "0",
                                 "--poll", "0.2"], env=os.environ | {"APPLIANCE_HOME": str(home)}, cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def evaluating() -> int:
        with sqlite3.connect(home / "appliance.db") as db:
            return db.execute("SELECT count(*) FROM candidate WHERE status = 'evaluating'").fetchone()[0]

    proc = start()
    try:
        deadline = time.monotonic() + 240
        while not evaluating():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert run_status(home, run_id) == "queued" and evaluating() == 0  # the one in flight was finished, not lost

    proc = start()
    try:
        deadline = time.monotonic() + 300
        while run_status(home, run_id) != "finished":
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=120)
    with sqlite3.connect(home / "appliance.db") as db:
        per_candidate = db.execute("SELECT candidate_id, count(*) FROM evaluation GROUP BY candidate_id").fetchall()
    assert len(per_candidate) == 3 and all(n == 1 for _, n in per_candidate)
