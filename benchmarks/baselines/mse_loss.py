"""Triton baseline for the MSE loss: a deterministic two-stage reduction.

Stage 1: each program sums (a - b)^2 over CHUNKS * BLOCK columns of one row into a partial (fp32 lanes, then a
tree sum). Stage 2: one program adds the partials and divides by the element count. No atomics, so the result
is bit-for-bit repeatable.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _sq_diff_partials_kernel(a_ptr, b_ptr, part_ptr, n_cols, stride_ar, stride_ac, stride_br, stride_bc,
                             BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(CHUNKS):
        cols = (blk * CHUNKS + i) * BLOCK + offs
        mask = cols < n_cols
        a = tl.load(a_ptr + row * stride_ar + cols * stride_ac, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + row * stride_br + cols * stride_bc, mask=mask, other=0.0).to(tl.float32)
        d = a - b
        acc += d * d
    tl.store(part_ptr + row * tl.num_programs(1) + blk, tl.sum(acc, 0))


@triton.jit
def _mean_kernel(part_ptr, out_ptr, n_parts, inv_count, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_parts, BLOCK):
        acc += tl.load(part_ptr + start + offs, mask=start + offs < n_parts, other=0.0)
    tl.store(out_ptr, (tl.sum(acc, 0) * inv_count).to(out_ptr.dtype.element_ty))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        assert a.shape == b.shape
        a2 = a.reshape(-1, a.shape[-1]) if a.dim() > 0 else a.reshape(1, 1)  # views when possible
        b2 = b.reshape(-1, b.shape[-1]) if b.dim() > 0 else b.reshape(1, 1)
        n_rows, n_cols = a2.shape
        out = torch.empty((), dtype=a.dtype, device=a.device)
        block = min(triton.next_power_of_2(max(n_cols, 1)), 1024)
        chunks = 4
        n_blk = triton.cdiv(n_cols, block * chunks)
        parts = torch.empty(n_rows * n_blk, dtype=torch.float32, device=a.device)
        if parts.numel() == 0:
            return out.fill_(float("nan"))  # mean of an empty tensor, as torch gives
        _sq_diff_partials_kernel[(n_rows, n_blk)](a2, b2, parts, n_cols, a2.stride(0), a2.stride(1),
                                                  b2.stride(0), b2.stride(1), BLOCK=block, CHUNKS=chunks,
                                                  num_warps=4)
        _mean_kernel[(1,)](parts, out, parts.numel(), 1.0 / a.numel(), BLOCK=1024, num_warps=4)
        return out
