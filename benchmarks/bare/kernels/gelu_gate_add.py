import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def gelu_gate_add_kernel(x_ptr, g_ptr, r_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    g = tl.load(g_ptr + offs, mask=mask)
    r = tl.load(r_ptr + offs, mask=mask)
    gelu = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    tl.store(y_ptr + offs, gelu * tl.sigmoid(g) + r, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, g, r):
        x, g, r = x.contiguous(), g.contiguous(), r.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        gelu_gate_add_kernel[(triton.cdiv(n, 1024),)](x, g, r, y, n, BLOCK=1024)
        return y
