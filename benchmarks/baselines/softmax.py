"""Triton baseline for softmax: a program per row (or a few per SM, walking rows), two passes over the row; or, on
a GPU, a row split into parts of PART_BLOCK columns, one program per part, each holding its part in registers.

Pass 1 keeps a per-lane running max and a rescaled running sum (online softmax), so the row is read once to get
both statistics however long it is; pass 2 re-reads it and writes exp(x - max) / sum. The re-read is cheap only if
the row is still in L2: at full size (256 KiB rows) a program per row keeps more rows in flight than L2 holds, which
is what PROGRAMS_PER_SM (fewer rows in flight) and L2_HINTS (keep the row for its second read, then drop it) try.

A 256 KiB row is more than one program can hold in registers. With PART_BLOCK > 0, the programs of a row each load
their part once, publish its max and sum, wait until every part of the row has (an atomic counter per row), and
write their part from registers: the row crosses memory once each way, as in a copy. The wait needs a row's
programs to be on the GPU at once, which holds because programs start in order and a row's are neighbours; the
Triton interpreter runs programs one after another, so off a GPU the split is not used.
"""
import functools

import torch
import torch.nn as nn
import triton
import triton.language as tl


# Tunables: the tuning proposer (appliance/proposers/tune.py) rewrites these constants. MAX_BLOCK is the widest
# chunk of a row one program holds (longer rows are walked in chunks); NUM_WARPS is used for blocks of 2048 or
# more, narrower blocks use 4. L2_HINTS: pass 1 loads with evict_last, pass 2 with evict_first. PROGRAMS_PER_SM:
# 0 launches a program per row; n launches n per SM, each walking every (programs)-th row. PART_BLOCK: 0 is the
# two-pass design; n > 0 splits each row into parts of n columns, a program each (GPU only; MAX_BLOCK, L2_HINTS and
# PROGRAMS_PER_SM are then unused). A part is held in registers: n / (32 * NUM_WARPS) values per thread.
MAX_BLOCK = 4096
NUM_WARPS = 8
L2_HINTS = False
PROGRAMS_PER_SM = 0
PART_BLOCK = 0
TUNABLES = {"MAX_BLOCK": [512, 1024, 2048, 4096, 8192, 16384, 32768], "NUM_WARPS": [1, 2, 4, 8, 16, 32],
            "L2_HINTS": [False, True], "PROGRAMS_PER_SM": [1, 2, 4, 8, 16, 0],
            "PART_BLOCK": [0, 2048, 4096, 8192, 16384]}
# Per-shape settings the tuner found (the input's shape -> settings); other shapes use the constants above.
TUNED_BY_SHAPE = {}


def _settings(x):
    return ({"MAX_BLOCK": MAX_BLOCK, "NUM_WARPS": NUM_WARPS, "L2_HINTS": L2_HINTS, "PROGRAMS_PER_SM": PROGRAMS_PER_SM,
             "PART_BLOCK": PART_BLOCK} | TUNED_BY_SHAPE.get(tuple(x.shape), {}))


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@triton.jit
def _softmax_row(x_row, y_row, n_cols, stride_xc, BLOCK: tl.constexpr, L2_HINTS: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        if L2_HINTS:
            x = tl.load(x_row + cols * stride_xc, mask=cols < n_cols, other=float("-inf"), eviction_policy="evict_last")
        else:
            x = tl.load(x_row + cols * stride_xc, mask=cols < n_cols, other=float("-inf"))
        x = x.to(tl.float32)
        m_new = tl.maximum(m, x)
        # Lanes that have only seen padding keep m_new == -inf; exp(-inf - -inf) would be NaN there.
        seen = m_new > float("-inf")
        s = tl.where(seen, s * tl.exp(m - m_new) + tl.exp(x - m_new), 0.0)
        m = m_new
    row_max = tl.max(m, 0)
    row_sum = tl.sum(tl.where(m > float("-inf"), s * tl.exp(m - row_max), 0.0), 0)
    inv_sum = 1.0 / row_sum

    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        if L2_HINTS:
            x = tl.load(x_row + cols * stride_xc, mask=mask, other=float("-inf"), eviction_policy="evict_first")
        else:
            x = tl.load(x_row + cols * stride_xc, mask=mask, other=float("-inf"))
        y = tl.exp(x.to(tl.float32) - row_max) * inv_sum
        tl.store(y_row + cols, y.to(y_row.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, n_rows, n_cols, stride_xr, stride_xc, stride_yr, BLOCK: tl.constexpr,
                    L2_HINTS: tl.constexpr, WALK_ROWS: tl.constexpr):
    # int64 rows: row * stride can pass 2**31 at full size
    if WALK_ROWS:
        for row in range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0).to(tl.int64)):
            _softmax_row(x_ptr + row * stride_xr, y_ptr + row * stride_yr, n_cols, stride_xc, BLOCK, L2_HINTS)
    else:
        row = tl.program_id(0).to(tl.int64)
        _softmax_row(x_ptr + row * stride_xr, y_ptr + row * stride_yr, n_cols, stride_xc, BLOCK, L2_HINTS)


