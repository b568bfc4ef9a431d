#!/usr/bin/env python3
"""Does a measurement under load agree with the baselines measured alone, and what does the quiet cost?

    python benchmarks/quiet_probe.py [--task benchmarks/tasks/softmax.py] [--candidate benchmarks/baselines/softmax.py]
                                     [--copies 8] [--slots 4] [--device cuda]

The same candidate is evaluated `copies` times, `slots` at once (the load a run puts on a worker), twice: with
quiet measurements (every other evaluation's processes stopped while one measures, sandbox/gate.py) and without.
The baselines are measured alone, during prepare, in both. Printed per mode: the candidate's median at the main
shape over the copies, their CV, its ratio to the compile baseline (eager on the CPU), seconds stopped, and
evaluations per hour of wall time. An unloaded reference line evaluates one copy at a time.
Jailed, like every evaluation; run it on a GPU host for numbers that mean anything (`--device cpu` runs it at
small sizes in Triton's interpreter, as a check that it works).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def one_mode(task, candidate: Path, copies: int, slots: int, device: str, quiet: bool, jobs: Path) -> dict:
    from appliance.evaluation.pipeline import EvalSettings, Pipeline
    from sandbox.jail import Jail

    baselines = ("eager", "compile") if device == "cuda" else ("eager",)
    settings = EvalSettings(device=device, baselines=baselines, jobs_dir=jobs, reuse_inputs=True,
                            quiet_measurements=quiet, timing_budget_s=1.0 if device == "cuda" else 0.05)
    pipeline = Pipeline(Jail(gpu=0 if device == "cuda" else None), settings, slots=slots)
    try:
        pipeline.prepare(task)
        start = time.monotonic()
        with ThreadPoolExecutor(slots) as pool:
            outcomes = list(pool.map(lambda _: pipeline.evaluate(task, candidate), range(copies)))
        wall = time.monotonic() - start
    finally:
        pipeline.close()
    rows = [{t["implementation"]: t for t in o.timings if t["shape"] == "main"} for o in outcomes]
    verdicts = [o.verdict for o in outcomes]
    medians = [r["candidate"]["median_ms"] for r in rows if "candidate" in r]
    against = baselines[-1]
    base = next((r[against]["median_ms"] for r in rows if against in r), None)
    paused = [o.details.get("device_turns", {}).get("paused_s", 0.0) for o in outcomes]
    return {"verdicts": verdicts, "median_ms": statistics.median(medians) if medians else None,
            "cv": statistics.pstdev(medians) / statistics.mean(medians) if len(medians) > 1 else None,
            "base_ms": base, "against": against, "paused_s": sum(paused), "per_hour": copies / wall * 3600}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", type=Path, default=REPO / "benchmarks/tasks/softmax.py")
    parser.add_argument("--candidate", type=Path, default=REPO / "benchmarks/baselines/softmax.py")
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    from appliance.tasks import load_task

    task = load_task(args.task)
    jobs = Path(tempfile.mkdtemp(prefix="quiet-probe-"))
    results = {}
    for label, slots, quiet in (("alone (1 at a time)", 1, True), (f"{args.slots} at once, quiet", args.slots, True),
                                (f"{args.slots} at once, not quiet", args.slots, False)):
        copies = max(2, args.copies // 2) if slots == 1 else args.copies
        results[label] = one_mode(task, args.candidate, copies, slots, args.device, quiet, jobs)
        print(f"{label}: {results[label]}", file=sys.stderr, flush=True)
    print(f"\n{args.task.name}, candidate {args.candidate.name}, {args.device}\n")
    print("| mode | candidate median ms | CV | vs baseline (alone) | seconds stopped | evaluations/h | verdicts |")
    print("|---|---|---|---|---|---|---|")
    for label, r in results.items():
        ratio = r["base_ms"] / r["median_ms"] if r["base_ms"] and r["median_ms"] else None
        cv = "-" if r["cv"] is None else f"{r['cv'] * 100:.2f}%"
        vs = "-" if ratio is None else f"{ratio:.3f}x {r['against']}"
        verdicts = ",".join(sorted(set(r["verdicts"])))
        print(f"| {label} | {r['median_ms'] or float('nan'):.4f} | {cv} | {vs} | {r['paused_s']:.1f} | "
              f"{r['per_hour']:.0f} | {verdicts} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
