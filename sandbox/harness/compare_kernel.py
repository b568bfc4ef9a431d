"""compare.py's two rules over a whole output in one pass on the GPU (a Triton reduction), where the torch path
takes 45-70 passes (the per-element rule) and about 20 (in norm) over float64 copies of it. Runs in the trusted
referee only, on its own tensors.

For one output it returns what both rules need, over every element: whether anything is NaN or inf, the largest
error and its L2 norm, the reference's largest value and L2 norm, eager's excess error's (precision-tied), the
largest error as a fraction of the per-element bound and how many elements are over it. The torch path still
judges anything with a NaN or inf (their rules are many), writes every failure's message, and runs on the CPU; the
two agree to the rounding of a sum (tests/evaluation/test_compare_kernel.py)."""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK = 2048
STATS = ("nonfinite", "err_sq", "err_max", "ref_sq", "ref_max", "excess_sq", "excess_max", "over", "margin")


@triton.jit(do_not_specialize=["n"])  # one compile whatever the size (below 2^31 elements)
def _stats_kernel(o_ptr, r_ptr, e_ptr, part_ptr, n, u, scale_err, floor, round_u, scale_ref, atol, rtol, k,
                  PRECISION_TIED: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < n
    o = tl.load(o_ptr + offs, mask=mask, other=0.0).to(tl.float64)
    r = tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float64)
    # x - x is 0 for a finite x and NaN for inf or NaN: one test for both.
    bad = (o - o != 0.0) | (r - r != 0.0)
    err = tl.abs(o - r)
    if PRECISION_TIED:
        e = tl.load(e_ptr + offs, mask=mask, other=0.0).to(tl.float64)
        bad = bad | (e - e != 0.0)
        excess = tl.maximum(tl.abs(e - r) - u * tl.abs(r), 0.0)
        allowed = k * tl.maximum(excess, scale_err) + floor + round_u * (tl.abs(r) + scale_ref)
    else:
        excess = tl.zeros_like(err)
        allowed = atol + rtol * tl.abs(r)
    ratio = tl.where(err > 0.0, err / tl.maximum(allowed, 1e-300), 0.0)
    base = part_ptr + pid * 9
    tl.store(base + 0, tl.sum(tl.where(mask & bad, 1.0, 0.0), axis=0))
    tl.store(base + 1, tl.sum(err * err, axis=0))
    tl.store(base + 2, tl.max(err, axis=0))
    tl.store(base + 3, tl.sum(r * r, axis=0))
    tl.store(base + 4, tl.max(tl.abs(r), axis=0))
    tl.store(base + 5, tl.sum(excess * excess, axis=0))
    tl.store(base + 6, tl.max(excess, axis=0))
    tl.store(base + 7, tl.sum(tl.where(mask & (err > allowed), 1.0, 0.0), axis=0))
    tl.store(base + 8, tl.max(ratio, axis=0))


def output_stats(out, ref, eager=None, *, u: float = 0.0, scale_err: float = 0.0, floor: float = 0.0,
                 round_u: float = 0.0, scale_ref: float = 0.0, atol: float = 0.0, rtol: float = 0.0,
                 k: float = 0.0) -> dict | None:
    """STATS over every element of `out` against the float64 `ref`: with `eager`, under the precision-tied bound
    k * max(excess, scale_err) + floor + round_u * (|r| + scale_ref), excess = max(|e - r| - u|r|, 0); without,
    under atol + rtol * |r|. None where anything is NaN or inf, or a sum overflowed: the torch path judges it."""
    import torch

    # The kernel reads flat memory from each tensor's start: a strided or broadcast view (the task's Model may return
    # one as its reference) is copied first, or it would read other memory (an attacker review's finding).
    o, r = out.contiguous().reshape(-1), ref.contiguous().reshape(-1)
    e = eager.contiguous().reshape(-1) if eager is not None else r
    n = r.numel()
    blocks = triton.cdiv(n, BLOCK)
    parts = torch.empty((blocks, 9), dtype=torch.float64, device=r.device)
    _stats_kernel[(blocks,)](o, r, e, parts, n, u, scale_err, floor, round_u, scale_ref, atol, rtol, k,
                             PRECISION_TIED=eager is not None, BLOCK=BLOCK)
    sums, maxes = parts[:, [0, 1, 3, 5, 7]].sum(0), parts[:, [2, 4, 6, 8]].amax(0)
    nonfinite, err_sq, ref_sq, excess_sq, over = sums.tolist()
    err_max, ref_max, excess_max, margin = maxes.tolist()
    stats = dict(zip(STATS, (nonfinite, err_sq, err_max, ref_sq, ref_max, excess_sq, excess_max, over, margin)))
    if nonfinite or not all(map(_finite, stats.values())):
        return None
    return stats


def _finite(x: float) -> bool:
    return x - x == 0.0


def warm(dtypes: set[str], explicit: set[str]) -> None:
    """Compile the kernel for outputs of these dtypes (precision-tied; `explicit`: under a manifest's tolerance
    too) on a one-element output: the referee does it at its first device turn, so that no compile falls in its
    correctness or timing stage."""
    import torch

    r = torch.zeros(1, dtype=torch.float64, device="cuda")
    for name in dtypes:
        o = torch.zeros(1, dtype=getattr(torch, name), device="cuda")
        output_stats(o, r, o)
        if name in explicit:
            output_stats(o, r)
