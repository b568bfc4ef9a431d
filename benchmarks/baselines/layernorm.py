"""Triton baseline for LayerNorm: one program per row.

Mean and variance are taken in two separate passes (not E[x^2] - E[x]^2, which cancels badly for rows with a
large mean); the third pass normalises and applies the affine weight and bias. Rows longer than one block are
walked in chunks, and the re-reads of a row mostly hit L2.
The row length is a compile-time constant (a kernel per row length, as Inductor specialises it): where the
block divides the row, the bounds masks vanish from the compiled loads and stores.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


# Tunables: the tuning proposer (appliance/proposers/tune.py) rewrites these constants. MAX_BLOCK is the widest
# chunk of a row one program holds (longer rows are walked in chunks; past 8192, the task's dim, a larger one
# changes nothing), or "row": a row of up to ONE_READ_MAX elements is held whole and read once instead of
# three times (longer rows are walked in 8192-wide chunks). One tunable, not two, so that no two settings run the same
# kernel: the tuner's evaluations are not spent on duplicates. NUM_WARPS is used for blocks of 2048 or more,
# narrower blocks use 4. L2_HINTS: the weights, which every row reads, stay in L2 (evict_last) and a row's last
# read leaves it first (evict_first); a row read again marks its first read evict_last; a row read once gets no
# hint (evict_first there was 5% slower on the H200), only the weights do.
MAX_BLOCK = 4096
NUM_WARPS = 8
L2_HINTS = False
TUNABLES = {"MAX_BLOCK": [512, 1024, 2048, 4096, 8192, "row"], "NUM_WARPS": [1, 2, 4, 8, 16, 32],
            "L2_HINTS": [False, True]}
ONE_READ_MAX = 16384  # beyond this a whole row no longer fits in registers
# Per-shape settings the tuner found (the input's shape -> settings); other shapes use the constants above.
TUNED_BY_SHAPE = {}


def _settings(x):
    defaults = {"MAX_BLOCK": MAX_BLOCK, "NUM_WARPS": NUM_WARPS, "L2_HINTS": L2_HINTS}
    return defaults | TUNED_BY_SHAPE.get(tuple(x.shape), {})


def _policies(tuned):
    """Eviction policies, as constexpr strings ("" is Triton's default)."""
    hints = tuned["L2_HINTS"]
    return {"KEEP": "evict_last" if hints else "", "STREAM": "evict_first" if hints else ""}


@triton.jit
def _layernorm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N_COLS: tl.constexpr, stride_xr, stride_xc, stride_yr, eps,
                      BLOCK: tl.constexpr, WHOLE_ROW: tl.constexpr, KEEP: tl.constexpr, STREAM: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride can pass 2**31 at full size
    x_row = x_ptr + row * stride_xr
    y_row = y_ptr + row * stride_yr
    offs = tl.arange(0, BLOCK)
    if WHOLE_ROW:  # the row fits one block: read it once, keep it in registers
        mask = offs < N_COLS
        x = tl.load(x_row + offs * stride_xc, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, 0) / N_COLS
        d = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, 0) / N_COLS + eps)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0, eviction_policy=KEEP).to(tl.float32)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0, eviction_policy=KEEP).to(tl.float32)
        tl.store(y_row + offs, (d * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
        return

    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N_COLS, BLOCK):
        cols = start + offs
        acc += tl.load(x_row + cols * stride_xc, mask=cols < N_COLS, other=0.0, eviction_policy=KEEP).to(tl.float32)
    mean = tl.sum(acc, 0) / N_COLS

    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N_COLS, BLOCK):
        cols = start + offs
        mask = cols < N_COLS
        x = tl.load(x_row + cols * stride_xc, mask=mask, other=0.0, eviction_policy=KEEP).to(tl.float32)
        d = tl.where(mask, x - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, 0) / N_COLS + eps)

    for start in range(0, N_COLS, BLOCK):
        cols = start + offs
        mask = cols < N_COLS
        x = tl.load(x_row + cols * stride_xc, mask=mask, other=0.0, eviction_policy=STREAM).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy=KEEP).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0, eviction_policy=KEEP).to(tl.float32)
        y = (x - mean) * rstd * w + b
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        # Same module and same draws, in the same order, as the task's Model.
        self.ln = nn.LayerNorm(dim)
        with torch.no_grad():
            self.ln.weight.normal_()
            self.ln.bias.normal_()

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])  # a view whenever possible; the kernel takes both strides
        n_rows, n_cols = x2.shape
        y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
        if y.numel() == 0:
            return y.view(x.shape)
        tuned = _settings(x)
        whole_row = tuned["MAX_BLOCK"] == "row" and n_cols <= ONE_READ_MAX
        widest = 8192 if tuned["MAX_BLOCK"] == "row" else tuned["MAX_BLOCK"]
        block = triton.next_power_of_2(n_cols) if whole_row else min(triton.next_power_of_2(n_cols), widest)
        _layernorm_kernel[(n_rows,)](x2, self.ln.weight.contiguous(), self.ln.bias.contiguous(), y, n_cols,
                                     x2.stride(0), x2.stride(1), y.stride(0), self.ln.eps,
                                     BLOCK=block, WHOLE_ROW=whole_row, **_policies(tuned),
                                     num_warps=tuned["NUM_WARPS"] if block >= 2048 else 4)
        return y.view(x.shape)
