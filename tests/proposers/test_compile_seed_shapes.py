"""The compile seed of a bare file: KernelBench's tuple sizes are derived with the ints they match, and the seed is
captured at the timed shapes only (the derived sizes are drawn per evaluation). Real jail, real torch.compile on
the CPU."""

from __future__ import annotations

from appliance.proposers.compile_seed import compile_seed
from appliance.tasks import load_task
from sandbox.jail import Jail

# KernelBench's hinge-loss layout: a tuple size beside an int size of the same value, broadcast together.
HINGE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, predictions, targets):
        assert predictions.shape[-1] % 2 == 0, "even widths only"
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))


batch_size = 32
input_shape = (32,)


def get_inputs():
    return [torch.randn(batch_size, *input_shape), torch.randint(0, 2, (batch_size,)).float() * 2 - 1]


def get_init_inputs():
    return []
'''


def test_tuple_sizes_are_derived_with_the_ints_they_match(tmp_path):
    path = tmp_path / "hinge.py"
    path.write_text(HINGE)
    shapes = {s.name: s.sizes for s in load_task(path).shapes("full")}
    assert shapes["main"] == {"batch_size": 32, "input_shape": (32,)}
    assert shapes["odd"] == {"batch_size": 35, "input_shape": (35,)}  # still broadcast together
    assert shapes["smaller_scaled"] == {"batch_size": 9, "input_shape": (9,)}


def test_the_seed_captures_the_timed_shapes_only_and_runs_the_model_at_the_derived_ones(tmp_path):
    """A bare file's derived sizes are drawn for each evaluation: a graph captured at the rules' sizes would never be
    used (and the rules' odd sizes are ones this Model refuses). The seed is captured at `main` alone."""
    path = tmp_path / "hinge.py"
    path.write_text(HINGE)
    seed = compile_seed(load_task(path), Jail(), tmp_path / "jobs", "cpu", "small")
    assert seed.source is not None, seed.failure
    assert "shapes main)" in seed.note and "cannot run" not in seed.note, seed.note
    assert not any(name in seed.note for name in ("odd", "smaller_scaled", "strided_outliers", "nonfinite"))
    assert "return super().forward(*inputs)" in seed.source  # any shape it has no graph for: the task's Model
