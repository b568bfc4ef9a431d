"""The precision-tied bound (sandbox/harness/compare.py): without a manifest tolerance a candidate may be wrong by at
most PRECISION_FACTOR times what the task's own Model is wrong by in the task's dtype. On real torch arithmetic:
honest kernels with another formula or summation order pass, cheaper wrong ones fail (issue 25's cases)."""

from __future__ import annotations

import pytest
import torch

from sandbox.harness.compare import compare_in_norm, compare_outputs

WHERE = "at shape main, seed 0"


def _check(candidate: torch.Tensor, reference64: torch.Tensor, eager: torch.Tensor, tolerances=None):
    expected = [{"dtype": str(candidate.dtype).removeprefix("torch."), "shape": list(candidate.shape)}]
    failure = compare_outputs([candidate], [reference64], expected, tolerances or {}, WHERE, eager=[eager])
    if failure is None:  # what passes element by element passes the norm form too (a sampled timed call's check)
        assert compare_in_norm([candidate], [reference64], tolerances or {}, WHERE, eager=[eager]) is None
    return failure


@pytest.fixture(scope="module")
def logits() -> torch.Tensor:
    return torch.randn(8, 8192, generator=torch.Generator().manual_seed(0))


def _blocked_softmax(x: torch.Tensor, block: int = 512) -> torch.Tensor:
    """Another honest order: the row max and sum over blocks, accumulated serially, as a tiled kernel does."""
    m = x.reshape(x.shape[0], -1, block).amax(-1).amax(-1, keepdim=True)
    e = torch.exp(x - m)
    total = torch.zeros(x.shape[0], 1)
    for part in e.reshape(x.shape[0], -1, block).unbind(1):
        total = total + part.sum(-1, keepdim=True)
    return e / total


def test_an_honest_softmax_in_another_order_passes(logits):
    r64, eager = torch.softmax(logits.double(), -1), torch.softmax(logits, -1)
    assert _check(_blocked_softmax(logits), r64, eager) is None
    assert _check(eager, r64, eager) is None


def test_a_softmax_off_by_0_2_percent_fails_though_its_outputs_are_near_1e_4(logits):
    r64, eager = torch.softmax(logits.double(), -1), torch.softmax(logits, -1)
    assert float(r64.abs().mean()) < 2e-4  # the old default atol of 1e-4 was as large as the outputs
    assert compare_outputs([eager * 1.002], [r64], [{"dtype": "float32", "shape": list(eager.shape)}],
                           {"float32": {"atol": 1e-4, "rtol": 1e-4}}, WHERE) is None  # what it let through
    failure = _check(eager * 1.002, r64, eager)
    assert failure and failure["kind"] == "wrong_output", failure
    assert "eager Model's own error" in failure["reason"]


def test_an_fp16_shortcut_on_an_fp32_task_fails(logits):
    r64, eager = torch.softmax(logits.double(), -1), torch.softmax(logits, -1)
    shortcut = torch.softmax(logits.half().float(), -1)  # inputs rounded to fp16, then computed in fp32
    assert _check(shortcut, r64, eager)["kind"] == "wrong_output"
    assert _check(torch.softmax(logits.half(), -1).float(), r64, eager)["kind"] == "wrong_output"


def test_a_long_reduction_summed_serially_in_blocks_passes_and_its_fp16_shortcut_fails():
    x = torch.randn(64, 16384, generator=torch.Generator().manual_seed(1))
    r64, eager = x.double().sum(-1), x.sum(-1)
    blocked = torch.zeros(64)
    for part in x.reshape(64, -1, 256).unbind(1):  # 64 partial sums added one after another
        blocked = blocked + part.sum(-1)
    assert _check(blocked, r64, eager) is None
    assert _check(x.half().float().sum(-1), r64, eager)["kind"] == "wrong_output"


def test_a_serial_scan_over_kernelbenchs_cumsum_width_passes_and_its_fp16_shortcut_fails():
    """A fully serial fp32 scan over 32768 values (KernelBench's cumsum, as Triton's interpreter runs tl.cumsum)
    went over a 64-fold accumulation allowance by up to 1.9x: the honest order the bound's `a` term exists for."""
    x = torch.randn(8, 32768, generator=torch.Generator().manual_seed(2))
    r64, eager = x.double().cumsum(-1), x.cumsum(-1)
    serial = torch.from_numpy(x.numpy().cumsum(-1, dtype="float32"))
    assert _check(serial, r64, eager) is None
    assert _check(torch.from_numpy(x.half().float().numpy().cumsum(-1, dtype="float32")), r64, eager)["kind"] == \
        "wrong_output"


