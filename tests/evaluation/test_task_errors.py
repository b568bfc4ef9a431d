"""A broken task (or a missing candidate) through the real CLI: exit code 2, a TaskError that names the task's
file and line, and no verdict stored against the candidate. Runtime faults come from the jailed reference."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.conftest import candidate

# A row softmax like tests/fixtures/tasks/rowsoftmax.py, which tests/fixtures/candidates/good.py computes.
# Line numbers in the tests refer to this text after the replacements they make.
ROWSOFTMAX = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)


batch_size = 4
dim = 64


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''

MANIFEST = 'description = "row softmax"\nseeds = 1\nbackends = ["triton"]\n'


def write_task(tmp_path: Path, source: str = ROWSOFTMAX, manifest: str | None = MANIFEST) -> Path:
    path = tmp_path / "tasks" / "broken.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(textwrap.dedent(source))
    if manifest is not None:
        path.with_suffix(".toml").write_text(manifest)
    return path


def assert_task_error(appliance, code: int, result: dict, where: str, *words: str) -> None:
    assert code == 2, result
    assert set(result) == {"error", "kind"}, result
    assert result["kind"] == "TaskError"
    assert where in result["error"], result["error"]
    for word in words:
        assert word in result["error"], result["error"]
    # A broken task is not the candidate's fault: nothing is recorded.
    assert json.loads(appliance("history", "--json").stdout) == []
    assert json.loads(appliance("runs", "--json").stdout) == []


def test_get_inputs_raising_names_task_file_and_line(appliance, tmp_path):
    source = ROWSOFTMAX.replace(
        "    return [torch.randn(batch_size, dim)]",
        "    x = torch.randn(batch_size, dim)\n    raise ValueError('no inputs today')",
    )
    assert source.splitlines()[18] == "    raise ValueError('no inputs today')"  # line 19
    task = write_task(tmp_path, source)
    code, result = appliance.eval_json(task, candidate("good"))
    assert_task_error(appliance, code, result, f"{task.resolve()}:19", "get_inputs()", "ValueError", "no inputs today")


def test_forward_raising_names_task_file_and_line(appliance, tmp_path):
    source = ROWSOFTMAX.replace(
        "        return torch.softmax(x, dim=-1)",
        "        y = torch.softmax(x, dim=-1)\n        raise RuntimeError('forward is broken')",
    )
    assert source.splitlines()[10] == "        raise RuntimeError('forward is broken')"  # line 11
    task = write_task(tmp_path, source)
    code, result = appliance.eval_json(task, candidate("good"))
    assert_task_error(appliance, code, result, f"{task.resolve()}:11", "Model.forward", "RuntimeError",
                      "forward is broken")


def test_task_syntax_error_names_file_and_line(appliance, tmp_path):
    task = write_task(tmp_path, ROWSOFTMAX.replace("def forward(self, x):", "def forward(self, x)"))
    code, result = appliance.eval_json(task, candidate("good"))
    assert_task_error(appliance, code, result, f"{task}:9", "syntax error")


def test_task_error_without_json_goes_to_stderr(appliance, tmp_path):
    task = write_task(tmp_path, ROWSOFTMAX.replace("def forward(self, x):", "def forward(self, x)"))
    result = appliance("eval", task, candidate("good"), "--device", "cpu")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "error:" in result.stderr and "syntax error" in result.stderr


def test_missing_task_file(appliance, tmp_path):
    task = tmp_path / "nope.py"
    code, result = appliance.eval_json(task, candidate("good"))
    assert_task_error(appliance, code, result, str(task), "no such task file")


def test_missing_candidate_file(appliance, tmp_path):
    task = write_task(tmp_path)
    missing = tmp_path / "candidates" / "missing.py"
    code, result = appliance.eval_json(task, missing)
    assert_task_error(appliance, code, result, str(missing), "no such candidate file")


def test_manifest_with_bad_size_key(appliance, tmp_path):
    manifest = MANIFEST + "\n[small]\nsizes = { batch_size = 2, width = 8 }\n"
    task = write_task(tmp_path, manifest=manifest)
    code, result = appliance.eval_json(task, candidate("good"))
    line = manifest.splitlines().index("sizes = { batch_size = 2, width = 8 }") + 1
    assert_task_error(appliance, code, result, f"{task.with_suffix('.toml')}:{line}", "small.sizes", "'width'")


def test_forward_returning_a_non_tensor_is_a_task_error(appliance, tmp_path):
    task = write_task(tmp_path, ROWSOFTMAX.replace("return torch.softmax(x, dim=-1)", "return {'y': x}"))
    code, result = appliance.eval_json(task, candidate("good"))
    assert_task_error(appliance, code, result, str(task.resolve()), "Model.forward", "returned dict")
