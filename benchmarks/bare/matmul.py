"""A bare KernelBench-style problem (a matmul), no manifest: benchmarks/bare_suite.py."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, A, B):
        return torch.matmul(A, B)


M = 256
K = 512
N = 256


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
