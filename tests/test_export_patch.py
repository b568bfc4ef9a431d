"""The export's drop-in patch on its own (appliance/export.py drop_in_patch): GNU patch applies it exactly, the task
module keeps working with the winner as Model, and names or characters from a task or a winner cannot break it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from appliance.errors import ApplianceError
from appliance.export import drop_in_patch

TASK = '''"""A task whose docstring says: class Model is the reference."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()  # KernelBench's style

    def forward(self, x):
        return x * 2


def helper():
    return "kept"


def get_inputs():
    return [torch.ones(3)]


def get_init_inputs():
    return []
'''
WINNER = ("import torch.nn as nn\n# a form feed \x0c and a line separator \u2028 in a comment\n"
          "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x + x")  # no final newline


def apply(tmp_path, task: str, winner: str) -> subprocess.CompletedProcess:
    (tmp_path / "t.py").write_text(task)
    (tmp_path / "t.patch").write_text(drop_in_patch(task, winner, "t", "run 1, candidate c2"), newline="")
    return subprocess.run(["patch", "-p1", "-s", "-i", "t.patch"], cwd=tmp_path, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)


def test_the_patch_applies_exactly_and_the_module_runs_the_winner_as_model(tmp_path):
    done = apply(tmp_path, TASK, WINNER)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "t_optimized.py").read_bytes().decode() == WINNER
    check = ("import t, torch; m, r = t.Model(), t.ReferenceModel(); "
             "assert type(m).__name__ == 'ModelNew' and t.helper() == 'kept'; "
             "torch.testing.assert_close(m(*t.get_inputs()), r(*t.get_inputs())); print('ok')")
    ran = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ran.stdout.strip() == "ok", ran.stderr[-1500:]  # super(Model, self) in the reference still works


def test_a_name_that_is_no_module_name_gets_no_patch():
    with pytest.raises(ApplianceError, match="cannot name a module"):
        drop_in_patch(TASK, WINNER, 'x"\nimport os', "run 1")
