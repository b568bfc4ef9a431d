"""Candidates that attack the harness from inside their own process, having read its source: each class of the
issue-24 review (records, harness internals, saved outputs, inputs, checking, provenance, robustness, turns) has one
here, and each is judged by the referee, whose inputs, buffers and clock the candidate's process cannot reach."""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURES

REFEREE = FIXTURES / "referee"

# name -> (verdict, stage, words in the reason)
CASES = {
    "forges_record_at_exit": ("wrong_output", "correctness", ["max abs err"]),
    "rebinds_the_server": ("nan_inf", "correctness", ["NaN/Inf"]),
    "skips_most_timed_calls": ("timed_output_mismatch", "timing", ["timed call"]),
    "late_writer": ("deferred_work", "correctness", ["changed after forward returned"]),
    "corrupts_after_check": ("deferred_work", "correctness", ["changed after forward returned"]),
    "answers_before_the_work": ("timed_output_mismatch", "timing", ["timed call"]),
    "places_outside_the_arena": ("protocol_error", "correctness", ["placed an output at"]),  # CPU: no arena
    "composed_token_kernel": ("library_fallback", "correctness", ["composed library ops", "exp"]),
    "hides_library_from_the_recorder": ("library_fallback", "correctness", ["fewer kernels of their own"]),
    "garbage_answers": ("protocol_error", "load", ["broke the protocol", "not a JSON message"]),
    # Found by review: a list as the verdict crashed the referee (charged to the infrastructure).
    "unhashable_verdict": ("protocol_error", "load", ["broke the protocol"]),
    # Found by review: a launch count of 10**400 overflowed the referee's float arithmetic (a crash of the trusted side).
    "huge_launch_count": ("protocol_error", "correctness", ["no record of what forward ran"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_candidate_attacking_the_harness_gets_the_named_verdict(appliance, softmax_task, name):
    verdict, stage, words = CASES[name]
    code, result = appliance.eval_json(softmax_task, REFEREE / f"{name}.py")
    assert code == 1, result
    assert (result["verdict"], result["stage"]) == (verdict, stage), result["reason"]
    for word in words:
        assert word in result["reason"], result["reason"]


def test_the_kernel_server_holds_no_device_turn_pipes(softmax_task, tmp_path):
    """The referee takes the device turns (sandbox/gate.py); the candidate's process has no pipe to the gate."""
    from appliance.evaluation.pipeline import EvalSettings, Pipeline
    from appliance.tasks import load_task
    from sandbox.jail import Jail

    pipeline = Pipeline(Jail(), EvalSettings(device="cpu", baselines=("eager",), timing_budget_s=0.05,
                                             jobs_dir=tmp_path))
    outcome = pipeline.evaluate(load_task(softmax_task), REFEREE / "holds_a_turn.py")
    pipeline.close()
    assert outcome.verdict == "pass", outcome.reason
    assert outcome.details["device_turns"]["turns"] > 0  # the referee took turns
    line = next(ln for ln in outcome.details["candidate_stderr"].splitlines() if ln.startswith("TURN_ENV"))
    assert "TURN_ENV []" in line, line
    fds = eval(line.split("FDS", 1)[1])  # noqa: S307 - our own fixture's printout of a dict
    assert not [t for fd, t in fds.items() if fd > 2 and t.startswith("pipe:")], fds  # the socket, nothing else
    assert sum(t.startswith("socket:") for t in fds.values()) == 1, fds


def test_stale_answers_after_the_first_timed_calls_are_caught_by_the_sampled_checks(softmax_task, tmp_path):
    """A shape's first sampled timed call is judged whole, the others in norm form and at a secret sample of
    elements (here 16 of the 256 of the main shape's output, as 65536 of a full-size one): a candidate honest until
    that first check has passed is caught there."""
    from appliance.evaluation.pipeline import EvalSettings, Pipeline
    from appliance.tasks import load_task
    from sandbox.jail import Jail

    pipeline = Pipeline(Jail(), EvalSettings(device="cpu", baselines=("eager",), timing_budget_s=1.0,
                                             jobs_dir=tmp_path, checked_elements=16))
    try:
        outcome = pipeline.evaluate(load_task(softmax_task), REFEREE / "stale_answers_after_warming_up.py")
    finally:
        pipeline.close()
    assert outcome.verdict == "timed_output_mismatch", outcome.reason
    assert "secretly drawn elements" in outcome.reason, outcome.reason  # (not the first check, judged whole)
    honest = Pipeline(Jail(), EvalSettings(device="cpu", baselines=("eager",), timing_budget_s=1.0,
                                           jobs_dir=tmp_path, checked_elements=16))
    try:
        outcome = honest.evaluate(load_task(softmax_task), FIXTURES / "candidates" / "good.py")
    finally:
        honest.close()
    assert outcome.verdict == "pass", outcome.reason
    main = next(t for t in outcome.timings if t["shape"] == "main" and t["implementation"] == "candidate")
    assert main["checked_calls"] > 1 and main["checked_elements_after_the_first"] == 16
    # Where the timing stage went (evidence): every phase, the checks' parts within the checks
    spent = main["referee_s"]
    assert {"batches", "checks", "calibrate", "estimate", "first_call", "batch.windows", "checks.forwards",
            "checks.compare", "checks.draw_inputs"} <= set(spent), spent
    assert spent["checks.forwards"] + spent["checks.compare"] + spent["checks.draw_inputs"] <= spent["checks"] + 1e-3
    assert spent["batch.windows"] > 0 and spent["checks"] > 0
    assert main["fused_compare"] == 0  # (the CPU: torch's passes)
