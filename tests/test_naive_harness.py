"""The KernelBench-style baseline harness that benchmarks/optimize_suite.py compares the appliance's throughput with."""

import pytest

from benchmarks.naive_harness import run_candidates
from tests.conftest import candidate


@pytest.mark.parametrize("inputs", ["cpu", "device"])
def test_naive_harness_passes_an_honest_candidate_and_fails_a_wrong_one(softmax_task, inputs):
    summary = run_candidates(softmax_task, [candidate("good"), candidate("wrong_shape")], device="cpu",
                             inputs=inputs, log=lambda line: None)
    good, wrong = summary["results"]
    assert good["correct"] and good["median_ms"] > 0, good
    assert not wrong["correct"] and "mismatch" in wrong["error"], wrong
    assert summary["inputs"] == inputs and summary["candidates"] == 2
    assert summary["per_hour"] == pytest.approx(2 / (summary["wall_s"] / 3600), rel=0.05)  # wall_s is rounded


def test_naive_harness_refuses_an_unknown_input_placement(softmax_task):
    with pytest.raises(ValueError, match="inputs must be"):
        run_candidates(softmax_task, [candidate("good")], device="cpu", inputs="gpu")
