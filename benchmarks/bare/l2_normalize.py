"""A bare KernelBench-style problem (a norm), no manifest: benchmarks/bare_suite.py."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x / torch.norm(x, p=2, dim=1, keepdim=True)


batch_size = 32
dim = 4096


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
