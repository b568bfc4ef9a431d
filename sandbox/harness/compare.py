"""Compare a candidate's outputs with the float64 reference. Runs in the trusted referee only.

Two rules, per output dtype:
- **explicit** (a manifest's `[tolerance.<dtype>]`): |c - r| <= atol + rtol * |r| per element;
- **precision-tied** (the default for floating outputs): the candidate may be wrong by at most PRECISION_FACTOR
  times what the task's own Model computes wrong in the task's dtype, on the same inputs, plus a few roundings of
  the output. With r the float64 reference, e the eager Model in the task's dtype, u the output dtype's unit
  roundoff, per element

      |c - r| <= k * max(|e - r| - u|r|, s_e) + c * u * (|r| + s_r) + a * u_acc * s_r

  |e - r| - u|r| is eager's error beyond rounding its output (which the candidate pays too, in the c term): for a
  bf16 output that is nearly nothing, so a bf16 task gets about 4 units of roundoff (an fp8 shortcut is far over),
  while an fp32 reduction gets k times eager's accumulated error (another summation order is noise of that size).
  s_e and s_r are robust scales of the whole output (the 90th percentile of eager's excess error and of |r| over
  a sample): floors, so that an element where eager happens to be exact demands no exactness and no element near
  zero needs more than the output's own scale allows; robust, so that a few huge outputs (inputs with outliers)
  do not excuse every ordinary one. u_acc is the roundoff of the float32 accumulators honest kernels use whatever
  the output dtype (2^-24; 2^-53 for float64 outputs): k * u_acc * s_r is the accumulation error of an honest
  fp32 kernel where eager accumulates in double (torch's CPU cumsum) or is exact by luck, and is nothing beside a
  bf16 output's own roundoff. k = 64 lets an honest fp32 reduction be an order of magnitude less accurate than
  torch's cascade summation (a fully serial sum over 16384 values uses about half of the bound); c = 4 allows an
  ulp or two of disagreement with eager's rounding. a = 512: a fully serial fp32 scan over 32768 values
  (KernelBench's cumsum width) reached 1.1-1.9 times a 64-fold allowance over four seeds, and an honest elementwise
  kernel (tanh as 1 - 2 / (exp(2x) + 1)) 1.4 times it, where eager had no error to excuse them; 512 x 2^-24 is
  3e-5 of the output's scale, while inputs rounded to fp16 (2^-11 = 8192 x 2^-24) stay over it by an order of
  magnitude, so the shortcut the bound exists to catch still fails.
  Where eager itself overflowed (inf where float64 is finite), a candidate may match eager's value, or be within
  the roundoff term of the float64 one.
Integer and bool outputs must match exactly. Non-finite values pass only where the reference has the very same;
with `defined_only` (inputs that hold inf and NaN), elements whose float64 result is not finite are not judged:
only what the reference defines is (NaN propagation differs between honest max/min instructions).

Returns a failure as data: {"kind": ..., "reason": ...} or None when every output is within its bound.
"""

from __future__ import annotations

import math

PRECISION_FACTOR = 64.0  # k: times eager's own error beyond rounding
ROUNDING_FACTOR = 4.0  # c: units of roundoff of the output's own scale
ACCUMULATION_FACTOR = 512.0  # a: units of an fp32 accumulator's roundoff at the output's scale
SCALE_QUANTILE, SCALE_SAMPLE = 0.9, 1 << 20  # the robust scales: this quantile over at most this many elements
CHUNK = 1 << 24  # elements compared at once: the comparison's float64 temporaries stay ~1 GiB at any output size
FUSED_MIN_ELEMENTS = 1 << 20  # below this the torch path costs little and compiles nothing
FUSED_DEVICES = {"cuda"}  # where compare_kernel judges large outputs in one pass (its tests add "cpu", interpreted)
UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def judged_at_a_sample(numel: int, elements: int) -> bool:
    """Whether an output of `numel` elements is judged at a sample of `elements`: only one much larger than it (a
    sample drawn with replacement from an output not much larger would leave a third of it unseen, where judging
    it whole costs little)."""
    return numel > 8 * elements


