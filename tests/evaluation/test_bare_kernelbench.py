"""A bare KernelBench file gets the full gate (issue 25): derived shapes and inputs, and the precision-tied bound.
Each wrong kernel here passed the old gate (only the main shape, only get_inputs()'s own values, atol 1e-4); each is
an honest Triton softmax changed in one place."""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURES

GOOD = (FIXTURES / "candidates" / "good.py").read_text()
TASK = FIXTURES / "bare" / "rowsoftmax.py"

# name -> (the change to the honest kernel, the verdict, the shape it fails at)
WRONG = {
    "hard_coded_to_the_main_shape": (
        [("mask = cols < n_cols", "mask = cols < 128"),
         ("BLOCK=triton.next_power_of_2(x.shape[1])", "BLOCK=128")],
        # The unwritten tail of the output is uninitialised memory: numbers or, at times, NaN.
        ("wrong_output", "runtime_error", "nan_inf"), "odd"),
    "nan_on_large_inputs": (
        [("e = tl.exp(x - tl.max(x, axis=0))",
          'e = tl.where(mask & (tl.abs(x) > 50.0), float("nan"), tl.exp(x - tl.max(x, axis=0)))')],
        ("nan_inf",), "smaller_scaled"),
    "scaled_by_1_002": ([("e / tl.sum(e, axis=0)", "e / tl.sum(e, axis=0) * 1.002")], ("wrong_output",), "main"),
    "fp16_rounded_inputs": ([("e = tl.exp(", "x = x.to(tl.float16).to(tl.float32)\n    e = tl.exp(")],
                            ("wrong_output",), "main"),
}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    from appliance.evaluation.pipeline import EvalSettings, Pipeline
    from sandbox.jail import Jail

    p = Pipeline(Jail(), EvalSettings(device="cpu", baselines=("eager",), timing_budget_s=0.05, reuse_inputs=True,
                                      jobs_dir=tmp_path_factory.mktemp("jobs")))
    yield p
    p.close()


@pytest.fixture(scope="module")
def task():
    from appliance.tasks import load_task

    t = load_task(TASK)
    assert t.manifest_path is None
    return t


def test_the_honest_kernel_passes_every_derived_shape(pipeline, task):
    outcome = pipeline.evaluate(task, FIXTURES / "candidates" / "good.py")
    assert outcome.verdict == "pass", outcome.reason
    shapes = {s["name"]: s for s in outcome.details["shapes"]}
    assert set(shapes) == {"main", "odd", "smaller_scaled", "strided_outliers", "nonfinite",
                           "aligned_padded"}
    odd = shapes["odd"]["sizes"]  # (the sizes this evaluation drew: dim 128 -> an odd value in 129..143)
    assert odd["batch_size"] == 8 and odd["dim"] % 2 == 1 and 128 < odd["dim"] <= 143, odd
    assert shapes["odd"]["origin"].startswith("derived")
    assert shapes["strided_outliers"]["layout"] == "strided" and shapes["nonfinite"]["distribution"] == "nonfinite"
    checked = {(c["shape"], c["seed"]) for c in outcome.details["cases"]}
    assert {name for name, _ in checked} == set(shapes)  # every one checked, at every seed
    assert {t["shape"] for t in outcome.timings} == {"main"}  # derived shapes are checked, never timed


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_wrong_kernel_fails_at_the_shape_or_bound_that_finds_it(pipeline, task, tmp_path, name):
    changes, verdicts, shape = WRONG[name]
    source = GOOD
    for old, new in changes:
        assert old in source
        source = source.replace(old, new)
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    outcome = pipeline.evaluate(task, path)
    assert outcome.verdict in verdicts, outcome.reason
    assert f"at shape {shape} " in outcome.reason, outcome.reason


def _honest_kernel_on_a_model_that_also(check: str, tmp_path):
    """The honest kernel's outcome on the bare task whose Model first runs `check` (an assert line)."""
    from appliance.tasks import load_task
    from appliance.evaluation.pipeline import EvalSettings, Pipeline
    from sandbox.jail import Jail

    path = tmp_path / "checked.py"
    path.write_text(TASK.read_text().replace("        return torch.softmax(x, dim=-1)",
                                             f"        {check}\n        return torch.softmax(x, dim=-1)"))
    pipeline = Pipeline(Jail(), EvalSettings(device="cpu", baselines=("eager",), timing_budget_s=0.05,
                                             jobs_dir=tmp_path / "jobs"))
    try:
        return pipeline.evaluate(load_task(path), FIXTURES / "candidates" / "good.py")
    finally:
        pipeline.close()


def test_a_derived_shape_the_reference_cannot_run_is_dropped_and_listed(tmp_path):
    outcome = _honest_kernel_on_a_model_that_also("assert x.shape[-1] % 2 == 0, 'an even width only'", tmp_path)
    assert outcome.verdict == "pass", outcome.reason
    dropped = {d["name"]: d for d in outcome.details["dropped_shapes"]}
    assert set(dropped) == {"odd", "smaller_scaled", "strided_outliers", "nonfinite"}  # 143 and 33: odd widths
    assert "an even width only" in dropped["odd"]["reason"]


def test_a_derived_shape_whose_float64_reference_cannot_run_is_dropped_too(tmp_path):
    """The checks compare with the Model in float64: a derived shape where only that fails (here a Model that
    refuses odd widths in float64) is dropped and listed, not turned into a task error for every candidate."""
    outcome = _honest_kernel_on_a_model_that_also(
        "assert x.dtype != torch.float64 or x.shape[-1] % 2 == 0, 'no odd widths in float64'", tmp_path)
    assert outcome.verdict == "pass", outcome.reason
    dropped = {d["name"]: d for d in outcome.details["dropped_shapes"]}
    assert set(dropped) == {"odd", "smaller_scaled", "strided_outliers", "nonfinite"}
    assert "no odd widths in float64" in dropped["odd"]["reason"] and "float64 reference" in dropped["odd"]["reason"]