def test_tanh_written_out_passes_and_its_fp16_shortcut_fails():
    """1 - 2 / (exp(2x) + 1): the same function as an honest kernel writes it, a few roundings more."""
    x = torch.randn(64, 4096, generator=torch.Generator().manual_seed(3)) * 2.5
    r64, eager = torch.tanh(x.double()), torch.tanh(x)
    assert _check(1 - 2 / (torch.exp(2 * x) + 1), r64, eager) is None
    assert _check(torch.tanh(x.half().float()), r64, eager)["kind"] == "wrong_output"


def test_elementwise_ops_allow_a_few_units_of_roundoff_and_no_more():
    x = torch.linspace(-6, 6, 100_001)
    r64, eager = torch.nn.functional.gelu(x.double()), torch.nn.functional.gelu(x)
    tanh_form = torch.nn.functional.gelu(x, approximate="tanh")  # another formula: not the task's function
    exp_form = x * 0.5 * (1 + torch.erf(x / 2 ** 0.5))  # the same function, written out: a few roundings more
    assert _check(exp_form, r64, eager) is None
    assert _check(tanh_form, r64, eager)["kind"] == "wrong_output"


def test_exact_zeros_need_no_exactness_below_the_outputs_scale():
    x = torch.linspace(-30, 3, 10_000)
    r64, eager = torch.relu(x.double()) + torch.exp(x.double()), torch.relu(x) + torch.exp(x)
    nudged = eager.clone()
    nudged[:100] = 0.0  # exp(-30) ~ 1e-13 flushed to zero: far below the output's own scale (~1)
    assert _check(nudged, r64, eager) is None


def test_a_manifest_tolerance_still_wins(logits):
    r64, eager = torch.softmax(logits.double(), -1), torch.softmax(logits, -1)
    assert _check(eager * 1.002, r64, eager, tolerances={"float32": {"atol": 1e-3, "rtol": 1e-2}}) is None


def test_integers_must_match_exactly():
    r64 = torch.tensor([1, 2, 3], dtype=torch.float64)
    got = torch.tensor([1, 2, 4])
    failure = compare_outputs([got], [r64], [{"dtype": "int64", "shape": [3]}], {}, WHERE, eager=[got])
    assert failure and failure["kind"] == "wrong_output"


# Found by an attacker review: each passed the first version of the bound.

def test_a_bf16_task_refuses_an_fp8_matmul_and_takes_an_honest_one():
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(256, 256, generator=g).bfloat16(), torch.randn(256, 256, generator=g).bfloat16()
    r64, eager = a.double() @ b.double(), a @ b
    assert _check((a.float() @ b.float()).bfloat16(), r64, eager) is None  # fp32 accumulation, bf16 out
    fp8 = (a.to(torch.float8_e4m3fn).float() @ b.to(torch.float8_e4m3fn).float()).bfloat16()
    assert _check(fp8, r64, eager)["kind"] == "wrong_output"


def test_a_few_huge_outputs_do_not_excuse_the_ordinary_ones():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(100_000, generator=g)
    outlier = torch.rand(100_000, generator=g) < 0.001
    x = torch.where(outlier, x * 100, x).clamp(max=80)  # the strided_outliers shape's inputs
    r64, eager = torch.exp(x.double()), torch.exp(x)
    assert _check(torch.exp(x), r64, eager) is None
    assert _check(torch.where(outlier, eager, torch.zeros(())), r64, eager)["kind"] == "wrong_output"


def test_where_eager_overflows_the_model_passes_and_garbage_does_not():
    x = torch.randn(32, 100, generator=torch.Generator().manual_seed(6)) * 100
    r64, eager = torch.cumprod(x.double(), 1), torch.cumprod(x, 1)
    assert (~eager.isfinite() & r64.isfinite()).any()  # inf in fp32, finite in float64
    assert _check(eager, r64, eager) is None
    assert _check(torch.where(eager.isfinite(), eager, torch.zeros(())), r64, eager) is not None


def test_inputs_with_nan_judge_only_what_the_reference_defines():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(7))
    x[::100] = float("nan")
    r64, eager = torch.relu(x.double()), torch.relu(x)
    nan_to_zero = torch.where(x.isnan(), torch.zeros(()), eager)  # a max instruction that drops NaN
    expected = [{"dtype": "float32", "shape": [1000]}]
    assert compare_outputs([nan_to_zero], [r64], expected, {}, WHERE, eager=[eager])["kind"] == "nan_inf"
    assert compare_outputs([nan_to_zero], [r64], expected, {}, WHERE, eager=[eager], defined_only=True) is None
    wrong = nan_to_zero.clone()
    wrong[1] += 1.0
    assert compare_outputs([wrong], [r64], expected, {}, WHERE, eager=[eager], defined_only=True) is not None


