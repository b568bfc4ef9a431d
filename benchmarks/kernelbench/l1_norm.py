"""KernelBench level 1, problem 38 (L1 normalisation of each row), at KernelBench's sizes; no manifest."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.mean(torch.abs(x), dim=1, keepdim=True)


batch_size = 32768
dim = 65535


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
