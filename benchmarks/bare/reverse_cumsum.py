"""A bare KernelBench-style problem (a scan), no manifest: benchmarks/bare_suite.py."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.cumsum(x.flip(1), dim=1).flip(1)


batch_size = 32
dim = 2048


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
