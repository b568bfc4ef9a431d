#!/usr/bin/env python3
"""The way common public harnesses evaluate a candidate (KernelBench-style), as a throughput baseline.

    python benchmarks/naive_harness.py --task benchmarks/tasks/softmax.py [--device auto] [--mode small|full]
                                       [--gpu 0] [--inputs cpu|device] CANDIDATE.py...

Candidates are evaluated one after another, each in a fresh Python process: import the task and the candidate
from their files, build Model and ModelNew with the same seed, 5 correctness trials on fresh get_inputs()
(torch.allclose), then 100 timed calls of ModelNew (CUDA events on a GPU, perf_counter on the CPU). Prints the
wall time per candidate (process start to exit) and candidates per hour.

--inputs cpu (the default) draws each trial's inputs as KernelBench's eval does: get_inputs() as the task wrote
it (on the CPU), then copied to the device. --inputs device draws them on the device instead (get_inputs() under
`with device:`), which is faster and favours this baseline.

UNJAILED: candidates run in plain processes with this user's rights. That is fine here only because the inputs
are our own baseline variants (the appliance's tuner rewrites of benchmarks/baselines); never feed it untrusted code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORRECT_TRIALS, WARMUP, TIMED_TRIALS, SEED = 5, 3, 100, 42


def _load(path: str, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # Triton looks kernels' source up through the module
    spec.loader.exec_module(module)
    return module


def worker(spec: dict) -> dict:
    """One candidate, in its own process (what KernelBench's eval_kernel_against_ref does)."""
    if spec["device"] == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton is imported: kernels run in its interpreter
    import torch

    task, cand = _load(spec["task"], "task"), _load(spec["candidate"], "candidate")
    for name, value in spec["sizes"].items():  # the same size override the appliance's harness applies
        setattr(task, name, value)
    device = torch.device(spec["device"])
    dtype = getattr(torch, spec["dtype"]) if spec["dtype"] else None

    def build(cls, init):
        torch.manual_seed(SEED)  # same seed before each constructor: identical parameters
        model = cls(*init).to(device)
        return (model.to(dtype) if dtype else model).eval()

    def inputs(seed: int) -> list:
        torch.manual_seed(seed)
        if spec["inputs"] == "device":
            with device:
                xs = task.get_inputs()
        else:  # KernelBench: drawn where get_inputs puts them, then moved
            xs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
        return [x.to(dtype) if dtype and isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]

    def outputs(result) -> list:
        return list(result) if isinstance(result, (tuple, list)) else [result]

    torch.manual_seed(SEED)
    init = task.get_init_inputs()
    ref, new = build(task.Model, init), build(cand.ModelNew, init)
    with torch.no_grad():
        for trial in range(CORRECT_TRIALS):
            xs = inputs(SEED + trial)
            for want, got in zip(outputs(ref(*xs)), outputs(new(*xs)), strict=True):
                tol = 1e-2 if want.dtype in (torch.bfloat16, torch.float16) else 1e-4
                if got.shape != want.shape or not torch.allclose(got.to(want.dtype), want, atol=tol, rtol=tol):
                    return {"correct": False, "error": f"trial {trial}: output mismatch"}
        xs = inputs(SEED)
        for _ in range(WARMUP):
            new(*xs)
        times = []
        for _ in range(TIMED_TRIALS):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                new(*xs)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                new(*xs)
                times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {"correct": True, "median_ms": times[len(times) // 2], "mean_ms": sum(times) / len(times)}


def run_candidates(task_path: Path, files: list[Path], device: str = "auto", mode: str | None = None,
                   gpu: int = 0, timeout_s: float = 600.0, log=print, inputs: str = "cpu") -> dict:
    """Evaluate `files` serially, one fresh process each; wall time is measured around each process. `inputs`:
    where each trial's inputs are drawn ("cpu" as KernelBench does, or "device")."""
    if inputs not in ("cpu", "device"):
        raise ValueError(f"inputs must be 'cpu' or 'device', not {inputs!r}")
    sys.path.insert(0, str(REPO))
    from appliance.evaluation.pipeline import resolve_device
    from appliance.tasks import load_task

    device = resolve_device(device)
    task = load_task(task_path)
    # The appliance's main shape in the same size mode (small on the CPU by default), so both do the same work.
    sizes = task.shapes(mode or ("full" if device == "cuda" else "small"))[0].sizes
    env = dict(os.environ)
    if device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    results, total = [], 0.0
    # A Triton cache of its own: no kernel compiled by an earlier run (or the appliance) is reused, as on a fresh
    # machine; candidates of this run share it, as they would in a KernelBench run.
    with tempfile.TemporaryDirectory(prefix="naive-triton-") as cache:
        env["TRITON_CACHE_DIR"] = cache
        for path in files:
            spec = {"task": str(Path(task_path).resolve()), "candidate": str(Path(path).resolve()), "device": device,
                    "sizes": sizes, "dtype": task.manifest.dtype, "inputs": inputs}
            t0 = time.perf_counter()
            try:
                proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], env=env,
                                      capture_output=True, text=True, timeout=timeout_s)
                lines = proc.stdout.strip().splitlines()
                result = json.loads(lines[-1]) if proc.returncode == 0 and lines else \
                    {"correct": False, "error": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
            except subprocess.TimeoutExpired:
                result = {"correct": False, "error": f"timeout after {timeout_s:.0f} s"}
            wall = time.perf_counter() - t0
            total += wall
            results.append(result | {"candidate": str(path), "wall_s": round(wall, 2)})
            verdict = f"correct, {result['median_ms']:.4g} ms" if result["correct"] else f"failed: {result['error']}"
            log(f"naive (inputs on {inputs}): {Path(path).name}: {wall:.1f} s, {verdict}")
    per_hour = len(files) / (total / 3600) if total else None
    return {"device": device, "inputs": inputs, "sizes": sizes, "candidates": len(files), "wall_s": round(total, 1),
            "per_hour": per_hour, "results": results}


def main() -> int:
    if sys.argv[1:2] == ["--worker"]:
        try:
            result = worker(json.loads(sys.argv[2]))
        except Exception as e:  # noqa: BLE001 - any failure of the candidate is a failed evaluation
            result = {"correct": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", type=Path, required=True)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--mode", choices=("small", "full"))
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--inputs", choices=("cpu", "device"), default="cpu")
    parser.add_argument("candidates", type=Path, nargs="+")
    args = parser.parse_args()
    summary = run_candidates(args.task, args.candidates, args.device, args.mode, args.gpu,
                             log=lambda line: print(line, flush=True), inputs=args.inputs)
    print(f"{summary['candidates']} candidates in {summary['wall_s']} s on {summary['device']}: "
          f"{summary['per_hour']:.0f} candidates per hour")
    return 0


if __name__ == "__main__":
    sys.exit(main())
