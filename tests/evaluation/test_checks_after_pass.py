"""The checks of a record the referee passed (appliance/evaluation/pipeline.py, in order: library fallback, impossible,
measured again), each a named Rejection, on trusted records as the referee writes them. The whole path through
jailed processes is covered by the fixtures' tests (test_gaming, test_referee, test_evidence); here, the decisions."""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURES


def _passed(candidate_ms: float, compile_ms: float, again: dict | None = None, provenance: dict | None = None,
            ceilings: dict | None = None, flops=None, nbytes=None):
    from appliance.evaluation.pipeline import Passed
    from appliance.tasks import load_task

    task = load_task(FIXTURES / "tasks" / "rowsoftmax.py")
    rows = [{"shape": "main", "implementation": "candidate", "median_ms": candidate_ms, "flops": flops,
             "bytes": nbytes},
            {"shape": "main", "implementation": "compile", "median_ms": compile_ms}]
    calls = []

    def measure_again():
        calls.append(1)
        return again or {"status": "ok", "timings": {"main": {"median_ms": candidate_ms}}}, _run(0)

    details = {"provenance": provenance or {"ops": [], "own_launches": 1}}
    prepared = {"shapes": [{"name": "main", "ops": ["aten::_softmax"]}]}
    referee = {"timings": {"main": {"launches_per_call_min": 1}}}
    return Passed(task, prepared, referee, rows, ceilings, details, measure_again), calls


@pytest.fixture
def pipeline(tmp_path):
    from appliance.evaluation.pipeline import EvalSettings, Pipeline
    from sandbox.jail import Jail

    p = Pipeline(Jail(), EvalSettings(device="cpu", baselines=("eager",), jobs_dir=tmp_path))
    yield p
    p.close()


def test_a_modest_speedup_is_not_measured_again(pipeline):
    passed, calls = _passed(1.0, 5.0)
    assert pipeline._holds_when_measured_again(passed) is None
    assert not calls


def test_a_large_speedup_that_holds_reports_the_slower_of_the_two_times(pipeline):
    passed, calls = _passed(0.1, 10.0, again={"status": "ok", "timings": {"main": {"median_ms": 0.11}}})
    assert pipeline._holds_when_measured_again(passed) is None
    assert calls and passed.timings[0]["median_ms"] == 0.11
    assert passed.details["second_measurement"] == {"status": "ok", "median_ms": 0.11}


@pytest.mark.parametrize("again", [{"status": "ok", "timings": {"main": {"median_ms": 0.5}}},
                                   {"status": "rejected", "verdict": "wrong_output", "stage": "correctness",
                                    "reason": "max abs err"},
                                   {"status": "ok", "timings": {}}])
def test_a_large_speedup_that_does_not_hold_is_a_timing_mismatch(pipeline, again):
    passed, _ = _passed(0.1, 10.0, again=again)
    rejection = pipeline._holds_when_measured_again(passed)
    assert (rejection.verdict, rejection.stage, rejection.check) == ("timing_mismatch", "timing", "measured_again")
    assert "100x" in rejection.reason


def test_library_fallback_and_impossible_are_named_checks():
    from appliance.evaluation.pipeline import _impossible, _library_fallback

    passed, _ = _passed(1.0, 1.0, provenance={"ops": ["aten::_softmax"], "own_launches": 0})
    assert _library_fallback(passed).check == "library_fallback"
    from tests.evaluation.test_evidence import H200_LIKE

    passed, _ = _passed(1e-6, 1.0, ceilings=H200_LIKE, nbytes=1 << 30)  # a GiB in a nanosecond
    rejection = _impossible(passed)
    assert rejection is not None, "a GiB moved in a nanosecond passed"
    assert (rejection.verdict, rejection.check) == ("impossible", "impossible")
    assert rejection.reason.endswith("at shape main")


def test_the_referee_and_the_jail_name_themselves():
    from appliance.evaluation.verdicts import verdict_of

    run = _run(0)
    rejected = {"status": "rejected", "verdict": "wrong_output", "stage": "correctness", "reason": "max abs err"}
    assert verdict_of(rejected, run, 60.0).check == "referee"
    gone = verdict_of({"status": "server_gone", "stage": "timing", "reason": "went away"},
                      _run(-9), 60.0)
    assert (gone.verdict, gone.check) == ("crashed", "jail")



def _run(returncode: int):
    from sandbox.jail import JailResult

    return JailResult(returncode=returncode, timed_out=False, wall_s=0.0, stdout="", stderr="", jailed=True)