# --- a sampled timed call, judged at secretly drawn elements (compare.secret_sample) -------------------------------

def _judged_at_a_sample(candidate, reference64, eager, elements=1 << 12, seed=7):
    from sandbox.harness.compare import secret_sample

    outs, refs, eagers = secret_sample([candidate], [reference64], [eager], elements, seed)
    assert outs[0].numel() == min(elements, candidate.numel())
    expected = [{"dtype": str(candidate.dtype).removeprefix("torch."), "shape": list(outs[0].shape)}]
    return compare_outputs(outs, refs, expected, {}, WHERE, eager=eagers)


def test_a_sample_of_an_honest_output_passes_and_of_a_wrong_one_fails(logits):
    r = torch.softmax(logits.double(), -1)
    e = torch.softmax(logits, -1)
    assert _judged_at_a_sample(_blocked_softmax(logits), r, e) is None
    assert _judged_at_a_sample(e * 1.002, r, e)["kind"] == "wrong_output"


def test_a_sample_finds_a_call_that_skipped_one_row_in_sixty_four(logits):
    """Skipping any part of a call worth time leaves wrong values at ~1/64 of the elements here: 4096 drawn ones
    miss them all with probability (63/64)^4096, about 1e-28."""
    x = logits.repeat(8, 1)  # 64 rows
    r, e = torch.softmax(x.double(), -1), torch.softmax(x, -1)
    skipped = e.clone()
    skipped[37] = torch.softmax(torch.randn(8192, generator=torch.Generator().manual_seed(2)), -1)  # a stale row
    assert _judged_at_a_sample(e, r, e) is None
    for seed in range(5):
        assert _judged_at_a_sample(skipped, r, e, seed=seed)["kind"] == "wrong_output"


def test_the_sample_is_drawn_from_the_secret_seed_and_small_outputs_stay_whole(logits):
    from sandbox.harness.compare import secret_sample

    r, e = torch.softmax(logits.double(), -1), torch.softmax(logits, -1)
    a = secret_sample([e], [r], [e], 1 << 10, seed=1)
    b = secret_sample([e], [r], [e], 1 << 10, seed=1)
    c = secret_sample([e], [r], [e], 1 << 10, seed=2)
    assert torch.equal(a[0][0], b[0][0]) and not torch.equal(a[0][0], c[0][0])
    whole = secret_sample([e], [r], [e], e.numel(), seed=1)
    assert whole[0][0] is e and whole[1][0] is r
    wrong_shape = e[:4]
    kept = secret_sample([wrong_shape], [r], [e], 1 << 10, seed=1)
    assert kept[0][0] is wrong_shape  # judged whole: its check fails on the shape


def test_a_stale_answer_that_differs_at_few_elements_is_missed_by_the_sample_and_caught_in_norm():
    """A mostly constant output (one hot per row): last call's answer left in place differs from the right one at
    two elements of a row, 32 of 1048576, which a sample of 4096 misses (with probability 0.88; this sample does); the
    norm form over all of them does not."""
    x = torch.randn(16, 65536, generator=torch.Generator().manual_seed(8))
    previous = torch.randn(16, 65536, generator=torch.Generator().manual_seed(9))

    def one_hot(v):
        return torch.nn.functional.one_hot(v.argmax(-1), v.shape[-1]).to(v.dtype)

    r64, eager, stale = one_hot(x.double()), one_hot(x), one_hot(previous)
    assert _judged_at_a_sample(stale, r64, eager) is None  # the gap the norm form closes
    assert compare_in_norm([stale], [r64], {}, WHERE, eager=[eager])["kind"] == "wrong_output"
    assert compare_in_norm([eager], [r64], {}, WHERE, eager=[eager]) is None
    ints = compare_in_norm([stale.long()], [r64], {}, WHERE)  # exact outputs: any distance is too much
    assert ints["kind"] == "wrong_output"


