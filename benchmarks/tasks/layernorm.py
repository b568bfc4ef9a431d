"""nn.LayerNorm over the last dimension with random (non-trivial) affine weight and bias, fp32."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        # LayerNorm initialises weight=1, bias=0, which would let a candidate skip the affine part unnoticed.
        with torch.no_grad():
            self.ln.weight.normal_()
            self.ln.bias.normal_()

    def forward(self, x):
        return self.ln(x)


batch_size = 32768
dim = 8192


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
