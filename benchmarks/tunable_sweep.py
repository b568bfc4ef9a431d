#!/usr/bin/env python3
"""Time a bundled baseline's tunable settings side by side at a task's main shape, beside eager and torch.compile.

    python benchmarks/tunable_sweep.py --task softmax [--grid "NUM_WARPS=8,16,32;PROGRAMS_PER_SM=0,1,2"] [--budget 0.3]

Answers "is the setting that reaches the roofline inside the search space the tuner walks?" before a tuner run spends
device time finding out. Each setting is the baseline rewritten by the tuner's own rewrite (appliance.proposers.tune)
and timed with the evaluation's own timing loop (sandbox.harness.timing: L2 flushed, inputs rolled between calls).
Without --grid, every combination of the baseline's TUNABLES is timed. Prints one Markdown table, fastest first.

UNJAILED: runs the bundled baselines (our own code) in this process; never point it at a candidate.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from appliance.proposers.tune import current_values, read_tunables, with_values  # noqa: E402
from appliance.tasks import load_task  # noqa: E402
from sandbox.harness.common import load_module  # noqa: E402
from sandbox.harness.timing import time_calls  # noqa: E402


def parse_grid(text: str, tunables: dict[str, list]) -> dict[str, list]:
    """"A=1,2;B=True,False" -> {"A": [1, 2], "B": [True, False]}, each value one of the declared ones."""
    grid = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, _, values = part.partition("=")
        if name not in tunables:
            sys.exit(f"{name!r} is not a tunable of this baseline (it has {', '.join(tunables)})")
        by_text = {str(v): v for v in tunables[name]}
        unknown = [v for v in values.split(",") if v not in by_text]
        if unknown:
            sys.exit(f"{name}: {', '.join(unknown)} not among its declared values {tunables[name]}")
        grid[name] = [by_text[v] for v in values.split(",")]
    return grid


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, help="a bundled task name (benchmarks/tasks/NAME.py)")
    parser.add_argument("--grid", default="", help='e.g. "NUM_WARPS=8,16;L2_HINTS=False,True" (default: all)')
    parser.add_argument("--budget", type=float, default=0.3, help="timing budget per setting, seconds")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out (it compiles for ~20 s)")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        sys.exit("tunable_sweep needs a GPU: CPU timings of Triton's interpreter say nothing about the tunables")
    task = load_task(REPO / "benchmarks" / "tasks" / f"{args.task}.py")
    baseline = (REPO / "benchmarks" / "baselines" / f"{args.task}.py").read_text()
    tunables = read_tunables(baseline)
    grid = parse_grid(args.grid, tunables) if args.grid else tunables
    module = load_module(task.path, "sweep_task")
    torch.manual_seed(0)
    with torch.device("cuda"):
        inputs = [a.contiguous() for a in module.get_inputs()]
        init = module.get_init_inputs()
    torch.manual_seed(0)  # the same seed before every constructor: the same (random) weights in every model
    reference = module.Model(*init).cuda().eval()
    _, nbytes = task.work(task.sizes)
    tol = task.tolerances().get(task.manifest.dtype or "float32", {"atol": 1e-4, "rtol": 1e-4})

    rows = []

    def timed(label: str, model) -> None:
        with torch.no_grad():
            expected = reference(*inputs)
            got = model(*inputs)
            ok = torch.allclose(got, expected, atol=tol["atol"], rtol=tol["rtol"])
            summary, _ = time_calls(model, [inputs], "cuda", budget_s=args.budget)
        ms = summary["median_ms"]
        rows.append((ms, label, ok, nbytes / ms / 1e6 if nbytes else None))
        print(f"{label}: {ms:.4f} ms{'' if ok else ' (WRONG OUTPUT)'}", flush=True)

    timed("eager", reference)
    if not args.no_compile:
        timed("torch.compile", torch.compile(reference))
    folder = Path(tempfile.mkdtemp(prefix="sweep-"))
    names = list(grid)
    for i, combo in enumerate(itertools.product(*(grid[n] for n in names))):
        values = dict(zip(names, combo))
        path = folder / f"setting_{i}.py"
        path.write_text(with_values(baseline, values))  # Triton needs the kernel's source in a real file
        try:
            model_cls = load_module(path, f"setting_{i}").ModelNew
            torch.manual_seed(0)
            cand = model_cls(*init).cuda()
            timed(", ".join(f"{k}={v}" for k, v in values.items()), cand)
        except Exception as exc:  # noqa: BLE001 - a setting that does not compile is a row, not the end
            print(f"{values}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    fastest = min(ms for ms, label, *_ in rows if label not in ("eager", "torch.compile"))
    compiled = next((ms for ms, label, *_ in rows if label == "torch.compile"), None)
    print(f"\n## {args.task}: baseline defaults {current_values(baseline)}; fastest {fastest:.4f} ms\n")
    print("| setting | ms | GB/s | vs torch.compile | correct |\n|---|---|---|---|---|")
    for ms, label, ok, gbps in sorted(rows):
        vs = f"{compiled / ms:.3f}x" if compiled else "-"
        print(f"| {label} | {ms:.4f} | {gbps:.0f} | {vs} | {'yes' if ok else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
