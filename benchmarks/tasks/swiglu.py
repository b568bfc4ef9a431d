"""SwiGLU activation: silu(a) * b where (a, b) are the two halves of the last dimension (run in bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        return F.silu(a) * b


batch_size = 24576
hidden = 16384


def get_inputs():
    return [torch.randn(batch_size, 2 * hidden)]


def get_init_inputs():
    return []
