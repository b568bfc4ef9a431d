"""torch.compile's own kernels for softmax.py, written out as a standalone candidate (the
`compile` seed; sandbox/harness/inductor_seed.py). Captured on cuda with torch 2.11.0+cu130 and Triton
3.6.0: 8 Triton kernels in 4 graph(s), one per shape the gate checks
(main, edge, one, outliers_strided). Library calls kept from Inductor's code: none.

Each kernel's launch configuration is one of KERNEL_META's: first those Inductor's heuristics listed for it
("inductor_configs" of them), then variants near its first (block, warps, stages); the *_CONFIG constants choose,
and TUNABLES lets the tuner choose per timed shape. At inputs of a shape not captured, ModelNew
runs the reference forward.
"""
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl
from triton.language import math as tl_math
from triton.language.extra import libdevice


# --- the task's reference: ModelNew subclasses its Model ------------------------------------------
"""Row-wise softmax over the last dimension (fp32, long rows)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)


batch_size = 4096
dim = 65536


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []

# --- Inductor's Triton helpers the kernels use ------------------------------------------------------
@triton.jit
def online_softmax_combine(lhs_max, lhs_sum, rhs_max, use_fast_math: tl.constexpr):
    """
    When we do combine, we assume lhs is the accumulator and rhs is the next
    block of data.
    Then rhs_sum is always 1. With that assumption, we can save some registers
    and computation.
    """
    out_max = maximum(lhs_max, rhs_max)

    lhs_scale = tl.where(
        out_max == float("-inf"), 1.0, exp(lhs_max - out_max, use_fast_math)
    )
    rhs_scale = tl.where(
        out_max == float("-inf"), 1.0, exp(rhs_max - out_max, use_fast_math)
    )

    # Should be
    #   out_sum = lhs_sum * lhs_scale + rhs_sum * rhs_scale
    # but since rhs_sum is all 1, we can simplify it.
    out_sum = lhs_sum * lhs_scale + rhs_scale
    return out_max, out_sum


@triton.jit
def promote_to_tensor(x):
    # Addition promotes to tensor for us
    return x + tl.zeros((1,), tl.int1)


@triton.jit
def is_floating(x):
    return promote_to_tensor(x).dtype.is_floating()


@triton.jit
def maximum(a, b):
    mask = a > b
    if is_floating(a):
        mask |= a != a
    return tl.where(mask, a, b)


@triton.jit
def max2(a, dim):
    return tl.reduce(a, dim, maximum)


@triton.jit
def exp(x, use_fast_math: tl.constexpr):
    if use_fast_math:
        return tl_math.exp(x)
    else:
        return libdevice.exp(x)


@triton.jit
def online_softmax_reduce(lhs_max, lhs_sum, dim, use_fast_math: tl.constexpr):
    out_max = max2(lhs_max, dim)
    out_max_keepdim = tl.expand_dims(out_max, dim)
    delta = tl.where(out_max_keepdim == float("-inf"), 0, lhs_max - out_max_keepdim)
    out_sum = tl.sum(lhs_sum * exp(delta, use_fast_math), dim)
    return out_max, out_sum


if os.environ.get("TRITON_INTERPRET") == "1":
    @triton.jit
    def max2(a, dim):
        return tl.max(a, dim)


# --- the kernels -------------------------------------------------------------------------------------
@triton.jit
def g0_triton_red_fused__softmax_exp_prepare_softmax_online_sub_0(in_ptr0, out_ptr2, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    xnumel = 4096
    r0_numel = 65536
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = tl.full([XBLOCK], True, tl.int1)[:, None]
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = xindex
    _tmp2_max = tl.full([XBLOCK, R0_BLOCK], float('-inf'), tl.float32)
    _tmp2_sum = tl.zeros([XBLOCK, R0_BLOCK], tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = tl.full([R0_BLOCK], True, tl.int1)[None, :]
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp0 = tl.load(in_ptr0 + (r0_1 + 65536*x0), None, eviction_policy='evict_last')
        tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])

        _tmp2_max_next, _tmp2_sum_next = online_softmax_combine(
            _tmp2_max, _tmp2_sum, tmp1, False
        )

        _tmp2_max = _tmp2_max_next
        _tmp2_sum = _tmp2_sum_next

    tmp2, tmp3 = online_softmax_reduce(
        _tmp2_max, _tmp2_sum, 1, False)
    tmp2 = tmp2[:, None]
    tmp3 = tmp3[:, None]
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = tl.full([R0_BLOCK], True, tl.int1)[None, :]
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp4 = tl.load(in_ptr0 + (r0_1 + 65536*x0), None, eviction_policy='evict_first')
        tmp5 = tmp4 - tmp2
        tmp6 = libdevice.exp(tmp5)
        tmp7 = (tmp6 / tmp3)
        tl.store(out_ptr2 + (r0_1 + 65536*x0), tmp7, None)


@triton.jit
def g1_triton_red_fused__softmax_exp_prepare_softmax_online_sub_0(in_ptr0, out_ptr2, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    xnumel = 3
    r0_numel = 4097
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = xindex
    _tmp2_max = tl.full([XBLOCK, R0_BLOCK], float('-inf'), tl.float32)
    _tmp2_sum = tl.zeros([XBLOCK, R0_BLOCK], tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp0 = tl.load(in_ptr0 + (r0_1 + 4097*x0), r0_mask & xmask, eviction_policy='evict_last', other=0.0)
        tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])

        _tmp2_max_next, _tmp2_sum_next = online_softmax_combine(
            _tmp2_max, _tmp2_sum, tmp1, False
        )

        _tmp2_max = tl.where(r0_mask & xmask, _tmp2_max_next, _tmp2_max)
        _tmp2_sum = tl.where(r0_mask & xmask, _tmp2_sum_next, _tmp2_sum)

    tmp2, tmp3 = online_softmax_reduce(
        _tmp2_max, _tmp2_sum, 1, False)
    tmp2 = tmp2[:, None]
    tmp3 = tmp3[:, None]
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp4 = tl.load(in_ptr0 + (r0_1 + 4097*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0)
        tmp5 = tmp4 - tmp2
        tmp6 = libdevice.exp(tmp5)
        tmp7 = (tmp6 / tmp3)
        tl.store(out_ptr2 + (r0_1 + 4097*x0), tmp7, r0_mask & xmask)


@triton.jit
def g2_triton_poi_fused__softmax_exp_prepare_softmax_online_sub_0(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xnumel = 1
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    tmp0 = tl.load(in_ptr0 + (0))
    tmp1 = tl.broadcast_to(tmp0, [XBLOCK])
    tmp2 = tmp1 - tmp1
    tmp3 = libdevice.exp(tmp2)
    tmp4 = (tmp3 / tmp3)
    tl.store(out_ptr0 + (tl.full([XBLOCK], 0, tl.int32).broadcast_to(XBLOCK)), tmp4, None)


@triton.jit
def g3_triton_red_fused__softmax_prepare_softmax_online_0(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    xnumel = 40
    r0_numel = 125
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = xindex
    _tmp2 = tl.full([XBLOCK, R0_BLOCK], float("-inf"), tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp0 = tl.load(in_ptr0 + (2*r0_1 + 250*x0), r0_mask & xmask, eviction_policy='evict_last', other=0.0)
        tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
        tmp3 = maximum(_tmp2, tmp1)
        _tmp2 = tl.where(r0_mask & xmask, tmp3, _tmp2)
    tmp2 = max2(_tmp2, 1)[:, None]
    tl.store(out_ptr0 + (x0), tmp2, xmask)


@triton.jit
def g3_triton_per_fused__softmax_prepare_softmax_online_1(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr):
    xnumel = 5
    r0_numel = 8
    R0_BLOCK: tl.constexpr = 8
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
    r0_offset = 0
    r0_mask = tl.full([R0_BLOCK], True, tl.int1)[None, :]
    roffset = r0_offset
    rindex = r0_index
    r0_1 = r0_index
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (r0_1 + 8*x0), xmask, other=0.0)
    tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
    tmp3 = tl.where(xmask, tmp1, float("-inf"))
    tmp4 = max2(tmp3, 1)[:, None].to(tl.float32)
    tl.store(out_ptr0 + (x0), tmp4, xmask)


@triton.jit
def g3_triton_red_fused__softmax_prepare_softmax_online_2(in_ptr0, in_ptr1, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    xnumel = 40
    r0_numel = 125
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x3 = xindex
    x1 = xindex // 8
    tmp1 = tl.load(in_ptr1 + (x1), xmask, eviction_policy='evict_last')
    _tmp5 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_2 = r0_index
        tmp0 = tl.load(in_ptr0 + (2*r0_2 + 250*x3), r0_mask & xmask, eviction_policy='evict_last', other=0.0)
        tmp2 = tmp0 - tmp1
        tmp3 = libdevice.exp(tmp2)
        tmp4 = tl.broadcast_to(tmp3, [XBLOCK, R0_BLOCK])
        tmp6 = _tmp5 + tmp4
        _tmp5 = tl.where(r0_mask & xmask, tmp6, _tmp5)
    tmp5 = tl.sum(_tmp5, 1)[:, None]
    tl.store(out_ptr0 + (x3), tmp5, xmask)


@triton.jit
def g3_triton_per_fused__softmax_prepare_softmax_online_3(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr):
    xnumel = 5
    r0_numel = 8
    R0_BLOCK: tl.constexpr = 8
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
    r0_offset = 0
    r0_mask = tl.full([R0_BLOCK], True, tl.int1)[None, :]
    roffset = r0_offset
    rindex = r0_index
    r0_1 = r0_index
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (r0_1 + 8*x0), xmask, other=0.0)
    tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
    tmp3 = tl.where(xmask, tmp1, 0)
    tmp4 = tl.sum(tmp3, 1)[:, None].to(tl.float32)
    tl.store(out_ptr0 + (x0), tmp4, xmask)


@triton.jit
def g3_triton_poi_fused__softmax_exp_sub_4(in_ptr0, in_ptr1, in_ptr2, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xnumel = 5000
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x2 = xindex
    x1 = xindex // 1000
    tmp0 = tl.load(in_ptr0 + (2*x2), xmask, eviction_policy='evict_last')
    tmp1 = tl.load(in_ptr1 + (x1), xmask, eviction_policy='evict_last')
    tmp4 = tl.load(in_ptr2 + (x1), xmask, eviction_policy='evict_last')
    tmp2 = tmp0 - tmp1
    tmp3 = libdevice.exp(tmp2)
    tmp5 = (tmp3 / tmp4)
    tl.store(out_ptr0 + (x2), tmp5, xmask)


# Tunables: the tuning proposer rewrites these constants (an index into the kernel's KERNEL_META configs).
G0_TRITON_RED_FUSED__SOFTMAX_EXP_PREPARE_SOFTMAX_ONLINE_SUB_0_CONFIG = 0
G1_TRITON_RED_FUSED__SOFTMAX_EXP_PREPARE_SOFTMAX_ONLINE_SUB_0_CONFIG = 0
G2_TRITON_POI_FUSED__SOFTMAX_EXP_PREPARE_SOFTMAX_ONLINE_SUB_0_CONFIG = 0
G3_TRITON_RED_FUSED__SOFTMAX_PREPARE_SOFTMAX_ONLINE_0_CONFIG = 0
G3_TRITON_PER_FUSED__SOFTMAX_PREPARE_SOFTMAX_ONLINE_1_CONFIG = 0
G3_TRITON_RED_FUSED__SOFTMAX_PREPARE_SOFTMAX_ONLINE_2_CONFIG = 0
G3_TRITON_PER_FUSED__SOFTMAX_PREPARE_SOFTMAX_ONLINE_3_CONFIG = 0
G3_TRITON_POI_FUSED__SOFTMAX_EXP_SUB_4_CONFIG = 0
TUNABLES = {'G0_TRITON_RED_FUSED__SOFTMAX_EXP_PREPARE_SOFTMAX_ONLINE_SUB_0_CONFIG': [0, 1, 2, 3, 4, 5, 6], 'G1_TRITON_RED_FUSED__SOFTMAX_EXP_PREPARE_SOFTMAX_ONLINE_SUB_0_CONFIG': [0, 1, 2, 3, 4, 5, 6, 7], 'G2_TRITON_POI_FUSED__SOFTMAX_EXP_PREPARE_SOFTMAX_ONLINE_SUB_0_CONFIG': [0, 1, 2, 3], 'G3_TRITON_RED_FUSED__SOFTMAX_PREPARE_SOFTMAX_ONLINE_0_CONFIG': [0, 1, 2, 3, 4, 5, 6, 7], 'G3_TRITON_PER_FUSED__SOFTMAX_PREPARE_SOFTMAX_ONLINE_1_CONFIG': [0, 1, 2, 3, 4, 5, 6, 7], 'G3_TRITON_RED_FUSED__SOFTMAX_PREPARE_SOFTMAX_ONLINE_2_CONFIG': [0, 1, 2, 3, 4, 5, 6, 7], 'G3_TRITON_PER_FUSED__SOFTMAX_PREPARE_SOFTMAX_ONLINE_3_CONFIG': [0, 1, 2, 3, 4, 5, 6, 7], 'G3_TRITON_POI_FUSED__SOFTMAX_EXP_SUB_4_CONFIG': [0, 1, 2, 3, 4, 5, 6, 7]}
TUNED_BY_SHAPE = {}
KERNEL_META = {
    'g0_triton_red_fused__softmax_exp_prepare_softmax_online_sub_0': {'params': ['in_ptr0', 'out_ptr2', 'xnumel', 'r0_numel'], 'axes': 'x', 'configs': [{'XBLOCK': 1, 'R0_BLOCK': 2048, 'num_warps': 16, 'num_stages': 1}, {'XBLOCK': 2, 'R0_BLOCK': 2048, 'num_warps': 16, 'num_stages': 1}, {'XBLOCK': 4, 'R0_BLOCK': 2048, 'num_warps': 16, 'num_stages': 1}, {'XBLOCK': 1, 'R0_BLOCK': 2048, 'num_warps': 8, 'num_stages': 1}, {'XBLOCK': 1, 'R0_BLOCK': 2048, 'num_warps': 32, 'num_stages': 1}, {'XBLOCK': 1, 'R0_BLOCK': 2048, 'num_warps': 16, 'num_stages': 2}, {'XBLOCK': 1, 'R0_BLOCK': 2048, 'num_warps': 16, 'num_stages': 3}], 'inductor_configs': 1},
    'g1_triton_red_fused__softmax_exp_prepare_softmax_online_sub_0': {'params': ['in_ptr0', 'out_ptr2', 'xnumel', 'r0_numel'], 'axes': 'x', 'configs': [{'XBLOCK': 1, 'R0_BLOCK': 8192, 'num_warps': 16, 'num_stages': 1}, {'XBLOCK': 1, 'R0_BLOCK': 2048, 'num_warps': 16, 'num_stages': 1}, {'XBLOCK': 2, 'R0_BLOCK': 8192, 'num_warps': 16, 'num_stages': 1}, {'XBLOCK': 4, 'R0_BLOCK': 8192, 'num_warps': 16, 'num_stages': 1}, {'XBLOCK': 1, 'R0_BLOCK': 8192, 'num_warps': 8, 'num_stages': 1}, {'XBLOCK': 1, 'R0_BLOCK': 8192, 'num_warps': 32, 'num_stages': 1}, {'XBLOCK': 1, 'R0_BLOCK': 8192, 'num_warps': 16, 'num_stages': 2}, {'XBLOCK': 1, 'R0_BLOCK': 8192, 'num_warps': 16, 'num_stages': 3}], 'inductor_configs': 2},
    'g2_triton_poi_fused__softmax_exp_prepare_softmax_online_sub_0': {'params': ['in_ptr0', 'out_ptr0', 'xnumel'], 'axes': 'x', 'configs': [{'XBLOCK': 1, 'num_warps': 1, 'num_stages': 1}, {'XBLOCK': 1, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 1, 'num_warps': 1, 'num_stages': 2}, {'XBLOCK': 1, 'num_warps': 1, 'num_stages': 3}], 'inductor_configs': 1},
    'g3_triton_red_fused__softmax_prepare_softmax_online_0': {'params': ['in_ptr0', 'out_ptr0', 'xnumel', 'r0_numel'], 'axes': 'x', 'configs': [{'XBLOCK': 2, 'R0_BLOCK': 64, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 1, 'R0_BLOCK': 64, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 4, 'R0_BLOCK': 64, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 8, 'R0_BLOCK': 64, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 2, 'R0_BLOCK': 64, 'num_warps': 1, 'num_stages': 1}, {'XBLOCK': 2, 'R0_BLOCK': 64, 'num_warps': 4, 'num_stages': 1}, {'XBLOCK': 2, 'R0_BLOCK': 64, 'num_warps': 2, 'num_stages': 2}, {'XBLOCK': 2, 'R0_BLOCK': 64, 'num_warps': 2, 'num_stages': 3}], 'inductor_configs': 1},
    'g3_triton_per_fused__softmax_prepare_softmax_online_1': {'params': ['in_ptr0', 'out_ptr0', 'xnumel', 'r0_numel'], 'axes': 'x', 'configs': [{'XBLOCK': 1, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 8, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 2, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 4, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 1, 'num_warps': 1, 'num_stages': 1}, {'XBLOCK': 1, 'num_warps': 4, 'num_stages': 1}, {'XBLOCK': 1, 'num_warps': 2, 'num_stages': 2}, {'XBLOCK': 1, 'num_warps': 2, 'num_stages': 3}], 'inductor_configs': 2},
    'g3_triton_red_fused__softmax_prepare_softmax_online_2': {'params': ['in_ptr0', 'in_ptr1', 'out_ptr0', 'xnumel', 'r0_numel'], 'axes': 'x', 'configs': [{'XBLOCK': 2, 'R0_BLOCK': 64, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 1, 'R0_BLOCK': 64, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 4, 'R0_BLOCK': 64, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 8, 'R0_BLOCK': 64, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 2, 'R0_BLOCK': 64, 'num_warps': 1, 'num_stages': 1}, {'XBLOCK': 2, 'R0_BLOCK': 64, 'num_warps': 4, 'num_stages': 1}, {'XBLOCK': 2, 'R0_BLOCK': 64, 'num_warps': 2, 'num_stages': 2}, {'XBLOCK': 2, 'R0_BLOCK': 64, 'num_warps': 2, 'num_stages': 3}], 'inductor_configs': 1},
    'g3_triton_per_fused__softmax_prepare_softmax_online_3': {'params': ['in_ptr0', 'out_ptr0', 'xnumel', 'r0_numel'], 'axes': 'x', 'configs': [{'XBLOCK': 1, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 8, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 2, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 4, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 1, 'num_warps': 1, 'num_stages': 1}, {'XBLOCK': 1, 'num_warps': 4, 'num_stages': 1}, {'XBLOCK': 1, 'num_warps': 2, 'num_stages': 2}, {'XBLOCK': 1, 'num_warps': 2, 'num_stages': 3}], 'inductor_configs': 2},
    'g3_triton_poi_fused__softmax_exp_sub_4': {'params': ['in_ptr0', 'in_ptr1', 'in_ptr2', 'out_ptr0', 'xnumel'], 'axes': 'x', 'configs': [{'XBLOCK': 256, 'num_warps': 4, 'num_stages': 1}, {'XBLOCK': 128, 'num_warps': 4, 'num_stages': 1}, {'XBLOCK': 512, 'num_warps': 4, 'num_stages': 1}, {'XBLOCK': 1024, 'num_warps': 4, 'num_stages': 1}, {'XBLOCK': 256, 'num_warps': 2, 'num_stages': 1}, {'XBLOCK': 256, 'num_warps': 8, 'num_stages': 1}, {'XBLOCK': 256, 'num_warps': 4, 'num_stages': 2}, {'XBLOCK': 256, 'num_warps': 4, 'num_stages': 3}], 'inductor_configs': 2},
}

if os.environ.get("TRITON_INTERPRET") == "1":
    class libdevice:  # noqa: N801 - Triton's interpreter has no libdevice: the same functions, from tl
        # looked up when called: the interpreter patches tl's functions only while a kernel runs
        for _name in ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "floor", "ceil", "erf", "abs"):
            locals()[_name] = staticmethod(lambda x, _name=_name: getattr(tl, _name)(x))
        fabs = abs

        @staticmethod
        def isnan(x):
            return x != x

        @staticmethod
        def isinf(x):
            return tl.abs(x) == float("inf")

        @staticmethod
        def tanh(x):
            return 2.0 * tl.sigmoid(2.0 * x) - 1.0

        @staticmethod
        def log1p(x):
            return tl.log(1.0 + x)

        @staticmethod
        def expm1(x):
            return tl.exp(x) - 1.0

        @staticmethod
        def pow(x, y):
            return tl.exp2(y * tl.log2(x))

        @staticmethod
        def signbit(x):
            return x < 0

        @staticmethod
        def trunc(x):
            return tl.where(x < 0, tl.ceil(x), tl.floor(x))


# --- what Inductor's call() uses ----------------------------------------------------------------------------
aten = torch.ops.aten


def empty_strided_cuda(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype, device="cuda")


def empty_strided_cpu(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype, device="cpu")


def reinterpret_tensor(t, size, stride, offset=0):
    return t.as_strided(size, stride, offset)


def assert_size_stride(t, size, stride, what=""):
    if tuple(t.shape) != tuple(size) or tuple(t.stride()) != tuple(stride):
        raise AssertionError(f"{what}: {tuple(t.shape)}/{t.stride()} is not {tuple(size)}/{tuple(stride)}")


def assert_alignment(*_):
    pass


def get_raw_stream(_):
    return None


class extern_kernels:
    """Inductor's library calls, as the torch functions they are."""
    mm = staticmethod(torch.mm)
    addmm = staticmethod(torch.addmm)
    bmm = staticmethod(torch.bmm)
    baddbmm = staticmethod(torch.baddbmm)
    convolution = staticmethod(torch.convolution)


