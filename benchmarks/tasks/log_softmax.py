"""Row-wise log-softmax over the last dimension (fp32, long rows)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.log_softmax(x, dim=-1)


batch_size = 4096
dim = 65536


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
