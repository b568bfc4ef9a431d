"""Compare a candidate's outputs with the float64 reference. Runs in the trusted check process only.

Returns a failure as data: {"kind": ..., "reason": ...} or None when every output is within tolerance.
"""

from __future__ import annotations


def compare_outputs(outs: list, refs: list, expected: list[dict], tolerances: dict, where: str) -> dict | None:
    """`expected` holds the eager model's output dtypes/shapes; `where` says which shape and seed."""
    import torch

    if len(outs) != len(refs):
        return _fail("wrong_shape", f"forward returned {len(outs)} output(s), expected {len(refs)} {where}")
    for i, (out, ref, exp) in enumerate(zip(outs, refs, expected)):
        label = f"output {i}" if len(refs) > 1 else "output"
        if tuple(out.shape) != tuple(ref.shape):
            return _fail("wrong_shape", f"{label} has shape {tuple(out.shape)}, expected {tuple(ref.shape)} {where}")
        dtype = str(out.dtype).removeprefix("torch.")
        if dtype != exp["dtype"]:
            return _fail("wrong_dtype", f"{label} has dtype {dtype}, expected {exp['dtype']} {where}")
        tol = tolerances.get(dtype, {"atol": 0.0, "rtol": 0.0})
        failure = _compare_values(out.to(torch.float64), ref.to(torch.float64), tol, f"{label} {where}")
        if failure:
            return failure
    return None


def _compare_values(out, ref, tol: dict, where: str) -> dict | None:
    import torch

    ref_finite = torch.isfinite(ref)
    out_finite = torch.isfinite(out)
    # Non-finite values pass only where the reference has the very same ones (NaN for NaN, +inf for +inf).
    same_nonfinite = (torch.isnan(out) & torch.isnan(ref)) | (torch.isinf(ref) & (out == ref))
    bad = (~out_finite | ~ref_finite) & ~same_nonfinite
    if bad.any():
        idx = _index(bad.nonzero()[0])
        return _fail(
            "nan_inf",
            f"{int(bad.sum())} NaN/Inf value(s) where the reference differs, first at element {idx} "
            f"(got {out[idx].item()}, expected {ref[idx].item()}) {where}",
        )
    both = ref_finite & out_finite
    err = torch.where(both, (out - ref).abs(), torch.zeros_like(ref))
    allowed = tol["atol"] + tol["rtol"] * ref.abs()
    excess = torch.where(both, err - allowed, torch.full_like(ref, -1.0))
    if excess.numel() == 0 or excess.max() <= 0:
        return None
    worst = _index(torch.unravel_index(excess.argmax(), excess.shape))
    n_bad = int((excess > 0).sum())
    return _fail(
        "wrong_output",
        f"max abs err {err[worst].item():.2g} > tol {allowed[worst].item():.2g} {where}, element {worst} "
        f"(got {out[worst].item():.6g}, expected {ref[worst].item():.6g}; "
        f"{n_bad} of {ref.numel()} elements out of tolerance; largest abs err {err.max().item():.2g})",
    )


def _index(idx) -> tuple:
    return tuple(int(i) for i in idx)


def _fail(kind: str, reason: str) -> dict:
    return {"kind": kind, "reason": reason}
