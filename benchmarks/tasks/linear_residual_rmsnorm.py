"""Projection + residual add + RMSNorm: rmsnorm(x @ W^T + residual) * weight (run in bf16 via the manifest).

Eager PyTorch runs the GEMM and then about six memory-bound kernels over the (batch, hidden) activation;
the point of the task is fusing that epilogue.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, hidden, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.proj = nn.Linear(in_features, hidden, bias=False)
        # Random but RMSNorm-like (0.5..1.5): a randn weight's tails (|w| ~ 4.5) would amplify the bf16 rounding
        # of the GEMM output past the bf16 tolerance even for eager PyTorch.
        self.weight = nn.Parameter(0.5 + torch.rand(hidden))

    def forward(self, x, residual):
        h = self.proj(x) + residual
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


batch_size = 32768
in_features = 2048
hidden = 4096


def get_inputs():
    return [torch.randn(batch_size, in_features), torch.randn(batch_size, hidden)]


def get_init_inputs():
    return [in_features, hidden]
