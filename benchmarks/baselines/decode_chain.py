"""Triton baseline for the decode chain: the whole layer stack in one kernel launch.

Every layer only mixes values within a row (an RMS over the row, then per-channel ops), so one program per row
can keep its row in registers and run all n_layers layers without any synchronisation between programs.
Eager PyTorch launches ~10 kernels per layer; this is 3 small stacking copies plus one kernel.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _decode_chain_kernel(x_ptr, w_ptr, g_ptr, s_ptr, y_ptr, n_cols, n_layers, stride_xr, stride_xc, stride_yr,
                         eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_xr + cols * stride_xc, mask=mask, other=0.0).to(tl.float32)
    for layer in range(n_layers):
        w = tl.load(w_ptr + layer * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + layer * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(s_ptr + layer).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / n_cols + eps)  # padded lanes hold 0 and add nothing
        x = x + s * (x * rstd * w / (1.0 + tl.exp(-g)))
    tl.store(y_ptr + row * stride_yr + cols, x.to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim, n_layers, eps=1e-6):
        super().__init__()
        self.eps = eps
        # Same parameters, created in the same order with the same draws, as the task's Model.
        self.norm_w = nn.ParameterList()
        self.gate = nn.ParameterList()
        self.scale = nn.ParameterList()
        for _ in range(n_layers):
            self.norm_w.append(nn.Parameter(1.0 + 0.1 * torch.randn(dim)))
            self.gate.append(nn.Parameter(torch.randn(dim)))
            self.scale.append(nn.Parameter(0.5 * torch.rand(1)))

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])  # a view whenever possible; the kernel takes both strides
        n_rows, n_cols = x2.shape
        y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
        n_layers = len(self.norm_w)
        if y.numel() == 0 or n_layers == 0:
            return y.copy_(x2).view(x.shape)
        # Gather the per-layer parameters into (n_layers, dim) tables the kernel can index (copies, not math).
        w = torch.stack(list(self.norm_w))
        g = torch.stack(list(self.gate))
        s = torch.cat(list(self.scale))
        block = triton.next_power_of_2(n_cols)  # the whole row stays in registers across layers
        _decode_chain_kernel[(n_rows,)](x2, w, g, s, y, n_cols, n_layers, x2.stride(0), x2.stride(1),
                                        y.stride(0), self.eps, BLOCK=block,
                                        num_warps=max(1, min(8, block // 256)))
        return y.view(x.shape)
