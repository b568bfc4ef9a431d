"""`appliance doctor` against this host's real bwrap, seccomp and cgroups."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest


def test_doctor_reports_a_usable_host(appliance):
    result = appliance("doctor", "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == 0, report
    names = {c["name"]: c for c in report["checks"]}
    assert {"bubblewrap", "seccomp", "jail", "memory limit", "GPU", "database"} <= set(names)
    assert names["jail"]["ok"] and names["seccomp"]["ok"] and names["memory limit"]["ok"]
    # The policy is the jail's own value (sandbox/policy.py), not prose: what a run renders into bwrap's arguments.
    from sandbox.jail import Jail

    assert report["policy"] == json.loads(json.dumps(Jail().policy().as_dict()))
    assert "ptrace" in report["policy"]["seccomp"]["kill"]
    assert not any(m["dest"] in ("/etc", "/sys") and m["kind"] != "dir" for m in report["policy"]["mounts"])
    human = appliance("doctor").stdout
    assert "mount ro-bind? /etc/ld.so.cache" in human and "rlimit cpu: soft" in human


def test_doctor_exits_non_zero_with_a_fix_when_candidates_cannot_be_jailed(appliance, monkeypatch):
    monkeypatch.setenv("APPLIANCE_BWRAP", "/nonexistent/bwrap")
    result = appliance("doctor", "--json")
    assert result.exit_code == 3
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert not checks["bubblewrap"]["ok"] and "apt-get install bubblewrap" in checks["bubblewrap"]["fix"]
    human = appliance("doctor")
    assert human.exit_code == 3 and "FAIL" in human.stdout


def test_doctor_fails_with_a_hint_when_the_configured_llm_does_not_answer(appliance, monkeypatch):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("APPLIANCE_LLM_URL", f"http://127.0.0.1:{port}/v1")
    monkeypatch.setenv("APPLIANCE_LLM_MODEL", "some-model")
    result = appliance("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert result.exit_code == 3
    assert not checks["LLM endpoint"]["ok"] and "appliance model serve" in checks["LLM endpoint"]["fix"]


def test_doctor_warns_when_the_metrics_port_is_taken(appliance):
    import socket

    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        result = appliance("doctor", "--json", "--metrics-port", str(port))
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert not checks["metrics port"]["ok"] and "taken" in checks["metrics port"]["detail"]
    assert result.exit_code == 0  # a warning: a running controller holds its own port


def test_job_folders_go_where_appliance_jobs_dir_says(appliance, monkeypatch, tmp_path):
    from appliance.config import Settings
    from appliance.errors import InfrastructureError

    jobs = tmp_path / "jobs"
    monkeypatch.setenv("APPLIANCE_JOBS_DIR", str(jobs))
    assert Settings.load().jobs_dir == jobs and jobs.is_dir()
    checks = {c["name"]: c for c in json.loads(appliance("doctor", "--json").stdout)["checks"]}
    assert checks["jobs dir"]["ok"] and str(jobs) in checks["jobs dir"]["detail"], checks["jobs dir"]
    monkeypatch.delenv("APPLIANCE_JOBS_DIR")
    assert Settings.load().jobs_dir == Settings.load().home / "jobs"
    # A folder every user may write to (as /dev/shm itself) is refused: someone else could swap a job's files.
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv("APPLIANCE_JOBS_DIR", str(shared))
    with pytest.raises(InfrastructureError, match="writable by every user"):
        Settings.load().jobs_dir


def test_doctor_says_what_host_memory_evaluations_may_hold(appliance, monkeypatch):
    monkeypatch.setenv("APPLIANCE_HOST_MEMORY_GIB", "40")
    checks = {c["name"]: c for c in json.loads(appliance("doctor", "--json").stdout)["checks"]}
    memory = checks["host memory"]
    assert memory["ok"] and "40 GiB (APPLIANCE_HOST_MEMORY_GIB" in memory["detail"], memory