def _launch(name, args):
    """One launch with an explicit grid: the config its constant chooses, and the grid Inductor would compute."""
    kernel, meta = globals()[name], KERNEL_META[name]
    config = meta["configs"][globals()[name.upper() + "_CONFIG"]]
    bound = dict(zip(meta["params"], args))
    blocks = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
    grid = tuple(triton.cdiv(bound[axis + "numel"], blocks.get(axis.upper() + "BLOCK", 1)) for axis in meta["axes"])
    kernel[grid](*args, **blocks, num_warps=config["num_warps"],
                 num_stages=config["num_stages"])

def _graph_0(args):
    """Inductor's call() at shape main."""
    arg0_1, = args
    args.clear()
    assert_size_stride(arg0_1, (4096, 65536), (65536, 1))
    with torch.cuda._DeviceGuard(0):
        torch.cuda.set_device(0)
        buf2 = empty_strided_cuda((4096, 65536), (65536, 1), torch.float32)
        # Topologically Sorted Source Nodes: [softmax], Original ATen: [prims.prepare_softmax_online, aten.sub, aten.exp, aten._softmax]
        stream0 = get_raw_stream(0)
        _launch('g0_triton_red_fused__softmax_exp_prepare_softmax_online_sub_0', (arg0_1, buf2, 4096, 65536,))
        del arg0_1
    return (buf2, )


