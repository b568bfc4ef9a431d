"""RMSNorm over the last dimension: x * rsqrt(mean(x^2) + eps) * weight, fp32."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(dim))  # random so that a skipped scale is caught

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


batch_size = 32768
dim = 8192


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
