#!/usr/bin/env python3
"""What judging the checked timed calls costs, three ways: every checked call judged whole ("whole"), the later
ones at the referee's secret sample of elements and then in norm by torch ops ("sampled", about 20 passes over a
float64 copy), and the same with large outputs judged in one fused Triton pass ("sampled+fused", the default).

    python3 benchmarks/check_cost.py [--tasks rmsnorm] [--candidate-dir benchmarks/baselines] [--repeats 2]
                                     [--device auto] [--mode full|small] [--timing-budget 1.0]
                                     [--sizes batch_size=2048] [--candidate NAME]
                                     [--ways whole,sampled,sampled+fused]

Each task's candidate (its bundled baseline) is evaluated --repeats times each way through the real jailed
pipeline, alternating. Reported per way: the referee's correctness and timing stages (the device is held for both),
the checked calls of the main shape and the main shape's median, so that the timing itself can be seen unchanged;
then where the main shape's timing stage went, seconds per phase (the referee's `referee_s`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from appliance.evaluation.pipeline import EvalSettings, Pipeline, resolve_device  # noqa: E402
from appliance.tasks import load_task  # noqa: E402
from sandbox.harness.referee import CHECKED_ELEMENTS  # noqa: E402
from sandbox.jail import Jail  # noqa: E402

# (checked elements after each shape's first, large outputs judged in one fused pass on the GPU)
WAYS = {"whole": (1 << 62, True), "sampled": (CHECKED_ELEMENTS, False), "sampled+fused": (CHECKED_ELEMENTS, True)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="rmsnorm")
    parser.add_argument("--candidate-dir", type=Path, default=REPO / "benchmarks" / "baselines")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--mode", default=None)
    parser.add_argument("--timing-budget", type=float, default=1.0)
    parser.add_argument("--ways", default=",".join(WAYS), help="which of " + ", ".join(WAYS))
    parser.add_argument("--sizes", default="", help="main-shape sizes to override, e.g. batch_size=2048")
    parser.add_argument("--candidate", default=None, help="the candidate file's name in --candidate-dir "
                                                          "(default: the task's)")
    args = parser.parse_args()
    device = resolve_device(args.device)
    ways = [w for w in args.ways.split(",") if w]
    if unknown := set(ways) - set(WAYS):
        parser.error(f"unknown way(s) {sorted(unknown)}: choose among {', '.join(WAYS)}")
    print(f"\nJudging checked timed calls on {device}: whole, sampled ({CHECKED_ELEMENTS} elements after each "
          "shape's first), sampled with the fused pass\n\n| task | way | repeats | verdict | correctness s | timing s | checked calls (main) | "
          "main median ms |\n|---|---|---|---|---|---|---|---|", flush=True)
    for name in args.tasks.split(","):
        task = load_task(REPO / "benchmarks" / "tasks" / f"{name}.py")
        task.sizes = task.sizes | {k: int(v) for k, v in (kv.split("=") for kv in args.sizes.split(",") if kv)}
        stages: dict[str, list] = {way: [] for way in ways}
        phases: dict[str, list[dict]] = {way: [] for way in ways}  # the main shape's timing stage, per phase
        for _ in range(args.repeats):
            for way in ways:  # alternating: drift falls on all alike
                elements, fused = WAYS[way]
                settings = EvalSettings(device=device, mode=args.mode, baselines=("eager",),
                                        timing_budget_s=args.timing_budget, reuse_inputs=True,
                                        checked_elements=elements, fused_compare=fused)
                pipeline = Pipeline(Jail(gpu=0 if device == "cuda" else None), settings)
                try:
                    outcome = pipeline.evaluate(task, args.candidate_dir / f"{args.candidate or name}.py")
                finally:
                    pipeline.close()
                referee = (outcome.details.get("stage_s") or {}).get("referee") or {}
                main = next((t for t in outcome.timings if t.get("shape") == "main"
                             and t.get("implementation") == "candidate"), {})
                stages[way].append((outcome.verdict, referee.get("correctness"), referee.get("timing"),
                                    main.get("checked_calls"), main.get("median_ms")))
                phases[way].append((main.get("referee_s") or {}) | {"fused": main.get("fused_compare", 0)})
        for way, rows in stages.items():
            def med(i):
                values = [r[i] for r in rows if isinstance(r[i], (int, float))]
                return f"{statistics.median(values):.4g}" if values else "-"
            verdicts = ",".join(sorted({r[0] for r in rows}))
            print(f"| {name} | {way} | {len(rows)} | {verdicts} | {med(1)} | {med(2)} | {med(3)} | {med(4)} |",
                  flush=True)
        for way, runs in phases.items():  # where the main shape's timing stage went (the referee's clock)
            keys = sorted({k for r in runs for k in r})
            spent = ", ".join(f"{k} {statistics.median(r.get(k, 0.0) for r in runs):.3g}" for k in keys)
            print(f"\n{name}, {way}: main shape's timing stage, median s per phase: {spent or '-'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