def test_the_whole_output_pass_refuses_what_a_sample_misses_a_few_nan_holes_and_one_far_off_element(logits):
    """Found by an attacker review of the sampled checks: four NaN among 65536 elements, or one element off by
    2e-3 where 1e-5 is allowed, passed an L2 norm alone (NaN left out of it; one element's error fits the norm of
    every element's allowance) and any sample that missed them."""
    x = logits.repeat(8, 1)
    r64, eager = torch.softmax(x.double(), -1), torch.softmax(x, -1)
    holes, off = eager.clone(), eager.clone()
    holes.view(-1)[[5, 70_000, 300_001, 524_000]] = float("nan")
    off.view(-1)[123_456] += 2e-3
    assert compare_in_norm([holes], [r64], {}, WHERE, eager=[eager])["kind"] == "nan_inf"
    assert compare_in_norm([off], [r64], {}, WHERE, eager=[eager])["kind"] == "wrong_output"
    manifest = {"float32": {"atol": 1e-5, "rtol": 1e-4}}
    assert compare_in_norm([off], [r64], manifest, WHERE, eager=[eager])["kind"] == "wrong_output"
    assert compare_in_norm([eager], [r64], manifest, WHERE, eager=[eager]) is None


def test_the_whole_output_pass_neither_crashes_on_huge_values_nor_fails_what_sits_on_the_bound():
    """Found by a second review: squares of a one-element chunk's norm overflowed Python floats (the trusted side
    crashed, on an honest float64 output of 1e155), and outputs off by exactly the allowance failed on rounding."""
    huge = torch.tensor([1e155], dtype=torch.float64)
    assert compare_in_norm([huge], [huge.clone()], {}, WHERE, eager=[huge]) is None
    atol = float(torch.tensor(1e-5, dtype=torch.float32))
    manifest = {"float32": {"atol": atol, "rtol": 0.0}}
    on_the_bound, r64 = torch.full((3,), atol), torch.zeros(3, dtype=torch.float64)  # each error exactly atol
    expected = [{"dtype": "float32", "shape": [3]}]
    assert compare_outputs([on_the_bound], [r64], expected, manifest, WHERE) is None
    assert compare_in_norm([on_the_bound], [r64], manifest, WHERE) is None  # (sqrt(3) atol rounded over it)


def test_where_eager_overflowed_the_whole_output_pass_still_judges_the_candidate():
    """An fp16 Model overflows to inf where float64 is finite: a candidate that matches eager there passes, one that
    writes 0 there fails (the per-element rule judges it with no excess; the pass used to leave it out)."""
    x = torch.linspace(-3, 3, 4096, dtype=torch.float64)
    r64 = torch.sinh(x * 4) * 10
    eager = r64.half()
    assert (~eager.isfinite() & r64.isfinite()).any()
    assert compare_in_norm([eager], [r64], {}, WHERE, eager=[eager]) is None
    zeroed = torch.where(eager.isfinite(), eager, torch.zeros((), dtype=torch.float16))
    assert _check(zeroed, r64, eager)["kind"] == "wrong_output"
    assert compare_in_norm([zeroed], [r64], {}, WHERE, eager=[eager])["kind"] == "wrong_output"


# Found by the first review of the sampled checks, kept:

def test_only_outputs_much_larger_than_the_sample_are_judged_at_it():
    """A sample drawn with replacement from an output just larger than it leaves a third unseen: such outputs are
    judged whole."""
    from sandbox.harness.compare import judged_at_a_sample, secret_sample

    assert not judged_at_a_sample(65_537, 65_536) and not judged_at_a_sample(8 * 65_536, 65_536)
    assert judged_at_a_sample(8 * 65_536 + 1, 65_536)
    x = torch.randn(5000, dtype=torch.float64)
    assert secret_sample([x.float()], [x], None, 1000, seed=3)[0][0].numel() == 5000


def test_the_whole_output_pass_holds_a_bf16_output_to_its_own_roundoff():
    """Eager's whole error (its output's rounding included) in the norm let an output rounded through fp8 pass;
    eager's error beyond that rounding does not."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(256, 1024, generator=g).bfloat16()
    r64, eager = torch.nn.functional.gelu(x.double()), torch.nn.functional.gelu(x)
    fp8 = eager.to(torch.float8_e4m3fn).bfloat16()
    assert _check(eager, r64, eager) is None
    assert compare_in_norm([fp8], [r64], {}, WHERE, eager=[eager])["kind"] == "wrong_output"


def test_the_float64_reference_keeps_the_weights_a_lazy_module_drew_in_eagers_first_forward():
    """Two builds of a Model with a lazy layer drew its weights apart (eager and float64 disagreed by 1.85, and the
    bound then let almost anything pass); the reference is a copy made after eager's first forward."""
    from sandbox.harness.referee import Referee

    torch.manual_seed(0)
    eager = torch.nn.LazyLinear(8)
    x = torch.randn(4, 16)
    out = eager(x)
    reference = Referee._float64_copy(eager)
    assert torch.allclose(reference(x.double()), out.double(), atol=1e-6)
    assert eager.weight.dtype == torch.float32  # eager itself left as it was
