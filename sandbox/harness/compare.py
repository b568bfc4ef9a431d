"""Compare a candidate's outputs with the float64 reference. Runs in the trusted check process only.

Returns a failure as data: {"kind": ..., "reason": ...} or None when every output is within tolerance.
"""

from __future__ import annotations


def compare_outputs(outs: list, refs: list, expected: list[dict], tolerances: dict, where: str) -> dict | None:
    """`expected` holds the eager model's output dtypes/shapes; `where` says which shape and seed."""
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
        failure = _compare_values(out, ref, tol, f"{label} {where}")
        if failure:
            return failure
    return None


CHUNK = 1 << 24  # elements compared at once: the comparison's float64 temporaries stay ~1 GiB at any output size


def _compare_values(out, ref, tol: dict, where: str) -> dict | None:
    """In chunks of the flattened outputs, so that the temporaries do not grow with the output (comparing a 1 GiB
    output whole held ~10 GiB of them on a device shared with other evaluations)."""
    import torch

    shape = ref.shape
    out, ref = out.reshape(-1), ref.reshape(-1)

    def chunks():  # converted one at a time: a list of them would hold the whole output in float64 again
        for i in range(0, ref.numel(), CHUNK):
            yield i, out[i:i + CHUNK].to(torch.float64), ref[i:i + CHUNK].to(torch.float64)

    # Non-finite values pass only where the reference has the very same ones (NaN for NaN, +inf for +inf).
    n_bad, first = 0, None
    for start, o, r in chunks():
        same_nonfinite = (o.isnan() & r.isnan()) | (r.isinf() & (o == r))
        bad = (~o.isfinite() | ~r.isfinite()) & ~same_nonfinite
        count = int(bad.sum())
        if count and first is None:
            first = start + int(bad.nonzero()[0, 0])
        n_bad += count
    if n_bad:
        return _fail("nan_inf", f"{n_bad} NaN/Inf value(s) where the reference differs, first at element "
                                f"{_unflat(first, shape)} (got {out[first].item()}, expected {ref[first].item()}) "
                                f"{where}")
    worst, worst_excess, n_out, largest = None, 0.0, 0, 0.0
    for start, o, r in chunks():
        both = o.isfinite() & r.isfinite()
        err = torch.where(both, (o - r).abs(), 0.0)
        excess = torch.where(both, err - (tol["atol"] + tol["rtol"] * r.abs()), -1.0)
        largest = max(largest, float(err.max()))
        n_out += int((excess > 0).sum())
        top = int(excess.argmax())
        if float(excess[top]) > worst_excess:
            worst, worst_excess = start + top, float(excess[top])
    if worst is None:
        return None
    got, expected = out[worst].item(), ref[worst].item()
    allowed = tol["atol"] + tol["rtol"] * abs(expected)
    return _fail(
        "wrong_output",
        f"max abs err {abs(got - expected):.2g} > tol {allowed:.2g} {where}, element {_unflat(worst, shape)} "
        f"(got {got:.6g}, expected {expected:.6g}; {n_out} of {ref.numel()} elements out of tolerance; "
        f"largest abs err {largest:.2g})",
    )


def _unflat(flat: int, shape) -> tuple:
    """A flat element number as an index into `shape`."""
    import torch

    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), shape))


def _fail(kind: str, reason: str) -> dict:
    return {"kind": kind, "reason": reason}
