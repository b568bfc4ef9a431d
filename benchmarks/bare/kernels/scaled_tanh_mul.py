import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def tanh_mul_kernel(x_ptr, y_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask) * scale
    y = tl.load(y_ptr + offs, mask=mask)
    t = 2.0 * tl.sigmoid(2.0 * x) - 1.0  # tanh
    tl.store(out_ptr + offs, t * y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, scale: float = 2.5):
        super().__init__()
        self.scale = scale

    def forward(self, x, y):
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        tanh_mul_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, self.scale, BLOCK=1024)
        return out
