#!/usr/bin/env python3
"""Jail overhead: the same evaluation jailed and unjailed, interleaved, in one run (target: <= 5% of wall time).

    python3 benchmarks/jail_overhead.py [--task softmax] [--reps 3] [--device auto]

Measures (1) start-up: bwrap + seccomp + cgroup around `python -c pass` vs the bare command, and (2) steady state:
a whole `Pipeline.evaluate` of a bundled task's baseline (three processes), jailed vs --unsafe-no-jail,
alternating so that drift hits both sides alike. Prints a Markdown table; ratios are what to quote.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from appliance.evaluation.pipeline import EvalSettings, Pipeline, resolve_device  # noqa: E402
from appliance.tasks import load_task  # noqa: E402
from sandbox.jail import Jail  # noqa: E402


def startup(jailed: bool, reps: int) -> list[float]:
    jail = Jail(unsafe_no_jail=not jailed)
    times = []
    with tempfile.TemporaryDirectory() as d:
        for _ in range(reps):
            t0 = time.perf_counter()
            r = jail.run([sys.executable, "-c", "pass"], workdir=Path(d) / "w", timeout_s=60)
            times.append(time.perf_counter() - t0)
            assert r.returncode == 0, r.stderr
    return times


def evaluation(task, baseline: Path, jailed: bool, device: str) -> tuple[float, dict]:
    gpu = 0 if device == "cuda" else None
    settings = EvalSettings(device=device, baselines=("eager",), timing_budget_s=0.5)
    pipeline = Pipeline(Jail(unsafe_no_jail=not jailed, gpu=gpu), settings)
    t0 = time.perf_counter()
    outcome = pipeline.evaluate(task, baseline)
    wall = time.perf_counter() - t0
    assert outcome.passed, outcome.reason
    return wall, dict(outcome.details["wall_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="softmax")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    device = resolve_device(args.device)
    task = load_task(REPO / "benchmarks/tasks" / f"{args.task}.py")
    baseline = REPO / "benchmarks/baselines" / f"{args.task}.py"

    start = {True: startup(True, 10), False: startup(False, 10)}
    walls: dict[bool, list[float]] = {True: [], False: []}
    parts: dict[bool, list[dict]] = {True: [], False: []}
    evaluation(task, baseline, True, device)  # warm caches (page cache, Triton's on-disk cache is per job anyway)
    for _ in range(args.reps):
        for jailed in (True, False):
            wall, part = evaluation(task, baseline, jailed, device)
            walls[jailed].append(wall)
            parts[jailed].append(part)

    med = statistics.median
    print(f"\nJail overhead on {device} ({args.task}, {'full' if device == 'cuda' else 'small'} sizes), "
          f"medians of {args.reps} interleaved evaluations, 10 start-ups\n")
    print("| measure | jailed s | unjailed s | overhead s | overhead % |")
    print("|---|---|---|---|---|")
    rows = [("start-up (`python -c pass`)", med(start[True]), med(start[False]))]
    rows.append(("whole evaluation", med(walls[True]), med(walls[False])))
    for proc in ("prepare", "candidate", "check"):
        rows.append((f"  {proc} process", med(p[proc] for p in parts[True]), med(p[proc] for p in parts[False])))
    for name, j, u in rows:
        print(f"| {name} | {j:.3f} | {u:.3f} | {j - u:+.3f} | {100 * (j - u) / u:+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
