"""Triton baseline for an inclusive prefix sum along the last dimension.

One program per row walks it in BLOCK-wide chunks: tl.cumsum scans a chunk, and a running fp32 carry (the sum of
the chunks before it) is added. Rows are independent, so there is no cross-program communication.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _cumsum_kernel(x_ptr, y_ptr, n_cols, stride_xr, stride_xc, stride_yr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xr
    y_row = y_ptr + row * stride_yr
    offs = tl.arange(0, BLOCK)
    carry = tl.zeros([], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(x_row + cols * stride_xc, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, (tl.cumsum(x, 0) + carry).to(y_ptr.dtype.element_ty), mask=mask)
        carry += tl.sum(x, 0)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])  # a view whenever possible; the kernel takes both strides
        n_rows, n_cols = x2.shape
        y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
        if y.numel() == 0:
            return y.view(x.shape)
        block = min(triton.next_power_of_2(n_cols), 2048)
        _cumsum_kernel[(n_rows,)](x2, y, n_cols, x2.stride(0), x2.stride(1), y.stride(0),
                                  BLOCK=block, num_warps=8 if block >= 2048 else 4)
        return y.view(x.shape)
