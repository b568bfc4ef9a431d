#!/usr/bin/env python3
"""What torch.compile generates for a bundled task, and how a few hand variants of the RMSNorm kernel compare.

    python benchmarks/inductor_probe.py [--tasks rmsnorm,layernorm]

Prints Inductor's Triton kernels (source, launch heuristics and the configuration its autotuner kept), then a table
of RMSNorm variants timed with the evaluation's own loop (sandbox.harness.timing) beside torch.compile.
UNJAILED: our own code only.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sandbox.harness.common import load_module  # noqa: E402
from sandbox.harness.timing import time_calls  # noqa: E402


@triton.jit
def _rms_row(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr, NC: tl.constexpr, TWO_READS: tl.constexpr,
             INT64: tl.constexpr):
    """NC > 0: the row length as a compile-time constant (no mask when BLOCK == NC), as Inductor specialises it.
    TWO_READS: the row read a second time for the scaling (evict_last, then evict_first), as Inductor's kernel does."""
    offs = tl.arange(0, BLOCK)
    if NC > 0:
        ncols = NC
    else:
        ncols = n_cols
    mask = offs < ncols
    if INT64:
        base = tl.program_id(0).to(tl.int64) * ncols
    else:
        base = tl.program_id(0) * ncols
    if TWO_READS:
        x = tl.load(x_ptr + base + offs, mask=mask, other=0.0, eviction_policy="evict_last")
    else:
        x = tl.load(x_ptr + base + offs, mask=mask, other=0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / ncols + eps)
    if TWO_READS:
        x = tl.load(x_ptr + base + offs, mask=mask, other=0.0, eviction_policy="evict_first")
    w = tl.load(w_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_last")
    tl.store(y_ptr + base + offs, x * rstd * w, mask=mask)


class RmsVariant(torch.nn.Module):
    def __init__(self, weight, eps, num_warps, const_cols=False, two_reads=False, int64=True):
        super().__init__()
        self.weight, self.eps, self.num_warps = weight, eps, num_warps
        self.const_cols, self.two_reads, self.int64 = const_cols, two_reads, int64

    def forward(self, x):
        n_rows, n_cols = x.shape
        y = torch.empty_like(x)
        _rms_row[(n_rows,)](x, self.weight, y, n_cols, self.eps, BLOCK=triton.next_power_of_2(n_cols),
                            NC=n_cols if self.const_cols else 0, TWO_READS=self.two_reads, INT64=self.int64,
                            num_warps=self.num_warps)
        return y


def show_inductor(task: str, compiled, inputs) -> None:
    from torch._inductor.utils import run_and_get_code

    _, sources = run_and_get_code(compiled, *inputs)
    print(f"\n===== Inductor's code for {task} =====")
    for src in sources:
        keep, on = [], False
        for line in src.splitlines():
            if line.startswith("@triton_heuristics") or line.startswith("@triton.jit"):
                on = True
            if on:
                keep.append(line)
            if on and line.startswith("''', device_str"):
                on = False
            if "grid=" in line or ".run(" in line:
                keep.append("LAUNCH: " + line.strip())
        print("\n".join(keep))
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR", f"/tmp/torchinductor_{os.environ.get('USER', 'root')}")
    for f in glob.glob(f"{cache}/**/*.best_config", recursive=True):
        print("best_config", f, Path(f).read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="rmsnorm,layernorm")
    p.add_argument("--budget", type=float, default=0.3)
    args = p.parse_args()
    rows = []
    for task in args.tasks.split(","):
        module = load_module(REPO / "benchmarks" / "tasks" / f"{task}.py", f"task_{task}")
        torch.manual_seed(0)
        with torch.device("cuda"):
            inputs = [a.contiguous() for a in module.get_inputs()]
        torch.manual_seed(0)
        model = module.Model(*module.get_init_inputs()).cuda().eval()
        compiled = torch.compile(model)
        with torch.no_grad():
            show_inductor(task, compiled, inputs)

        def timed(label, fn):
            with torch.no_grad():
                ok = torch.allclose(fn(*inputs), model(*inputs), atol=1e-4, rtol=1e-4)  # timing rolls the inputs
                summary, _ = time_calls(fn, [inputs], "cuda", budget_s=args.budget)
            rows.append((task, label, summary["median_ms"], ok))
            print(task, label, f"{summary['median_ms']:.4f}", ok, flush=True)

        timed("torch.compile", compiled)
        if task == "rmsnorm":
            w = model.weight.detach()
            for nw in (16,):
                for const_cols in (False, True):
                    for two_reads in (False, True):
                        for int64 in (True, False):
                            timed(f"NW{nw} const_cols={const_cols} two_reads={two_reads} int64={int64}",
                                  RmsVariant(w, model.eps, nw, const_cols, two_reads, int64))
        baseline = REPO / "benchmarks" / "baselines" / f"{task}.py"
        if baseline.exists():
            from appliance.proposers.tune import read_tunables, with_values
            import itertools
            import tempfile
            text = baseline.read_text()
            grid = {k: v for k, v in read_tunables(text).items() if k in ("NUM_WARPS", "L2_HINTS", "MAX_BLOCK")}
            grid["NUM_WARPS"] = [16]
            grid["MAX_BLOCK"] = [8192, "row"]
            folder = Path(tempfile.mkdtemp())
            for i, combo in enumerate(itertools.product(*grid.values())):
                values = dict(zip(grid, combo))
                path = folder / f"{task}_{i}.py"
                path.write_text(with_values(text, values))
                torch.manual_seed(0)
                cand = load_module(path, f"{task}_{i}").ModelNew(*module.get_init_inputs()).cuda()
                timed("baseline " + ", ".join(f"{k}={v}" for k, v in values.items()), cand)
        timed("torch.compile again", compiled)
    print("\n| task | variant | ms | vs torch.compile | correct |\n|---|---|---|---|---|")
    for task, label, ms, ok in rows:
        ref = next(m for t, l, m, _ in rows if t == task and l == "torch.compile")
        print(f"| {task} | {label} | {ms:.4f} | {ref / ms:.3f}x | {'yes' if ok else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