def secret_sample(outs: list, refs: list, eager: list | None, elements: int,
                  seed: int) -> tuple[list, list, list | None]:
    """The same `elements` elements (drawn with replacement under `seed`, which the candidate never sees) of each
    output and of its references, as flat tensors, where the output is much larger than that (judged_at_a_sample)
    and shaped as its float64 reference; any other output stays whole (its check then fails on the shape). A
    sampled timed call is judged on this: a call that skipped its work, or any part of it worth time, differs at
    nearly every sampled element, while the comparison's own cost no longer grows with the output."""
    import torch

    if len(outs) != len(refs) or (eager is not None and len(eager) != len(refs)):
        return outs, refs, eager  # judged whole: the count is wrong
    picked_outs, picked_refs, picked_eager = [], [], []
    for i, (out, ref) in enumerate(zip(outs, refs)):
        e = eager[i] if eager is not None else None
        if judged_at_a_sample(out.numel(), elements) and tuple(out.shape) == tuple(ref.shape) \
                and (e is None or e.shape == ref.shape):
            generator = torch.Generator(device=ref.device).manual_seed(seed + i)
            idx = torch.randint(0, ref.numel(), (elements,), generator=generator, device=ref.device)
            out, ref = out.reshape(-1)[idx.to(out.device)], ref.reshape(-1)[idx]
            e = e.reshape(-1)[idx.to(e.device)] if e is not None else None
        picked_outs.append(out)
        picked_refs.append(ref)
        picked_eager.append(e)
    return picked_outs, picked_refs, picked_eager if eager is not None else None


