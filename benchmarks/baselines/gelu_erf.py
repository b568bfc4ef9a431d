"""Triton baseline for exact GELU, x * 0.5 * (1 + erf(x / sqrt(2))), elementwise over a 2-D grid.

The grid is (rows, column blocks) so non-contiguous inputs are read through their strides without a copy.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _gelu_erf_kernel(x_ptr, y_ptr, n_cols, stride_xr, stride_xc, stride_yr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_xr + cols * stride_xc, mask=mask, other=0.0).to(tl.float32)
    y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    tl.store(y_ptr + row * stride_yr + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1]) if x.dim() > 0 else x.reshape(1, 1)  # view when possible
        n_rows, n_cols = x2.shape
        y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
        if y.numel() == 0:
            return y.view(x.shape)
        block = min(triton.next_power_of_2(n_cols), 2048)
        grid = (n_rows, triton.cdiv(n_cols, block))
        _gelu_erf_kernel[grid](x2, y, n_cols, x2.stride(0), x2.stride(1), y.stride(0),
                               BLOCK=block, num_warps=4)
        return y.view(x.shape)