@triton.jit
def _softmax_parts_kernel(x_ptr, y_ptr, stats_ptr, arrived_ptr, n_cols, n_parts, stride_xr, stride_xc, stride_yr,
                          BLOCK: tl.constexpr, PARTS_P2: tl.constexpr):
    row = (tl.program_id(0) // n_parts).to(tl.int64)
    part = tl.program_id(0) % n_parts
    cols = part * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_xr + cols * stride_xc, mask=mask, other=float("-inf")).to(tl.float32)
    part_max = tl.max(x, 0)
    part_sum = tl.sum(tl.exp(x - part_max), 0)  # a part holds at least one column: part_max is finite or +-inf data
    stats = stats_ptr + (row * n_parts + part) * 2
    tl.store(stats, part_max)
    tl.store(stats + 1, part_sum)
    tl.debug_barrier()  # every thread's stores are done before the release below publishes them
    tl.atomic_add(arrived_ptr + row, 1, sem="release")
    while tl.atomic_add(arrived_ptr + row, 0, sem="acquire") < n_parts:
        pass
    parts = tl.arange(0, PARTS_P2)
    at = stats_ptr + (row * n_parts + parts) * 2
    maxes = tl.load(at, mask=parts < n_parts, other=float("-inf"), cache_modifier=".cg")  # from L2: other SMs wrote
    sums = tl.load(at + 1, mask=parts < n_parts, other=0.0, cache_modifier=".cg")
    row_max = tl.max(maxes, 0)
    row_sum = tl.sum(tl.where(maxes > float("-inf"), sums * tl.exp(maxes - row_max), 0.0), 0)
    y = tl.exp(x - row_max) / row_sum
    tl.store(y_ptr + row * stride_yr + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])  # a view whenever possible; the kernel takes both strides
        n_rows, n_cols = x2.shape
        y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
        if y.numel() == 0:
            return y.view(x.shape)
        tuned = _settings(x)
        if tuned["PART_BLOCK"] and x.is_cuda:  # the interpreter runs programs one by one: no waiting there
            block = min(tuned["PART_BLOCK"], triton.next_power_of_2(n_cols))
            n_parts = triton.cdiv(n_cols, block)
            stats = torch.empty(n_rows * n_parts * 2, dtype=torch.float32, device=x.device)
            arrived = torch.zeros(n_rows, dtype=torch.int32, device=x.device)
            _softmax_parts_kernel[(n_rows * n_parts,)](x2, y, stats, arrived, n_cols, n_parts, x2.stride(0),
                                                       x2.stride(1), y.stride(0), BLOCK=block,
                                                       PARTS_P2=triton.next_power_of_2(n_parts),
                                                       num_warps=tuned["NUM_WARPS"] if block >= 2048 else 4)
            return y.view(x.shape)
        block = min(triton.next_power_of_2(n_cols), tuned["MAX_BLOCK"])  # longer rows are walked in chunks
        programs = n_rows
        if tuned["PROGRAMS_PER_SM"] and x.is_cuda:
            programs = min(n_rows, tuned["PROGRAMS_PER_SM"] * _sm_count(x.device.index or 0))
        _softmax_kernel[(programs,)](x2, y, n_rows, n_cols, x2.stride(0), x2.stride(1), y.stride(0), BLOCK=block,
                                     L2_HINTS=tuned["L2_HINTS"], WALK_ROWS=programs < n_rows,
                                     num_warps=tuned["NUM_WARPS"] if block >= 2048 else 4)
        return y.view(x.shape)
