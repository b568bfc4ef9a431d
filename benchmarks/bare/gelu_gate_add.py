"""A bare KernelBench-style problem (a fused chain), no manifest: benchmarks/bare_suite.py."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, g, r):
        return torch.nn.functional.gelu(x) * torch.sigmoid(g) + r


batch_size = 64
dim = 4096


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
