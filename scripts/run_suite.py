#!/usr/bin/env python3
"""Evaluate every bundled task's baseline through the real CLI and print one table (the GPU acceptance run).

    python3 scripts/run_suite.py [--out DIR] [--only softmax,cumsum] [-- extra appliance eval args]

Each evaluation runs `python -m appliance eval TASK BASELINE --json` in a subprocess, exactly as a user would;
the JSON of each lands in DIR (default: ./suite-results), the table on stdout.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("suite-results"))
    parser.add_argument("--only", default="", help="comma-separated task names")
    parser.add_argument("extra", nargs="*", help="extra arguments for `appliance eval` (after --)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    only = {n for n in args.only.split(",") if n}
    tasks = sorted(p for p in (REPO / "benchmarks/tasks").glob("*.py") if not only or p.stem in only)
    rows = []
    for task in tasks:
        baseline = REPO / "benchmarks/baselines" / task.name
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "appliance", "eval", str(task), str(baseline), "--json",
                               *args.extra], capture_output=True, text=True)
        wall = time.monotonic() - t0
        (args.out / f"{task.stem}.json").write_text(proc.stdout or "{}")
        try:
            result = json.loads(proc.stdout)
        except ValueError:
            result = {"verdict": "harness_error", "reason": proc.stderr.strip()[-300:]}
        if result.get("verdict") != "pass":
            (args.out / f"{task.stem}.stderr").write_text(proc.stderr)
        rows.append((task.stem, result, wall))
        print(table(rows[-1:]).splitlines()[-1], flush=True)  # partial results survive a cut-off run
    print()
    print(table(rows))
    return 0 if all(r.get("verdict") == "pass" for _, r, _ in rows) else 1


def table(rows) -> str:
    head = ["task", "verdict", "device", "candidate ms", "eager ms", "compile ms", "vs eager", "vs compile", "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r, wall in rows:
        main = {t["implementation"]: t for t in r.get("timings", []) if t["shape"] == "main"}

        def ms(impl):
            t = main.get(impl, {})
            return f"{t['median_ms']:.4g} ±{t['iqr_ms']:.2g}" if t.get("median_ms") else "-"

        def x(v):
            return f"{v:.2f}x" if v else "-"

        verdict = r.get("verdict") or f"error: {r.get('error', '')[:60]}"
        if verdict != "pass":
            verdict += f" ({r.get('stage', '')}: {r.get('reason', '')[:80]})"
        lines.append("| " + " | ".join([name, verdict, r.get("device", "-"), ms("candidate"), ms("eager"),
                                         ms("compile"), x(r.get("speedup_vs_eager")),
                                         x(r.get("speedup_vs_compile")), f"{wall:.0f}"]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
