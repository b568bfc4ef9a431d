"""Every bundled baseline (benchmarks/baselines) passes its suite task (benchmarks/tasks) through the real jailed
gate on the CPU, one test per task (tests/test_tasks.py::test_suite_is_there checks the suite is all there).

In a file of its own (it was in test_pipeline.py): with pytest-xdist's --dist loadfile a file is one unit of work,
and this one is twelve evaluations (~3 minutes on CI), so apart it lets the two workers balance."""

from __future__ import annotations

import pytest

from tests.conftest import REPO

TASKS = sorted((REPO / "benchmarks/tasks").glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS, ids=[t.stem for t in TASKS])
def test_every_bundled_baseline_passes_on_cpu(appliance, task):
    code, result = appliance.eval_json(task, REPO / "benchmarks/baselines" / task.name)
    assert code == 0, (result.get("verdict"), result.get("reason") or result.get("error"))
    assert result["verdict"] == "pass", result["reason"]
