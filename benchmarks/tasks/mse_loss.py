"""Mean squared error between two tensors, reduced to a 0-dim scalar, fp32."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.mean((a - b) ** 2)


batch_size = 16384
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
