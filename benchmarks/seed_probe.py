#!/usr/bin/env python3
"""The `compile` seed beside the torch.compile it was written from, at a task's main shape: is a gap the kernels'
or the launches'?

    python benchmarks/seed_probe.py --task benchmarks/tasks/softmax.py [--seed SEED.py]

Without --seed the seed is written out here (sandbox.harness.inductor_seed, in this process). Times with
triton.testing.do_bench (device time of back-to-back calls) and the host's time per call without a sync (what a
launch costs the CPU). UNJAILED: the task's code and our own generated code only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import triton.testing

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def host_ms(fn, calls: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e3
    torch.cuda.synchronize()
    return host


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, type=Path)
    parser.add_argument("--seed", type=Path, help="a compile seed's source (default: write one out here)")
    args = parser.parse_args()
    from sandbox.harness.common import load_module

    task = load_module(args.task, "task_under_probe")
    torch.manual_seed(0)
    with torch.device("cuda"):
        inputs = list(task.get_inputs())
    init = list(task.get_init_inputs())
    torch.manual_seed(0)
    model = task.Model(*init).cuda()
    compiled = torch.compile(model)
    seed_path = args.seed
    if seed_path is None:
        sys.exit("give --seed SEED.py (the seed a run stored: appliance show CANDIDATE --source)")
    seed = load_module(seed_path, "seed_under_probe")
    torch.manual_seed(0)
    new = seed.ModelNew(*init).cuda()
    with torch.no_grad():
        ref = compiled(*inputs)
        out = new(*inputs)
        print(f"max |seed - compile| = {(out - ref).abs().max().item():.3g}")
        print("| implementation | do_bench ms | host ms per call (no sync) |\n|---|---|---|")
        for label, fn in (("eager", lambda: model(*inputs)), ("torch.compile", lambda: compiled(*inputs)),
                          ("compile seed", lambda: new(*inputs))):
            print(f"| {label} | {triton.testing.do_bench(fn, warmup=50, rep=300):.4f} | {host_ms(fn):.4f} |",
                  flush=True)
        for label, fn in (("torch.compile", lambda: compiled(*inputs)), ("compile seed", lambda: new(*inputs))):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
            print(f"\n{label}: device kernels over 10 calls")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6, max_name_column_width=70))
    return 0


if __name__ == "__main__":
    sys.exit(main())
