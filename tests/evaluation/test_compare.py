"""sandbox.harness.compare.compare_outputs: the trusted check of a candidate's outputs against the float64
reference, |out - ref| <= atol + rtol * |ref| per element, with non-finite values matched exactly."""

from __future__ import annotations

import pytest
import torch

from sandbox.harness.compare import compare_outputs

TOL = {"float32": {"atol": 1e-5, "rtol": 1e-5}, "float16": {"atol": 1e-2, "rtol": 1e-2}}
WHERE = "at shape main (batch_size=2, dim=3), seed 1"
NAN, INF = float("nan"), float("inf")


def ref(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def out(values, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def expected(*tensors: torch.Tensor, dtype: str = "float32") -> list[dict]:
    return [{"dtype": dtype, "shape": list(t.shape)} for t in tensors]


def compare(outs, refs, tol=TOL, exp=None):
    return compare_outputs(outs, refs, exp if exp is not None else expected(*refs), tol, WHERE)


BASE = [[0.1, -2.0, 3.5], [1e-3, 0.0, -7.25]]


def test_identical_outputs_pass():
    assert compare([out(BASE)], [ref(BASE)]) is None


def test_within_tolerance_passes():
    r = ref(BASE)
    o = (r + 0.9 * (1e-5 + 1e-5 * r.abs())).to(torch.float32)  # just inside atol + rtol*|ref|, less float32 rounding
    assert compare([o], [r], tol={"float32": {"atol": 2e-5, "rtol": 1e-5}}) is None


def test_just_outside_tolerance_fails_with_details():
    r = ref(BASE)
    o = r.clone()
    o[1, 2] += 1e-4  # |ref| = 7.25: allowed 1e-5 + 7.25e-5 = 8.25e-5 < 1e-4
    failure = compare([o.to(torch.float32)], [r])
    assert failure["kind"] == "wrong_output"
    reason = failure["reason"]
    assert "max abs err" in reason and "> tol" in reason
    assert "element (1, 2)" in reason
    assert WHERE in reason
    assert "1 of 6 elements out of tolerance" in reason
    assert "expected -7.25" in reason


def test_reports_the_element_that_exceeds_its_tolerance_most():
    r = ref([[1000.0, 1.0]])
    o = r.clone()
    o[0, 0] += 5e-3  # allowed ~1e-2 there: fine
    o[0, 1] += 1e-3  # allowed 2e-5 there: out
    failure = compare([o.to(torch.float32)], [r])
    assert failure["kind"] == "wrong_output" and "element (0, 1)" in failure["reason"]
    assert "1 of 2 elements" in failure["reason"]


def test_rtol_scales_with_reference_magnitude():
    r = ref([1e6, 1.0])
    o = ref([1e6 + 5.0, 1.0])  # abs err 5: far above atol, within rtol * 1e6 = 10
    assert compare([o.to(torch.float32)], [r], tol={"float32": {"atol": 1e-5, "rtol": 1e-5}}) is None
    failure = compare([o.to(torch.float32)], [r], tol={"float32": {"atol": 1e-5, "rtol": 0.0}})
    assert failure["kind"] == "wrong_output" and "element (0,)" in failure["reason"]


def test_tolerance_is_looked_up_by_output_dtype():
    r = ref([1.0, 2.0])
    o = out([1.005, 2.0], torch.float16)  # within float16's 1e-2, far outside float32's 1e-5
    assert compare([o], [r], exp=expected(r, dtype="float16")) is None


def test_dtype_without_tolerance_must_match_exactly():
    r = torch.tensor([1, 2, 3])
    assert compare([torch.tensor([1, 2, 3])], [r], exp=expected(r, dtype="int64")) is None
    failure = compare([torch.tensor([1, 2, 4])], [r], exp=expected(r, dtype="int64"))
    assert failure["kind"] == "wrong_output" and "element (2,)" in failure["reason"]


def test_wrong_number_of_outputs():
    r = ref(BASE)
    failure = compare([out(BASE), out(BASE)], [r])
    assert failure["kind"] == "wrong_shape"
    assert "returned 2 output(s), expected 1" in failure["reason"] and WHERE in failure["reason"]
    assert compare([], [r])["kind"] == "wrong_shape"


def test_wrong_shape():
    r = ref(BASE)
    failure = compare([out(BASE).t()], [r])
    assert failure["kind"] == "wrong_shape"
    assert "shape (3, 2), expected (2, 3)" in failure["reason"] and WHERE in failure["reason"]


def test_wrong_shape_names_the_output_among_several():
    r1, r2 = ref([1.0, 2.0]), ref([[3.0]])
    failure = compare([out([1.0, 2.0]), out([3.0])], [r1, r2])
    assert failure["kind"] == "wrong_shape" and "output 1 has shape (1,)" in failure["reason"]


def test_same_number_of_elements_in_another_shape_is_wrong():
    failure = compare([out([1.0, 2.0, 3.0, 4.0])], [ref([[1.0, 2.0], [3.0, 4.0]])])
    assert failure["kind"] == "wrong_shape"


def test_wrong_dtype():
    r = ref(BASE)
    failure = compare([out(BASE, torch.float16)], [r])
    assert failure["kind"] == "wrong_dtype"
    assert "dtype float16, expected float32" in failure["reason"] and WHERE in failure["reason"]


def test_float64_output_for_a_float32_model_is_wrong_dtype():
    r = ref(BASE)
    assert compare([r.clone()], [r])["kind"] == "wrong_dtype"


def test_nan_where_reference_is_finite():
    r = ref(BASE)
    o = out(BASE)
    o[0, 1] = NAN
    failure = compare([o], [r])
    assert failure["kind"] == "nan_inf"
    assert "1 NaN/Inf" in failure["reason"] and "element (0, 1)" in failure["reason"] and WHERE in failure["reason"]


def test_finite_value_where_reference_is_nan():
    failure = compare([out([1.0, 2.0])], [ref([1.0, NAN])])
    assert failure["kind"] == "nan_inf" and "element (1,)" in failure["reason"]


def test_nan_at_the_same_places_as_the_reference_passes():
    r = ref([[NAN, 1.0], [2.0, NAN]])
    assert compare([out([[NAN, 1.0], [2.0, NAN]])], [r]) is None


def test_nan_at_other_places_than_the_reference_fails():
    failure = compare([out([[1.0, NAN], [2.0, 3.0]])], [ref([[NAN, 1.0], [2.0, 3.0]])])
    assert failure["kind"] == "nan_inf" and "2 NaN/Inf" in failure["reason"]


def test_matching_infinities_pass():
    assert compare([out([INF, -INF, 1.0])], [ref([INF, -INF, 1.0])]) is None


@pytest.mark.parametrize(("got", "want"), [(-INF, INF), (INF, -INF), (INF, 1.0), (NAN, INF), (1e30, INF)])
def test_mismatched_non_finite_values(got, want):
    failure = compare([out([0.5, got])], [ref([0.5, want])])
    assert failure["kind"] == "nan_inf", failure
    assert "element (1,)" in failure["reason"]


def test_non_finite_is_checked_before_tolerance():
    # A NaN and a large error elsewhere: the NaN is the reported problem.
    failure = compare([out([NAN, 100.0])], [ref([1.0, 1.0])])
    assert failure["kind"] == "nan_inf"


def test_scalar_outputs_pass():
    r = torch.tensor(3.25, dtype=torch.float64)
    assert compare([torch.tensor(3.25)], [r]) is None
    assert compare([torch.tensor(3.25 + 1e-6)], [r]) is None


def test_scalar_outputs_fail():
    r = torch.tensor(3.25, dtype=torch.float64)
    failure = compare([torch.tensor(3.5)], [r])
    assert failure["kind"] == "wrong_output"
    assert "max abs err 0.25" in failure["reason"] and "element ()" in failure["reason"] and WHERE in failure["reason"]
    assert compare([torch.tensor(NAN)], [r])["kind"] == "nan_inf"
    assert compare([torch.tensor([3.25])], [r])["kind"] == "wrong_shape"


def test_empty_outputs_pass():
    r = torch.zeros(0, 3, dtype=torch.float64)
    assert compare([torch.zeros(0, 3)], [r]) is None


def test_several_outputs_label_the_failing_one():
    r1, r2 = ref([1.0, 2.0]), ref([3.0, 4.0])
    failure = compare([out([1.0, 2.0]), out([3.0, 4.5])], [r1, r2])
    assert failure["kind"] == "wrong_output" and f"output 1 {WHERE}" in failure["reason"]
    assert compare([out([1.0, 2.0]), out([3.0, 4.0])], [r1, r2]) is None


def test_non_contiguous_outputs_are_compared_by_value():
    r = ref(BASE)
    o = out(BASE).t().contiguous().t()  # same values, column-major strides
    assert not o.is_contiguous()
    assert compare([o], [r]) is None