def compare_in_norm(outs: list, refs: list, tolerances: dict, where: str, eager: list | None = None,
                    defined_only: bool = False) -> dict | None:
    """The per-element bound's consequences over every element of each output, in about 20 passes over it (the
    per-element rule takes 45-70): non-finite values only where the per-element rule allows them; the largest error
    within the largest allowance; and the L2 distance from the float64 reference within the L2 norm of the
    allowances (each floor counted at every element), which an output within the per-element bound never exceeds.
    With `secret_sample`, it judges a sampled timed call whole, so that a stale answer that differs from the right
    one at few elements (a mostly constant output), or a few far-off elements, is caught too."""
    import torch

    for i, (out, ref) in enumerate(zip(outs, refs)):
        if tuple(out.shape) != tuple(ref.shape) or not out.numel():
            continue  # (the per-element check names the shape)
        label = f"output {i}" if len(refs) > 1 else "output"
        dtype = str(out.dtype).removeprefix("torch.")
        e = eager[i] if eager is not None and i < len(eager) and eager[i].shape == ref.shape else None
        precision_tied = dtype not in tolerances and dtype in UNIT_ROUNDOFF and e is not None
        bound = _PrecisionTied(e, ref, UNIT_ROUNDOFF[dtype]) if precision_tied else None
        explicit = _Explicit(**tolerances[dtype]) if dtype in tolerances else None
        errs, refs_, excesses = [], [], []  # per chunk's L2 norms (combined by hypot: no overflow in squares)
        err_max = ref_max = excess_max = 0.0
        count = bad = 0
        stats = _fused_stats(out, ref, bound or explicit) if bound or explicit else None
        if stats is not None:  # every element finite: the norms from one pass (compare_kernel)
            errs, refs_ = [math.sqrt(stats["err_sq"])], [math.sqrt(stats["ref_sq"])]
            excesses = [math.sqrt(stats["excess_sq"])] if bound is not None else []
            err_max, ref_max, excess_max, count = stats["err_max"], stats["ref_max"], stats["excess_max"], out.numel()
        for start, o, r in _chunks(out.reshape(-1), ref.reshape(-1)) if stats is None else ():
            ec = bound._eager(start, r.numel()) if bound is not None else None
            # One sum a tensor tells whether anything is NaN or inf (it propagates; float64 sums of these never
            # overflow): then, and only then, the non-finite elements are sorted out and left out of the norms.
            sums = o.sum() + r.sum() + (ec.sum() if ec is not None else 0.0)
            if math.isfinite(float(sums)):
                count += r.numel()
            else:
                excused = bound.excused(start, o, r) if bound is not None else None
                bad += int(_nonfinite_mismatch(o, r, excused, defined_only).sum())
                finite = o.isfinite() & r.isfinite()
                count += int(finite.sum())
                o, r = torch.where(finite, o, 0.0), torch.where(finite, r, 0.0)
                # Where eager overflowed and the output is finite, the per-element rule judges it with no excess.
                ec = torch.where(finite & ec.isfinite(), ec, r) if ec is not None else None
            d = o - r
            errs.append(float(torch.linalg.vector_norm(d)))
            err_max = max(err_max, float(torch.linalg.vector_norm(d, math.inf)))
            refs_.append(float(torch.linalg.vector_norm(r)))
            ref_max = max(ref_max, float(torch.linalg.vector_norm(r, math.inf)))
            if ec is not None:  # eager's error beyond rounding its output, in place: |e - r| - u|r|, at least 0
                excess = (ec - r).abs_().sub_(r.abs().mul_(bound.u)).clamp_(min=0.0)
                excesses.append(float(torch.linalg.vector_norm(excess)))
                excess_max = max(excess_max, float(torch.linalg.vector_norm(excess, math.inf)))
        if bad:
            return _fail("nan_inf", f"{label} {where} has {bad} NaN/Inf value(s) where the reference differs")
        err, ref_norm, excess_norm, root_n = math.hypot(*errs), math.hypot(*refs_), math.hypot(*excesses), \
            math.sqrt(count)
        if dtype in tolerances:
            atol, rtol = tolerances[dtype]["atol"], tolerances[dtype]["rtol"]
            allowed, largest = atol * root_n + rtol * ref_norm, atol + rtol * ref_max
        elif bound is not None:  # each term of _PrecisionTied.allowed: in norm (floors at every element), at most
            floor = ACCUMULATION_FACTOR * bound.u_acc * bound.scale_ref + ROUNDING_FACTOR * bound.u * bound.scale_ref
            allowed = (PRECISION_FACTOR * (excess_norm + bound.scale_err * root_n) + floor * root_n
                       + ROUNDING_FACTOR * bound.u * ref_norm)
            largest = PRECISION_FACTOR * max(excess_max, bound.scale_err) + floor + ROUNDING_FACTOR * bound.u * ref_max
        else:
            allowed = largest = 0.0  # integers, bools: exact
        # (a hair of slack: these sums round differently from the per-element rule, whose passes they must not fail)
        allowed, largest = allowed * (1 + 1e-9), largest * (1 + 1e-9)
        if err_max > largest:
            return _fail("wrong_output", f"{label} {where} is off by {err_max:.3g} at an element, over the most its "
                                         f"per-element bound allows any ({largest:.3g})")
        if err > allowed:
            return _fail("wrong_output", f"{label} {where} is {err:.3g} from the float64 reference in L2 "
                                         f"over its {count} finite elements, over the {allowed:.3g} its per-element "
                                         "bound allows in all")
    return None


def compare_outputs(outs: list, refs: list, expected: list[dict], tolerances: dict, where: str,
                    eager: list | None = None, margins: list | None = None,
                    defined_only: bool = False) -> dict | None:
    """`expected` holds the eager model's output dtypes/shapes; `tolerances` the manifest's explicit ones, by
    dtype; `eager` the eager model's outputs in the task's dtype on the same inputs (the precision-tied rule);
    `where` says which shape and seed. `margins`, when given, gets each output's largest error as a fraction of
    its bound (how close an honest kernel came to failing). `defined_only`: judge only the elements whose float64
    result is finite."""
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
        elif dtype in UNIT_ROUNDOFF and eager is not None and tuple(eager[i].shape) == tuple(ref.shape):
            bound = _PrecisionTied(eager[i], ref, UNIT_ROUNDOFF[dtype])
        else:
            bound = _Explicit(0.0, 0.0)  # integers, bools: exact
        failure = _compare_values(out, ref, bound, f"{label} {where}", margins, defined_only)
        if failure:
            return failure
    return None


