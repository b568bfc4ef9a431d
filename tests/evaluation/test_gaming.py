"""Candidates that game a weak harness: each is rejected and the verdict names the check that fired (some
several checks catch; then any of them).
(CPU versions; the GPU-only patterns - side streams, caching-allocator reuse, events - need the GPU machine.)"""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURES

GAMING = FIXTURES / "gaming"

# name -> (verdict, stage, words in the reason)
CASES = {
    "memo_pointer": ({"wrong_output", "timed_output_mismatch"}, None, []),
    "memo_call_count": ({"wrong_output", "timed_output_mismatch"}, None, []),
    "sniffs_timer": ("timed_output_mismatch", "timing", ["timed call"]),
    "mutates_input": ("input_mutated", "correctness", ["modified input(s) [0] in place"]),
    "lazy_subclass": ("wrong_output", "correctness", ["tensor subclass", "Lazy"]),
    "half_rows": ("wrong_output", "correctness", ["max abs err"]),
    "low_precision": ("wrong_output", "correctness", ["max abs err"]),
    "fallback_token_kernel": ("library_fallback", "correctness", ["reference's own library ops", "_softmax"]),
    "torch_composite": ("library_fallback", "correctness", ["no kernel of its own", "exp"]),
    # Its thread finishes the output after forward returned: the referee's buffers got the unfinished one.
    "deferred_thread": ("wrong_output", "correctness", ["max abs err"]),
    "imports_reference": ("load_error", "load", ["no reference task.py visible"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gaming_candidate_is_rejected_by_the_named_check(appliance, softmax_task, name):
    verdict, stage, words = CASES[name]
    code, result = appliance.eval_json(softmax_task, GAMING / f"{name}.py")
    assert code == 1, result
    verdicts = verdict if isinstance(verdict, set) else {verdict}
    assert result["verdict"] in verdicts and stage in (None, result["stage"]), (result["verdict"], result["reason"])
    for word in words:
        assert word in result["reason"], result["reason"]


# Attacks on the old harness's in-process clock, synchronisation and output files: none of them is anyone's any
# more (the referee owns the clock, the buffers and the record), so each passes at its true time.
HARMLESS_NOW = ["patches_timer", "patches_sync", "forges_output_record"]


@pytest.mark.parametrize("name", HARMLESS_NOW)
def test_patching_its_own_process_changes_nothing(appliance, softmax_task, name):
    code, result = appliance.eval_json(softmax_task, GAMING / f"{name}.py")
    assert (code, result["verdict"]) == (0, "pass"), result["reason"]
    main = next(t for t in result["timings"] if t["shape"] == "main" and t["implementation"] == "candidate")
    assert main["median_ms"] > 0.001 and main["checked_calls"] >= 1, main