# An attacker review's wrong kernels for problems of benchmarks/bare/ (each passed the gate before the change named):
# name -> (problem, the verdict, the shape it fails at)
REPO = FIXTURES.parent.parent
ATTACKS = {
    "rowsum_oneblock": ("row_sum", "wrong_output", "odd"),  # derived sizes now go above the file's
    "rowmin_other0": ("row_min", "wrong_output", "smaller_scaled"),  # the x100 inputs now shifted off zero
    "rowsum_stride": ("row_sum", "wrong_output", "strided_outliers"),  # rows further apart than 2 x their width
    "gelu_fingerprint": ("gelu_gate_add", "wrong_output", "odd"),  # the checks' inputs under secret seeds
    "rowsum_aligned": ("row_sum", "wrong_output", "aligned_padded"),  # a width of 16 x odd: even, no power of 2
    "rowsum_pitch": ("row_sum", "wrong_output", "aligned_padded"),  # inner stride 1, rows further apart than wide
    "l2n_detect": ("l2_normalize", "wrong_output", "odd"),  # exact at the sizes the rules name: drawn in secret now
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_an_attackers_wrong_kernel_on_a_bare_problem_is_caught(pipeline, tmp_path, name):
    from appliance.tasks import load_task

    problem, verdict, shape = ATTACKS[name]
    outcome = pipeline.evaluate(load_task(REPO / "benchmarks" / "bare" / f"{problem}.py"),
                                FIXTURES / "bare" / "attacks" / f"{name}.py")
    assert outcome.verdict == verdict, outcome.reason
    assert f"at shape {shape} " in outcome.reason, outcome.reason


def _l2n_variant(tmp_path, name: str, lowp: str):
    """l2n_detect.py (exact where `lowp` is false, bf16 elsewhere) with another condition for bf16."""
    path = tmp_path / f"{name}.py"
    source = (FIXTURES / "bare" / "attacks" / "l2n_detect.py").read_text()
    path.write_text(source.replace("lowp = tuple(x.shape) not in _CHECKED", f"lowp = {lowp}"))
    return path


def _secret_where(condition) -> bytes:
    """A key whose draws for l2_normalize's width (4096) meet `condition(draw)`: an evaluation made predictable."""
    from appliance.tasks import secret_draw

    return next(key for key in (i.to_bytes(16, "little") for i in range(1000)) if condition(secret_draw(key)))


@pytest.mark.slow
def test_a_fast_path_for_multiples_of_32_meets_an_aligned_size_it_could_not_foresee(pipeline, monkeypatch):
    """The third review's kernel (exact at 16 x odd widths, wrong at other multiples of 32) passed while aligned sizes
    were 16 x odd only; with 32, 64 or 128 x odd drawn (3 evaluations in 4) it is caught there."""
    from appliance.tasks import aligned_size, load_task

    key = _secret_where(lambda draw: aligned_size(4096, draw) % 32 == 0)
    monkeypatch.setattr(pipeline, "_derived_secret", lambda: key)
    outcome = pipeline.evaluate(load_task(REPO / "benchmarks" / "bare" / "l2_normalize.py"),
                                FIXTURES / "bare" / "attacks" / "l2n_mult32.py")
    assert outcome.verdict == "wrong_output" and "at shape aligned_padded " in outcome.reason, outcome.reason


@pytest.mark.slow
def test_sizes_learned_from_one_evaluation_say_nothing_of_the_next(pipeline, tmp_path, monkeypatch):
    """The third review learned an evaluation's derived sizes from its own failure reason, and a kernel exact only at
    them passed the next evaluation while a worker drew them once. Each evaluation draws its own now."""
    from appliance.tasks import load_task, odd_size

    task = load_task(REPO / "benchmarks" / "bare" / "l2_normalize.py")
    shown = task.shapes("small", _secret_where(lambda draw: True))  # what one evaluation showed
    learned = {tuple(s.sizes.values()) for s in shown}
    learned_odd = next(s.sizes["dim"] for s in shown if s.name == "odd")
    key = _secret_where(lambda draw: odd_size(4096, draw) != learned_odd)
    monkeypatch.setattr(pipeline, "_derived_secret", lambda: key)
    outcome = pipeline.evaluate(task, _l2n_variant(tmp_path, "l2n_learned", f"tuple(x.shape) not in {learned!r}"))
    assert outcome.verdict == "wrong_output" and "at shape odd " in outcome.reason, outcome.reason


# Wrong kernels that still pass (known gaps, each named): name -> (problem, its condition for bf16, why it passes)
GAPS = {
    "l2n_far": ("l2_normalize", "x.shape[1] > 4608", "no derived size is more than an eighth above the file's (4096 + "
                "4096 / 8 = 4608): a kernel wrong only at much larger sizes is never checked there"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=f"known gap: {why}"))
                                  for n, (_, _, why) in sorted(GAPS.items())])
def test_a_wrong_kernel_the_gate_still_misses_is_caught(pipeline, tmp_path, name):
    from appliance.tasks import load_task

    problem, lowp, _ = GAPS[name]
    outcome = pipeline.evaluate(load_task(REPO / "benchmarks" / "bare" / f"{problem}.py"),
                                _l2n_variant(tmp_path, name, lowp))
    assert outcome.verdict != "pass", outcome.reason