class _Explicit:
    def __init__(self, atol: float, rtol: float):
        self.atol, self.rtol = atol, rtol

    def excused(self, start: int, o, r):
        return None

    def allowed(self, start: int, r):
        return self.atol + self.rtol * r.abs()

    def describe(self) -> str:
        return f"atol {self.atol:g} + rtol {self.rtol:g} * |expected|"


class _PrecisionTied:
    def __init__(self, eager, ref, u: float):
        import torch

        self.eager, self.u = eager.reshape(-1), u
        self.u_acc = UNIT_ROUNDOFF["float64"] if u <= UNIT_ROUNDOFF["float64"] else UNIT_ROUNDOFF["float32"]
        flat = ref.reshape(-1)
        step = max(1, flat.numel() // SCALE_SAMPLE)
        e, r = self.eager[::step].to(torch.float64), flat[::step].to(torch.float64)
        ok = e.isfinite() & r.isfinite()
        e, r = e[ok], r[ok]
        if r.numel():
            excess = ((e - r).abs() - u * r.abs()).clamp(min=0.0)
            self.scale_err = float(torch.quantile(excess, SCALE_QUANTILE))
            self.scale_ref = float(torch.quantile(r.abs(), SCALE_QUANTILE))
        else:
            self.scale_err = self.scale_ref = 0.0

    def _eager(self, start: int, n: int):
        import torch

        return self.eager[start:start + n].to(torch.float64)

    def excused(self, start: int, o, r):
        """Where eager overflowed (or is NaN) and float64 is finite: a candidate that matches eager is excused."""
        e = self._eager(start, r.numel())
        return ~e.isfinite() & r.isfinite() & ((o == e) | (o.isnan() & e.isnan()))

    def allowed(self, start: int, r):
        import torch

        e = self._eager(start, r.numel())
        # Eager's error beyond rounding its output; where eager is not finite it says nothing (0: roundoff only).
        excess = torch.where(e.isfinite(), ((e - r).abs() - self.u * r.abs()).clamp(min=0.0), 0.0)
        return (PRECISION_FACTOR * excess.clamp(min=self.scale_err) + ACCUMULATION_FACTOR * self.u_acc * self.scale_ref
                + ROUNDING_FACTOR * self.u * (r.abs() + self.scale_ref))

    def describe(self) -> str:
        return (f"{PRECISION_FACTOR:g} x the eager Model's own error beyond rounding (scale {self.scale_err:.2g}) + "
                f"{ROUNDING_FACTOR:g} units of roundoff + {ACCUMULATION_FACTOR:g} of an fp32 accumulator's (output scale "
                f"{self.scale_ref:.2g})")


def _fused_stats(out, ref, bound) -> dict | None:
    """compare_kernel's one pass over a large floating output on the GPU, under `bound`; None where the torch
    path judges it (the CPU, a small or integer output, anything NaN or inf)."""
    names = {str(t.dtype).removeprefix("torch.") for t in (out, ref, getattr(bound, "eager", out))}
    if not (out.device.type in FUSED_DEVICES and out.device == ref.device and names <= set(UNIT_ROUNDOFF)):
        return None
    if out.numel() < FUSED_MIN_ELEMENTS or tuple(out.shape) != tuple(ref.shape):
        return None
    try:
        from sandbox.harness import compare_kernel

        if isinstance(bound, _PrecisionTied):
            return compare_kernel.output_stats(
                out, ref, bound.eager, u=bound.u, scale_err=bound.scale_err, k=PRECISION_FACTOR,
                floor=ACCUMULATION_FACTOR * bound.u_acc * bound.scale_ref, round_u=ROUNDING_FACTOR * bound.u,
                scale_ref=bound.scale_ref)
        return compare_kernel.output_stats(out, ref, atol=bound.atol, rtol=bound.rtol)
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot be built here: the torch path judges alike
        from sandbox.harness.task_code import device_out_of_memory

        if device_out_of_memory(exc) is not None:  # (the device full beside other evaluations: run again alone)
            raise
        return None


def warm_fused(dtypes: set[str], explicit: set[str]) -> None:
    """Compile the fused pass for outputs of these dtypes ahead (compare_kernel.warm), where it will be used."""
    if "cuda" in FUSED_DEVICES:
        try:
            from sandbox.harness import compare_kernel

            compare_kernel.warm(dtypes, explicit)
        except Exception:  # noqa: BLE001 - it cannot be built here: the torch passes judge every output, as before
            FUSED_DEVICES.discard("cuda")


def _chunks(out, ref):
    """(start, out chunk, ref chunk) in float64, one chunk at a time (a list would hold the whole output again)."""
    import torch

    for i in range(0, ref.numel(), CHUNK):
        yield i, out[i:i + CHUNK].to(torch.float64), ref[i:i + CHUNK].to(torch.float64)


def _compare_values(out, ref, bound, where: str, margins: list | None = None,
                    defined_only: bool = False) -> dict | None:
    """In chunks of the flattened outputs, so that the temporaries do not grow with the output (comparing a 1 GiB
    output whole held ~10 GiB of them on a device shared with other evaluations)."""
    import torch

    stats = _fused_stats(out, ref, bound)
    if stats is not None and not stats["over"]:  # every element finite and within its bound (one pass)
        if margins is not None:
            margins.append(stats["margin"])
        return None  # (anything over: the torch path below finds it again and says where)
    shape = ref.shape
    out, ref = out.reshape(-1), ref.reshape(-1)
    # Non-finite values pass only where the reference has the very same ones (NaN for NaN, +inf for +inf).
    n_bad, first = 0, None
    all_finite = []  # per chunk: nothing NaN or inf in the output or the reference (one sum each tells: it propagates)
    for start, o, r in _chunks(out, ref):
        all_finite.append(math.isfinite(float(o.sum() + r.sum())))
        if all_finite[-1]:
            continue
        bad = _nonfinite_mismatch(o, r, bound.excused(start, o, r), defined_only)
        count = int(bad.sum())
        if count and first is None:
            first = start + int(bad.nonzero()[0, 0])
        n_bad += count
    if n_bad:
        return _fail("nan_inf", f"{n_bad} NaN/Inf value(s) where the reference differs, first at element "
                                f"{_unflat(first, shape)} (got {out[first].item()}, expected {ref[first].item()}) "
                                f"{where}")
    worst, worst_ratio, worst_allowed, n_out, largest, margin = None, 1.0, 0.0, 0, 0.0, 0.0
    for (start, o, r), finite in zip(_chunks(out, ref), all_finite):
        if finite:  # every element judged (nothing to excuse either: only a non-finite output is ever excused)
            both, err = None, (o - r).abs()
        else:
            both = o.isfinite() & r.isfinite()
            if (excused := bound.excused(start, o, r)) is not None:
                both &= ~excused
            err = torch.where(both, (o - r).abs(), 0.0)
        allowed = bound.allowed(start, r)
        largest = max(largest, float(err.max()))
        if err.numel():
            margin = max(margin, float(torch.where(err > 0, err / allowed.clamp(min=1e-300), 0.0).max()))
        over = err > allowed if both is None else both & (err > allowed)
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


def _nonfinite_mismatch(o, r, excused, defined_only: bool):
    """Where a NaN or inf is not allowed: in either tensor, unless the reference has the very same one (NaN for NaN,
    +inf for +inf), the element is `excused` (eager's own overflow matched), or `defined_only` and the reference
    defines no number there."""
    same_nonfinite = (o.isnan() & r.isnan()) | (r.isinf() & (o == r))
    if defined_only:
        same_nonfinite |= ~r.isfinite()  # not judged: the reference defines no number there
    if excused is not None:
        same_nonfinite |= excused
    return (~o.isfinite() | ~r.isfinite()) & ~same_nonfinite


def _unflat(flat: int, shape) -> tuple:
    """A flat element number as an index into `shape`."""
    import torch

    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), shape))


def _fail(kind: str, reason: str) -> dict:
    return {"kind": kind, "reason": reason}
