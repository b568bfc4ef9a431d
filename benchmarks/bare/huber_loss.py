"""A bare KernelBench-style problem (a loss), no manifest: benchmarks/bare_suite.py."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, predictions, targets):
        return torch.nn.functional.smooth_l1_loss(predictions, targets)


batch_size = 128
dim = 2048


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
