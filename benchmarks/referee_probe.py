"""Where the referee's time goes on the GPU: do_bench on plain tensors, do_bench on tensors in a VMM pool, and
the referee's own batches (call and collection separately), for one task's baseline at its main shape.

    python3 benchmarks/referee_probe.py [--task rmsnorm] [--sizes batch_size=2048]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    import torch
    from triton.testing import do_bench

    from appliance.tasks import load_task
    from sandbox.harness.common import load_module
    from sandbox.harness.shared import Pool, layout
    from sandbox.harness.task_code import init_inputs, make_inputs, set_sizes

    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="rmsnorm")
    parser.add_argument("--sizes", default="")
    args = parser.parse_args()
    task = load_task(REPO / "benchmarks/tasks" / f"{args.task}.py")
    task.sizes = task.sizes | {k: int(v) for k, v in (kv.split("=") for kv in args.sizes.split(",") if kv)}
    shape = vars(task.shapes("full")[0])
    spec = {"device": "cuda", "dtype": task.manifest.dtype, "task_display": str(task.path)}
    module = load_module(task.path, "task")
    set_sizes(module, shape)
    init, x = init_inputs(spec, module, 0), make_inputs(spec, module, shape, 0)
    torch.manual_seed(0)
    model = load_module(REPO / "benchmarks/baselines" / f"{args.task}.py", "cand").ModelNew(*init).cuda()
    with torch.no_grad():
        plain = do_bench(lambda: model(*x), warmup=100, rep=500, return_mode="median")
        out = model(*x)
        entries, nbytes = layout([(str(a.dtype).removeprefix("torch."), tuple(a.shape), None) for a in x] +
                                 [(str(out.dtype).removeprefix("torch."), tuple(out.shape), None)])
        pool = Pool.create("cuda", nbytes)
        views = [pool.tensor(e) for e in entries]
        for v, a in zip(views, x):
            v.copy_(a)
        vmm = do_bench(lambda: model(*views[:-1]), warmup=100, rep=500, return_mode="median")
        copy = do_bench(lambda: views[-1].copy_(model(*views[:-1])), warmup=100, rep=500, return_mode="median")
        # A single call timed like the referee does, but in this process: flush, sync, clock, call, sync, clock.
        flush = torch.empty(256 << 18, dtype=torch.int32, device="cuda")
        host = []
        for _ in range(100):
            flush.zero_()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(*views[:-1])
            torch.cuda.synchronize()
            host.append((time.perf_counter() - t0) * 1e3)
        nvml = []
        from sandbox.harness.energy import EnergyMeter
        meter = EnergyMeter()
        for _ in range(5):
            t0 = time.perf_counter()
            meter.millijoules()
            nvml.append((time.perf_counter() - t0) * 1e3)
    print(f"| {args.task} {args.sizes} | do_bench plain {plain:.4g} ms | do_bench VMM {vmm:.4g} ms | + copy into "
          f"pool {copy:.4g} ms | host clock, flushed, in-process {statistics.median(host):.4g} ms | NVML read "
          f"{statistics.median(nvml):.3g} ms |")
    pool.close()
    del views, x, model, flush, out
    torch.cuda.empty_cache()
    from appliance.evaluation.pipeline import EvalSettings, Pipeline
    from sandbox.jail import Jail

    pipeline = Pipeline(Jail(gpu=0), EvalSettings(device="cuda", baselines=("eager",)))
    outcome = pipeline.evaluate(task, REPO / "benchmarks/baselines" / f"{args.task}.py")
    pipeline.close()
    print("verdict", outcome.verdict, outcome.reason[:200])
    keys = ("median_ms", "iqr_ms", "calls_per_batch", "batches", "empty_ms", "collect_ms", "collect_excess_ms",
            "checked_calls", "energy_j_per_call")
    for t in outcome.timings:
        if t["shape"] == "main":
            print("  ", t["implementation"], {k: t.get(k) for k in keys})
    print("   stages", outcome.details.get("stage_s"), "held", outcome.details["device_turns"]["held_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
