"""The whole path task -> jailed candidate -> verdict -> database, for honest and broken candidates."""

from __future__ import annotations

import pytest

from tests.conftest import candidate

# name -> (verdict, stage, words the reason must contain)
REJECTED = {
    "slightly_off": ("wrong_output", "correctness", ["max abs err", "> tol", "seed"]),
    "wrong_shape": ("wrong_shape", "correctness", ["shape (4, 63)", "expected (4, 64)"]),
    "nan": ("nan_inf", "correctness", ["NaN/Inf", "element (0, 0)"]),
    "wrong_dtype": ("wrong_dtype", "correctness", ["float16", "expected float32"]),
    "not_a_tensor": ("wrong_output", "correctness", ["returned dict"]),
    "raises": ("runtime_error", "correctness", ["ValueError", "boom from the candidate", "raises.py line 26"]),
    "syntax_error": ("load_error", "load", ["syntax error", "line 24"]),
    "no_modelnew": ("load_error", "load", ["no class ModelNew"]),
    "wrong_forward_arity": ("load_error", "load", ["ModelNew.forward takes 2", "Model takes 1", "get_inputs()"]),
    "compile_error": ("compile_error", "compile", ["power of 2", "compile_error.py line 16"]),
    "edge_wrong": ("wrong_output", "correctness", ["shape odd", "batch_size=3, dim=37"]),
    "segfaults": ("crashed", "correctness", ["SIGSEGV"]),
    "exits_early": ("crashed", "correctness", ["exited with code 0 before reporting"]),
    "uses_cupy": ("backend_not_allowed", "load", ["cupy", "allows triton"]),
}


def test_honest_candidate_passes_and_is_stored(appliance, softmax_task):
    code, result = appliance.eval_json(softmax_task, candidate("good"))
    assert code == 0, result
    assert result["verdict"] == "pass" and result["stage"] == "done"
    assert result["jailed"] is True and result["device"] == "cpu" and result["mode"] == "small"
    shapes = {(t["shape"], t["implementation"]) for t in result["timings"]}
    assert shapes == {(s, i) for s in ("main", "odd", "single") for i in ("candidate", "eager")}
    assert all(t["device"] == "cpu" and t["median_ms"] > 0 and t["iqr_ms"] >= 0 for t in result["timings"])
    assert result["speedup_vs_eager"] > 0
    assert result["environment"]["torch"] and result["environment"]["triton"]

    history = appliance("history", "--json")
    rows = __import__("json").loads(history.stdout)
    assert [r["id"] for r in rows] == [result["evaluation_id"]]
    assert rows[0]["verdict"] == "pass" and rows[0]["task_name"] == "rowsoftmax"


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_broken_candidate_gets_specific_verdict(appliance, softmax_task, name):
    verdict, stage, words = REJECTED[name]
    code, result = appliance.eval_json(softmax_task, candidate(name))
    assert code == 1, result
    assert (result["verdict"], result["stage"]) == (verdict, stage), result["reason"]
    for word in words:
        assert word in result["reason"], result["reason"]
    # Stored like any other evaluation, and nothing timed for a rejected candidate.
    assert result["evaluation_id"] and result["timings"] == []
    if name in ("syntax_error", "no_modelnew", "wrong_forward_arity"):  # judged from the text: nothing prepared
        assert "prepare" not in (result.get("wall_s") or {}), result.get("wall_s")


@pytest.mark.slow
def test_load_inline_candidate_builds_in_the_jail(appliance, softmax_task, tmp_path):
    # The fixture task allows only Triton; a copy of it allows load_inline too (backend "cuda").
    task = tmp_path / "rowsoftmax.py"
    task.write_text(softmax_task.read_text())
    manifest = softmax_task.with_suffix(".toml").read_text().replace('backends = ["triton"]', 'backends = ["cuda"]')
    task.with_suffix(".toml").write_text(manifest)
    code, result = appliance.eval_json(task, candidate("inline_cpp_softmax"))
    assert code == 0, result["reason"]
    code, result = appliance.eval_json(task, candidate("inline_cpp_compile_error"))
    assert (result["verdict"], result["stage"]) == ("compile_error", "compile"), result["reason"]
    assert "Error building extension" in result["reason"]