def _graph_1(args):
    """Inductor's call() at shape edge."""
    arg0_1, = args
    args.clear()
    assert_size_stride(arg0_1, (3, 4097), (4097, 1))
    with torch.cuda._DeviceGuard(0):
        torch.cuda.set_device(0)
        buf2 = empty_strided_cuda((3, 4097), (4097, 1), torch.float32)
        # Topologically Sorted Source Nodes: [softmax], Original ATen: [prims.prepare_softmax_online, aten.sub, aten.exp, aten._softmax]
        stream0 = get_raw_stream(0)
        _launch('g1_triton_red_fused__softmax_exp_prepare_softmax_online_sub_0', (arg0_1, buf2, 3, 4097,))
        del arg0_1
    return (buf2, )


def _graph_2(args):
    """Inductor's call() at shape one."""
    arg0_1, = args
    args.clear()
    assert_size_stride(arg0_1, (1, 1), (1, 1))
    with torch.cuda._DeviceGuard(0):
        torch.cuda.set_device(0)
        buf0 = empty_strided_cuda((1, 1), (1, 1), torch.float32)
        # Topologically Sorted Source Nodes: [softmax], Original ATen: [prims.prepare_softmax_online, aten.sub, aten.exp, aten._softmax]
        stream0 = get_raw_stream(0)
        _launch('g2_triton_poi_fused__softmax_exp_prepare_softmax_online_sub_0', (arg0_1, buf0, 1,))
        del arg0_1
    return (buf0, )


