"""Triton baseline for relu(x @ W^T + b): a tiled GEMM with fp32 accumulation and the bias + ReLU fused into
the epilogue, so the (batch, out) result is written once.

Programs are ordered in groups of GROUP_M row tiles so that consecutive programs reuse the same W tiles from L2.
"""
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _linear_relu_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K,
                        stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, UPCAST: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :] * stride_xk
    w_ptrs = w_ptr + rn[None, :].to(tl.int64) * stride_wn + rk[:, None] * stride_wk  # a (K, N) tile of W^T

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(x_ptrs, mask=(rm[:, None] < M) & (rk[None, :] + k < K), other=0.0)
        b = tl.load(w_ptrs, mask=(rk[:, None] + k < K) & (rn[None, :] < N), other=0.0)
        if UPCAST:  # only under TRITON_INTERPRET: its bf16 tl.dot gives wrong numbers (seen on triton 3.9)
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
    acc = tl.maximum(acc + bias[None, :], 0.0)
    y_ptrs = y_ptr + rm[:, None].to(tl.int64) * stride_ym + rn[None, :] * stride_yn
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)  # same init draws as the task's Model

    def forward(self, x):
        w, b = self.linear.weight, self.linear.bias
        x2 = x.reshape(-1, x.shape[-1])  # a view whenever possible; the kernel takes both strides
        M, K = x2.shape
        N = w.shape[0]
        y = torch.empty((M, N), dtype=x.dtype, device=x.device)
        if y.numel() == 0:
            return y.view(*x.shape[:-1], N)
        bm, bn, bk = 128, 128, 64
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        _linear_relu_kernel[grid](x2, w, b, y, M, N, K, x2.stride(0), x2.stride(1), w.stride(0), w.stride(1),
                                  y.stride(0), y.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                                  UPCAST=os.environ.get("TRITON_INTERPRET") == "1",
                                  num_warps=8, num_stages=3)
        return y.view(*x.shape[:-1], N)
