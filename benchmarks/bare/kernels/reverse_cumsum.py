import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def reverse_cumsum_kernel(x_ptr, y_ptr, n_cols, x_stride, y_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    rev = n_cols - 1 - cols  # the row read back to front: a prefix sum of it is the suffix sum
    x = tl.load(x_ptr + row * x_stride + rev, mask=mask, other=0.0)
    tl.store(y_ptr + row * y_stride + rev, tl.cumsum(x, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x, memory_format=torch.contiguous_format)
        reverse_cumsum_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0),
                                             BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
