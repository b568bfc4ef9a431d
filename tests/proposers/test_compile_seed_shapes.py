"""The compile seed at the shapes a bare file is checked at: KernelBench's tuple sizes are derived with the ints
they match, and a derived shape the task's own Model cannot run gets no graph (the referee drops it too) instead
of costing the whole seed. Real jail, real torch.compile on the CPU."""

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


def test_the_seed_skips_derived_shapes_the_reference_cannot_run_and_says_so(tmp_path):
    path = tmp_path / "hinge.py"
    path.write_text(HINGE)
    seed = compile_seed(load_task(path), Jail(), tmp_path / "jobs", "cpu", "small")
    assert seed.source is not None, seed.failure
    assert "shapes main" in seed.note and "which the reference cannot run" in seed.note, seed.note
    assert all(name in seed.note for name in ("odd", "smaller_scaled", "strided_outliers", "nonfinite"))
