"""Triton baseline for tanh-approximate GELU, elementwise over a 2-D (rows, column blocks) grid.

0.5 * x * (1 + tanh(z)) is rewritten as x * sigmoid(2z), which is the same function, needs one exp and no
tanh (tl.math has none in every Triton version), and has no 1 + (-1 + tiny) cancellation for negative x.
Math is done in fp32 and rounded once to the output dtype.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _gelu_tanh_kernel(x_ptr, y_ptr, n_cols, stride_xr, stride_xc, stride_yr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_xr + cols * stride_xc, mask=mask, other=0.0).to(tl.float32)
    z2 = 1.5957691216057308 * (x + 0.044715 * x * x * x)  # 2 * sqrt(2/pi) * (x + 0.044715 x^3)
    y = x / (1.0 + tl.exp(-z2))
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
        _gelu_tanh_kernel[grid](x2, y, n_cols, x2.stride(0), x2.stride(1), y.stride(0),
                                BLOCK=block, num_warps=4)
        return y.view(x.shape)
