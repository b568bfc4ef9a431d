"""A bare KernelBench-style problem (a reduction over the first axis), no manifest: benchmarks/bare_suite.py."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.mean(x, dim=0)


batch_size = 2048
dim = 1024


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
