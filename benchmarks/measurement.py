#!/usr/bin/env python3
"""The measurement itself: is the pipeline's number repeatable, and does it agree with triton.testing.do_bench?

    python3 benchmarks/measurement.py [--tasks softmax,rmsnorm,mse_loss] [--repeats 10] [--device auto] [--quick]

For each bundled task, its baseline is evaluated --repeats times through the real jailed pipeline (the eager and
compile baselines are prepared once, as in a run: their intercepts cap the candidate's; only the candidate's
number is studied). Reported: the median of the candidate's main-shape
medians, their CV across evaluations (target <= 1% on the GPU), do_bench's median for the same module on the same
main-shape inputs and the ratio pipeline / do_bench (target within 3%), and the wall seconds of one evaluation
per process. A row is printed as soon as its task is done (a run killed at a time limit keeps the finished rows;
rerun the rest with --tasks); the whole table is printed again at the end. --quick: 3 repeats. The evaluations run
--in-flight at a time (default 3, as the loop runs them on a GPU): their correctness and timing take turns on the
device, so the CV also shows that overlapping evaluations do not disturb each other's numbers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from appliance.evaluation.pipeline import EvalSettings, Pipeline, resolve_device  # noqa: E402
from appliance.tasks import load_task  # noqa: E402
from sandbox.jail import Jail  # noqa: E402

STAGES = ("candidate", "held")
HEADER = ("| task | repeats | median of medians ms | CV % | do_bench ms | ratio | prepare s (once) | "
          "per eval s: referee + server, device held | s per eval, in flight |\n"
          "|---|---|---|---|---|---|---|---|---|")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def pipeline_repeats(task, baseline: Path, device: str, repeats: int, in_flight: int, mode: str | None = None
                     ) -> tuple[list[float], list[dict], str, float]:
    """The candidate's main-shape median and the wall seconds per process, once per evaluation; with `in_flight`
    evaluations at once, as the optimisation loop runs them (their measurements take turns on the device).
    Inputs and baselines are prepared once, by the first evaluation, as in a run."""
    from concurrent.futures import ThreadPoolExecutor

    # Both baselines, as a run has them: their servers' intercepts cap what is taken off a candidate's batches
    settings = EvalSettings(device=device, mode=mode, baselines=("eager", "compile"), reuse_inputs=True)
    pipeline = Pipeline(Jail(gpu=0 if device == "cuda" else None), settings, slots=in_flight)
    first = pipeline.evaluate(task, baseline)  # prepares the inputs (measured below as "prepare")
    outcomes = [first]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(in_flight) as pool:
        outcomes += list(pool.map(lambda _: pipeline.evaluate(task, baseline), range(repeats - 1)))
    per_eval_s = (time.perf_counter() - t0) / max(repeats - 1, 1)
    pipeline.close()
    medians, walls = [], []
    trusted = {t["implementation"]: t.get("own_fixed_ms") for t in first.timings
               if t["shape"] == "main" and t["implementation"] != "candidate"}
    log(f"  {task.name}: the trusted servers' intercepts (timed in the prepare, alone), ms: {trusted}")
    for i, outcome in enumerate(outcomes):
        if not outcome.passed:
            raise RuntimeError(f"{outcome.verdict}: {outcome.reason}")
        main = next(t for t in outcome.timings if t["shape"] == "main" and t["implementation"] == "candidate")
        medians.append(main["median_ms"])
        sizes = main.get("batch_sizes") or []
        slope = ((main["large_batch_ms"] - main["small_batch_ms"]) / (sizes[-1] - sizes[0])
                 if len(sizes) == 2 and main.get("large_batch_ms") is not None else None)
        walls.append(dict(outcome.details["wall_s"]) | {"held": outcome.details["device_turns"]["held_s"]})
        log(f"  {task.name} {i + 1}/{repeats}: {main['median_ms']:.4g} ms (iqr {main['iqr_ms']:.3g}, "
            f"{main['reps']} reps, slope_ms {slope and round(slope, 5)}, " + ", ".join(f"{k} {main.get(k)}" for k in (
                "calls_per_batch", "batches", "raw_window_ms", "tiny_ms", "fixed_ms", "own_fixed_ms", "fixed_cap_ms",
                "small_batch_ms", "large_batch_ms", "stage_ms", "read_ms", "outputs_in_arena"))
            + f"), walls {walls[-1]}, stages {outcome.details.get('stage_s')}, "
            f"held by process {outcome.details['device_turns'].get('held_s_by_process')}")
    return medians, walls, first.mode, per_eval_s


def do_bench_ms(task, baseline: Path, mode: str) -> float:
    """do_bench on the baseline for the main shape's seed-0 inputs, built by the harness's own functions.

    Unjailed, in this process: the baseline is our own trusted code, and so is the task (the reference harness
    runs it too). Only ever on CUDA, so TRITON_INTERPRET is not set and the kernels are compiled for the GPU.
    """
    import torch
    from triton.testing import do_bench

    from sandbox.harness.common import load_module
    from sandbox.harness.task_code import init_inputs, make_inputs, set_sizes

    spec = {"device": "cuda", "dtype": task.manifest.dtype, "task_display": str(task.path)}
    shape = vars(task.shapes(mode)[0])  # "main" at the pipeline's size mode
    module = load_module(task.path, f"task_{task.name}")
    set_sizes(module, shape)
    init, args = init_inputs(spec, module, 0), make_inputs(spec, module, shape, 0)
    torch.manual_seed(0)  # ModelNew is built as the candidate harness builds it: seed, CPU, then device and dtype
    model = load_module(baseline, f"baseline_{task.name}").ModelNew(*init).to("cuda")
    if spec["dtype"]:
        model = model.to(getattr(torch, spec["dtype"]))
    with torch.no_grad():
        ms = do_bench(lambda: model(*args), warmup=100, rep=1000, return_mode="median")  # flushes L2 per call
    del model, args
    torch.cuda.empty_cache()  # the next task's jailed processes want the memory back
    return ms


def row(name: str, repeats: int, medians: list[float], walls: list[dict], bench: float | None, per_eval_s: float,
        in_flight: int) -> str:
    mid = statistics.median(medians)
    cv = 100 * statistics.stdev(medians) / statistics.mean(medians) if len(medians) > 1 else float("nan")
    bench_text, ratio = ("n/a (needs CUDA)", "n/a") if bench is None else (f"{bench:.4g}", f"{mid / bench:.3f}")
    later = walls[1:] or walls
    wall = " / ".join(f"{statistics.median(w.get(k, 0.0) for w in later):.1f}" for k in STAGES)
    return (f"| {name} | {repeats} | {mid:.4g} | {cv:.2f} | {bench_text} | {ratio} | {walls[0].get('prepare', 0):.1f} "
            f"| {wall} | {per_eval_s:.1f} ({in_flight} in flight) |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="softmax,rmsnorm,mse_loss")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    parser.add_argument("--in-flight", type=int, default=3, help="evaluations at once (the loop's default per GPU)")
    parser.add_argument("--sizes", default="", help="main-shape sizes to override, e.g. batch_size=2048 (a "
                        "10-100 us kernel at rmsnorm's dim)")
    parser.add_argument("--mode", default=None, help="small | full (default: full on a GPU): small sizes give the "
                        "10-100 us kernels")
    args = parser.parse_args()
    device = resolve_device(args.device)
    repeats = 3 if args.quick else args.repeats

    print(f"\nMeasurement on {device} ({'full' if device == 'cuda' else 'small'} sizes), {repeats} jailed "
          "evaluations of each baseline\n", flush=True)
    print(HEADER, flush=True)
    rows = []
    for name in args.tasks.split(","):
        task = load_task(REPO / "benchmarks/tasks" / f"{name}.py")
        task.sizes = task.sizes | {k: int(v) for k, v in (kv.split("=") for kv in args.sizes.split(",") if kv)}
        baseline = REPO / "benchmarks/baselines" / f"{name}.py"
        try:
            medians, walls, mode, per_eval = pipeline_repeats(task, baseline, device, repeats, args.in_flight,
                                                              args.mode)
            bench = do_bench_ms(task, baseline, mode) if device == "cuda" else None
            rows.append(row(f"{name} {args.sizes}".strip(), repeats, medians, walls, bench, per_eval, args.in_flight))
        except Exception as exc:  # noqa: BLE001 - one broken task must not cost the other rows
            rows.append(f"| {name} | failed: {type(exc).__name__}: {str(exc)[:200]} | | | | | |")
        print(rows[-1], flush=True)
    if len(rows) > 1:
        print(f"\n{HEADER}\n" + "\n".join(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
