"""Compare a candidate's outputs with the float64 reference. Runs in the trusted referee only.

Two rules, per output dtype:
- **explicit** (a manifest's `[tolerance.<dtype>]`): |c - r| <= atol + rtol * |r| per element;
- **precision-tied** (the default for floating outputs): the candidate may be wrong by at most PRECISION_FACTOR
  times what the task's own Model is wrong by in the task's dtype, on the same inputs. Per element,

      |c - r| <= k * (max(|e - r|, rms(e - r)) + u * |r| + u * rms(r))

  where r is the float64 reference, e the eager Model in the task's dtype, u the output dtype's unit roundoff and
  rms taken over the whole output. max(|e - r|, rms(e - r)) is the norm form: a reduction's honest error is noise
  of the eager error's size, and an element where eager happens to be exact must not demand exactness; u * |r|
  allows a few rounding steps more than eager's (another formula, another summation order); u * rms(r) is the
  floor near zero, scaled to the output, so that no absolute tolerance can exceed the outputs themselves (a
  softmax over 8192 columns has outputs near 1e-4: an atol of 1e-4 let any few-percent error through).
  k = 64 lets an honest kernel be an order of magnitude less accurate than torch's cascade summation, while a
  0.2% error on an fp32 output (about 3e4 units of roundoff) or an fp16 shortcut in an fp32 task (2^13 units)
  is over it by a factor of tens to hundreds.
Integer and bool outputs must match exactly. Non-finite values pass only where the reference has the very same.

Returns a failure as data: {"kind": ..., "reason": ...} or None when every output is within its bound.
"""

from __future__ import annotations

PRECISION_FACTOR = 64.0
UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def compare_outputs(outs: list, refs: list, expected: list[dict], tolerances: dict, where: str,
                    eager: list | None = None, margins: list | None = None) -> dict | None:
    """`expected` holds the eager model's output dtypes/shapes; `tolerances` the manifest's explicit ones, by
    dtype; `eager` the eager model's outputs in the task's dtype on the same inputs (the precision-tied rule);
    `where` says which shape and seed. `margins`, when given, gets each output's largest error as a fraction of
    its bound (how close an honest kernel came to failing)."""
    if len(outs) != len(refs):
        return _fail("wrong_shape", f"forward returned {len(outs)} output(s), expected {len(refs)} {where}")
    for i, (out, ref, exp) in enumerate(zip(outs, refs, expected)):
        label = f"output {i}" if len(refs) > 1 else "output"
        if tuple(out.shape) != tuple(ref.shape):
            return _fail("wrong_shape", f"{label} has shape {tuple(out.shape)}, expected {tuple(ref.shape)} {where}")
        dtype = str(out.dtype).removeprefix("torch.")
        if dtype != exp["dtype"]:
            return _fail("wrong_dtype", f"{label} has dtype {dtype}, expected {exp['dtype']} {where}")
        if dtype in tolerances:
            bound = _Explicit(**tolerances[dtype])
        elif dtype in UNIT_ROUNDOFF and eager is not None:
            bound = _PrecisionTied(eager[i], ref, UNIT_ROUNDOFF[dtype])
        else:
            bound = _Explicit(0.0, 0.0)  # integers, bools: exact
        failure = _compare_values(out, ref, bound, f"{label} {where}", margins)
        if failure:
            return failure
    return None


class _Explicit:
    def __init__(self, atol: float, rtol: float):
        self.atol, self.rtol = atol, rtol

    def allowed(self, start: int, r):
        return self.atol + self.rtol * r.abs()

    def describe(self) -> str:
        return f"atol {self.atol:g} + rtol {self.rtol:g} * |expected|"


class _PrecisionTied:
    def __init__(self, eager, ref, u: float):
        import torch

        self.eager, self.u = eager.reshape(-1), u
        err_sq = ref_sq = 0.0
        n = 0
        for start, e, r in _chunks(self.eager, ref.reshape(-1)):
            ok = e.isfinite() & r.isfinite()
            err_sq += float(torch.where(ok, (e - r) ** 2, 0.0).sum())
            ref_sq += float(torch.where(ok, r ** 2, 0.0).sum())
            n += int(ok.sum())
        self.rms_err, self.rms_ref = (err_sq / max(n, 1)) ** 0.5, (ref_sq / max(n, 1)) ** 0.5

    def allowed(self, start: int, r):
        import torch

        e = self.eager[start:start + r.numel()].to(torch.float64)
        # Where eager itself overflowed (or is NaN) the task's dtype cannot say: nothing is demanded there.
        eager_err = torch.where(e.isfinite(), (e - r).abs(), float("inf"))
        return PRECISION_FACTOR * (eager_err.clamp(min=self.rms_err) + self.u * r.abs() + self.u * self.rms_ref)

    def describe(self) -> str:
        return (f"{PRECISION_FACTOR:g} x (the eager Model's own error in the task's dtype, rms {self.rms_err:.2g}, "
                f"+ roundoff)")


def _chunks(out, ref):
    """(start, out chunk, ref chunk) in float64, one chunk at a time (a list would hold the whole output again)."""
    import torch

    for i in range(0, ref.numel(), CHUNK):
        yield i, out[i:i + CHUNK].to(torch.float64), ref[i:i + CHUNK].to(torch.float64)


CHUNK = 1 << 24  # elements compared at once: the comparison's float64 temporaries stay ~1 GiB at any output size


def _compare_values(out, ref, bound, where: str, margins: list | None = None) -> dict | None:
    """In chunks of the flattened outputs, so that the temporaries do not grow with the output (comparing a 1 GiB
    output whole held ~10 GiB of them on a device shared with other evaluations)."""
    import torch

    shape = ref.shape
    out, ref = out.reshape(-1), ref.reshape(-1)
    # Non-finite values pass only where the reference has the very same ones (NaN for NaN, +inf for +inf).
    n_bad, first = 0, None
    for start, o, r in _chunks(out, ref):
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
    worst, worst_ratio, worst_allowed, n_out, largest, margin = None, 1.0, 0.0, 0, 0.0, 0.0
    for start, o, r in _chunks(out, ref):
        both = o.isfinite() & r.isfinite()
        err = torch.where(both, (o - r).abs(), 0.0)
        allowed = bound.allowed(start, r)
        largest = max(largest, float(err.max()))
        if err.numel():
            margin = max(margin, float(torch.where(err > 0, err / allowed.clamp(min=1e-300), 0.0).max()))
        over = both & (err > allowed)
        n_out += int(over.sum())
        if n_out:
            # The element most over its bound, as a ratio (an allowed 0 makes any error infinitely over).
            ratio = torch.where(over, err / allowed.clamp(min=1e-300), 0.0)
            top = int(ratio.argmax())
            if float(ratio[top]) > worst_ratio:
                worst, worst_ratio, worst_allowed = start + top, float(ratio[top]), float(allowed[top])
    if margins is not None:
        margins.append(margin)
    if worst is None:
        return None
    got, expected = out[worst].item(), ref[worst].item()
    return _fail(
        "wrong_output",
        f"max abs err {abs(got - expected):.2g} > tol {worst_allowed:.2g} {where}, element {_unflat(worst, shape)} "
        f"(got {got:.6g}, expected {expected:.6g}; {n_out} of {ref.numel()} elements out of tolerance; "
        f"largest abs err {largest:.2g}; bound: {bound.describe()})",
    )


def _unflat(flat: int, shape) -> tuple:
    """A flat element number as an index into `shape`."""
    import torch

    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), shape))


def _fail(kind: str, reason: str) -> dict:
    return {"kind": kind, "reason": reason}
