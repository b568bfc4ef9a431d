"""Baseline for rmsnorm(x @ W^T + residual) * weight.

The GEMM stays in torch.matmul (cuBLAS); the residual add, the RMS statistics and the scaling are one Triton
kernel (one program per row), instead of the ~six memory-bound kernels eager PyTorch launches. The sum h + residual
is kept in fp32 inside the kernel rather than rounded to bf16 first.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _residual_rmsnorm_kernel(h_ptr, r_ptr, w_ptr, y_ptr, n_cols, stride_hr, stride_rr, stride_rc, stride_yr,
                             eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    h_row = h_ptr + row * stride_hr
    r_row = r_ptr + row * stride_rr
    y_row = y_ptr + row * stride_yr
    offs = tl.arange(0, BLOCK)

    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        v = tl.load(h_row + cols, mask=mask, other=0.0).to(tl.float32) \
            + tl.load(r_row + cols * stride_rc, mask=mask, other=0.0).to(tl.float32)
        acc += v * v
    rstd = 1.0 / tl.sqrt(tl.sum(acc, 0) / n_cols + eps)

    for start in range(0, n_cols, BLOCK):  # second read of the row, mostly from L2
        cols = start + offs
        mask = cols < n_cols
        v = tl.load(h_row + cols, mask=mask, other=0.0).to(tl.float32) \
            + tl.load(r_row + cols * stride_rc, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, (v * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_features, hidden, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.proj = nn.Linear(in_features, hidden, bias=False)  # same draws, same order as the task's Model
        self.weight = nn.Parameter(0.5 + torch.rand(hidden))

    def forward(self, x, residual):
        h = torch.matmul(x, self.proj.weight.t())  # allowed torch op: the GEMM only
        h2 = h.reshape(-1, h.shape[-1]).contiguous()
        r2 = residual.reshape(-1, residual.shape[-1])
        n_rows, n_cols = h2.shape
        y = torch.empty((n_rows, n_cols), dtype=h.dtype, device=h.device)
        if y.numel() == 0:
            return y.view(h.shape)
        block = min(triton.next_power_of_2(n_cols), 4096)
        _residual_rmsnorm_kernel[(n_rows,)](h2, r2, self.weight.contiguous(), y, n_cols, h2.stride(0),
                                            r2.stride(0), r2.stride(1), y.stride(0), self.eps,
                                            BLOCK=block, num_warps=8 if block >= 2048 else 4)
        return y.view(h.shape)