def _graph_3(args):
    """Inductor's call() at shape outliers_strided."""
    arg0_1, = args
    args.clear()
    assert_size_stride(arg0_1, (5, 1000), (2000, 2))
    with torch.cuda._DeviceGuard(0):
        torch.cuda.set_device(0)
        buf0 = empty_strided_cuda((5, 1, 8), (8, 40, 1), torch.float32)
        # Topologically Sorted Source Nodes: [softmax], Original ATen: [aten._softmax, prims.prepare_softmax_online]
        stream0 = get_raw_stream(0)
        _launch('g3_triton_red_fused__softmax_prepare_softmax_online_0', (arg0_1, buf0, 40, 125,))
        buf1 = empty_strided_cuda((5, 1), (1, 5), torch.float32)
        # Topologically Sorted Source Nodes: [softmax], Original ATen: [aten._softmax, prims.prepare_softmax_online]
        stream0 = get_raw_stream(0)
        _launch('g3_triton_per_fused__softmax_prepare_softmax_online_1', (buf0, buf1, 5, 8,))
        buf2 = buf0; del buf0  # reuse
        # Topologically Sorted Source Nodes: [softmax], Original ATen: [aten._softmax, prims.prepare_softmax_online]
        stream0 = get_raw_stream(0)
        _launch('g3_triton_red_fused__softmax_prepare_softmax_online_2', (arg0_1, buf1, buf2, 40, 125,))
        buf3 = empty_strided_cuda((5, 1), (1, 5), torch.float32)
        # Topologically Sorted Source Nodes: [softmax], Original ATen: [aten._softmax, prims.prepare_softmax_online]
        stream0 = get_raw_stream(0)
        _launch('g3_triton_per_fused__softmax_prepare_softmax_online_3', (buf2, buf3, 5, 8,))
        del buf2
        buf4 = empty_strided_cuda((5, 1000), (1000, 1), torch.float32)
        # Topologically Sorted Source Nodes: [softmax], Original ATen: [aten._softmax, aten.sub, aten.exp]
        stream0 = get_raw_stream(0)
        _launch('g3_triton_poi_fused__softmax_exp_sub_4', (arg0_1, buf1, buf3, buf4, 5000,))
        del arg0_1
        del buf1
        del buf3
    return (buf4, )


# --- the captured graphs, and ModelNew ----------------------------------------------------------------------
GRAPHS = {
    (((4096, 65536), (65536, 1), 'float32'),): (_graph_0, [('input', 0)], True),
    (((3, 4097), (4097, 1), 'float32'),): (_graph_1, [('input', 0)], True),
    (((1, 1), (1, 1), 'float32'),): (_graph_2, [('input', 0)], True),
    (((5, 1000), (2000, 2), 'float32'),): (_graph_3, [('input', 0)], True),
}


def _key(inputs):
    return tuple((tuple(a.shape), tuple(a.stride()), str(a.dtype).removeprefix("torch."))
                 if isinstance(a, torch.Tensor) else repr(a) for a in inputs)


class ModelNew(Model):
    """The task's Model (same parameters, same draws) with its forward run by the kernels above."""

    def forward(self, *inputs):
        graph = GRAPHS.get(_key(inputs))
        if graph is None:
            return super().forward(*inputs)
        run, arg_map, single = graph
        args = [self.get_parameter(n) if kind == "param" else self.get_buffer(n) if kind == "buffer" else inputs[n]
                for kind, n in arg_map]
        out = run(args)
        return out[0] if single else tuple(out)

