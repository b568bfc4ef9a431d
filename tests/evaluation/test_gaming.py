"""Candidates that game a weak harness: each is rejected and the verdict names the check that fired.
(CPU versions; the GPU-only patterns - side streams, caching-allocator reuse, events - need the GPU machine.)"""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURES

GAMING = FIXTURES / "gaming"

# name -> (verdict, stage, words in the reason)
CASES = {
    "memo_pointer": ("timed_output_mismatch", "correctness", ["timed call", "rolled"]),
    "memo_call_count": ("timed_output_mismatch", "correctness", ["timed call"]),
    "sniffs_timer": ("timed_output_mismatch", "correctness", ["timed call"]),
    "mutates_input": ("input_mutated", "correctness", ["modified input(s) [0] in place"]),
    "patches_timer": ("tampering", "load", ["time.perf_counter"]),
    "patches_sync": ("tampering", "correctness", ["torch.cuda.synchronize"]),
    "lazy_subclass": ("wrong_output", "correctness", ["tensor subclass", "Lazy"]),
    "half_rows": ("wrong_output", "correctness", ["max abs err"]),
    "low_precision": ("wrong_output", "correctness", ["max abs err"]),
    "fallback_token_kernel": ("library_fallback", "correctness", ["reference's own library ops", "_softmax"]),
    "torch_composite": ("library_fallback", "correctness", ["no kernel of its own", "exp"]),
    "stuffs_outputs": ("tampering", "correctness", ["junk.bin", "larger than its outputs can be"]),
    "forges_output_record": ("wrong_output", "correctness", ["unreadable candidate output", "is not JSON"]),
    "deferred_thread": ("deferred_work", "correctness", ["changed after forward returned"]),
    "imports_reference": ("load_error", "load", ["no reference task.py visible"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gaming_candidate_is_rejected_by_the_named_check(appliance, softmax_task, name):
    verdict, stage, words = CASES[name]
    code, result = appliance.eval_json(softmax_task, GAMING / f"{name}.py")
    assert code == 1, result
    assert (result["verdict"], result["stage"]) == (verdict, stage), result["reason"]
    for word in words:
        assert word in result["reason"], result["reason"]
