"""A bare KernelBench-style problem (a two-input elementwise op), no manifest: benchmarks/bare_suite.py."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale: float = 2.5):
        super().__init__()
        self.scale = scale

    def forward(self, x, y):
        return torch.tanh(x * self.scale) * y


batch_size = 64
dim = 4096


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return [2.5]
