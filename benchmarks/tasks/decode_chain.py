"""A decode step through a stack of tiny layers, launch-bound in eager mode.

Each layer is x = x + scale_l * (rmsnorm(x) * norm_w_l * sigmoid(gate_l)): about ten separate small kernels
per layer in eager PyTorch, on a (batch_size, dim) activation of a few tokens.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim, n_layers, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.norm_w = nn.ParameterList()
        self.gate = nn.ParameterList()
        self.scale = nn.ParameterList()
        for _ in range(n_layers):
            self.norm_w.append(nn.Parameter(1.0 + 0.1 * torch.randn(dim)))
            self.gate.append(nn.Parameter(torch.randn(dim)))
            self.scale.append(nn.Parameter(0.5 * torch.rand(1)))

    def forward(self, x):
        for w, g, s in zip(self.norm_w, self.gate, self.scale):
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w
            h = h * torch.sigmoid(g)
            x = x + s * h
        return x


batch_size = 8
dim = 1024
n_layers = 32


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim, n_layers]
