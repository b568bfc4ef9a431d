import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def column_mean_kernel(x_ptr, y_ptr, n_rows, n_cols, stride, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for start in range(0, n_rows, BLOCK_R):
        rows = start + tl.arange(0, BLOCK_R)
        x = tl.load(x_ptr + rows[:, None] * stride + cols[None, :],
                    mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
        acc += tl.sum(x, axis=0)
    tl.store(y_ptr + cols, acc / n_rows, mask=cols < n_cols)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty(x.shape[1], device=x.device, dtype=x.dtype)
        column_mean_kernel[(triton.cdiv(x.shape[1], 64),)](x, y, x.shape[0], x.shape[1], x.stride(0),
                                                           BLOCK_R=64, BLOCK_C=64)
        return y
