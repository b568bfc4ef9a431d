"""Triton baseline for SwiGLU: y = silu(a) * b with a, b the two halves of the last dimension of x.

Both halves are read straight out of x through its strides (no chunk copies); math in fp32, one rounding.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _swiglu_kernel(x_ptr, y_ptr, hidden, stride_xr, stride_xc, stride_yr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < hidden
    a_ptrs = x_ptr + row * stride_xr + cols * stride_xc
    a = tl.load(a_ptrs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(a_ptrs + hidden * stride_xc, mask=mask, other=0.0).to(tl.float32)
    y = a / (1.0 + tl.exp(-a)) * b
    tl.store(y_ptr + row * stride_yr + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        assert x.shape[-1] % 2 == 0, "SwiGLU needs an even last dimension"
        x2 = x.reshape(-1, x.shape[-1])  # a view whenever possible; the kernel takes both strides
        n_rows, hidden = x2.shape[0], x2.shape[1] // 2
        y = torch.empty((n_rows, hidden), dtype=x.dtype, device=x.device)
        if y.numel() == 0:
            return y.view(*x.shape[:-1], hidden)
        block = min(triton.next_power_of_2(hidden), 2048)
        grid = (n_rows, triton.cdiv(hidden, block))
        _swiglu_kernel[grid](x2, y, hidden, x2.stride(0), x2.stride(1), y.stride(0), BLOCK=block, num_warps=4)
        return y.view(*x.shape[:-1], hidden)
