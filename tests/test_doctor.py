"""`appliance doctor` against this host's real bwrap, seccomp and cgroups."""

from __future__ import annotations

import json


def test_doctor_reports_a_usable_host(appliance):
    result = appliance("doctor", "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == 0, report
    names = {c["name"]: c for c in report["checks"]}
    assert {"bubblewrap", "seccomp", "jail", "cgroups", "GPU", "database"} <= set(names)
    assert names["jail"]["ok"] and names["seccomp"]["ok"]
    assert any("seccomp" in line for line in report["enforced"])


def test_doctor_exits_non_zero_with_a_fix_when_candidates_cannot_be_jailed(appliance, monkeypatch):
    monkeypatch.setenv("APPLIANCE_BWRAP", "/nonexistent/bwrap")
    result = appliance("doctor", "--json")
    assert result.exit_code == 3
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert not checks["bubblewrap"]["ok"] and "apt-get install bubblewrap" in checks["bubblewrap"]["fix"]
    human = appliance("doctor")
    assert human.exit_code == 3 and "FAIL" in human.stdout
