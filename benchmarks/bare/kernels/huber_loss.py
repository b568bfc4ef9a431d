import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def huber_kernel(p_ptr, t_ptr, out_ptr, n, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        d = tl.load(p_ptr + offs, mask=mask, other=0.0) - tl.load(t_ptr + offs, mask=mask, other=0.0)
        a = tl.abs(d)
        acc += tl.where(mask, tl.where(a < 1.0, 0.5 * d * d, a - 0.5), 0.0)
    tl.store(out_ptr, tl.sum(acc, axis=0) / n)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        p, t = predictions.contiguous(), targets.contiguous()
        out = torch.empty((), device=p.device, dtype=p.dtype)
        huber_kernel[(1,)](p, t, out, p.numel(), BLOCK=4096)
        return out
