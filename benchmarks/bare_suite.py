#!/usr/bin/env python3
"""Bare KernelBench files through the full gate (issue 25): no false rejections, and what the derived checks catch.

    python3 benchmarks/bare_suite.py [--device auto] [--problems row_sum,matmul,...]

Each problem in benchmarks/bare/ is a KernelBench-style file with no manifest; benchmarks/bare/kernels/ holds an
honest Triton kernel for it. Both go through the jailed pipeline, then a wrong variant of the same kernel (one
change, below). One Markdown row per problem: the derived shapes (and any dropped), the honest kernel's verdict
and margin (its largest error as a fraction of the bound, over every shape and seed: 1.0 would fail), and the
variant's verdict and the shape that caught it, and the device time the derived shapes cost: the honest kernel's
evaluation against the same file checked at its main shape only (a manifest that asks for nothing more). On the CPU
the kernels run in Triton's interpreter.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BARE = REPO / "benchmarks" / "bare"

# problem -> (what the wrong variant does, [(old, new)] applied to the honest kernel)
VARIANTS = {
    "leaky_relu": ("drops the tail past the last whole block",
                   [("mask = offs < n", "mask = offs < (n // 1024) * 1024")]),
    "row_sum": ("accumulates fp16-rounded inputs",
                [("acc += tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=0.0)",
                  "acc += tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=0.0)"
                  ".to(tl.float16).to(tl.float32)")]),
    "l2_normalize": ("is off by 0.1%", [("inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0))",
                                          "inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0)) * 1.001")]),
    "huber_loss": ("turns large differences into NaN",
                   [("tl.where(a < 1.0, 0.5 * d * d, a - 0.5)",
                     'tl.where(a < 1.0, 0.5 * d * d, tl.where(a > 50.0, float("nan"), a - 0.5))')]),
    "reverse_cumsum": ("accumulates in fp16", [("tl.cumsum(x, axis=0)",
                                                "tl.cumsum(x.to(tl.float16), axis=0).to(tl.float32)")]),
    "matmul": ("drops the K tail past the last whole block",
               [("for k0 in range(0, K, BK):", "for k0 in range(0, K - K % BK, BK):")]),
    "gelu_gate_add": ("uses the tanh approximation of GELU",
                      [("gelu = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))",
                        "gelu = 0.5 * x * (1.0 + (2.0 * tl.sigmoid(2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x))"
                        " - 1.0))")]),
    "column_mean": ("divides by the rows rounded up to its block", [("acc / n_rows",
                                                                      "acc / (tl.cdiv(n_rows, BLOCK_R) * BLOCK_R)")]),
    "row_min": ("drops the tail past the last whole block",
                [("for start in range(0, n_cols, BLOCK):", "for start in range(0, n_cols - n_cols % BLOCK, BLOCK):")]),
    "scaled_tanh_mul": ("reads x rounded to fp16", [("x = tl.load(x_ptr + offs, mask=mask) * scale",
                                                     "x = tl.load(x_ptr + offs, mask=mask).to(tl.float16)"
                                                     ".to(tl.float32) * scale")]),
}
HEADER = ("| problem | derived shapes (sizes) | dropped | honest | margin | wrong variant | its verdict "
          "| device s held: derived / main only | wall s |\n|---|---|---|---|---|---|---|---|---|")


def variant_source(problem: str) -> str:
    source = (BARE / "kernels" / f"{problem}.py").read_text()
    for old, new in VARIANTS[problem][1]:
        if old not in source:
            raise ValueError(f"{problem}: the variant's text is not in the honest kernel: {old!r}")
        source = source.replace(old, new)
    return source


def row(pipeline, problem: str, workdir: Path) -> str:
    from appliance.tasks import load_task

    start = time.monotonic()
    task = load_task(BARE / f"{problem}.py")
    honest = pipeline.evaluate(task, BARE / "kernels" / f"{problem}.py")
    derived = "; ".join(f"{s['name']} ({', '.join(str(v) for v in s['sizes'].values())})"
                        for s in honest.details.get("shapes", []) if s["name"] != "main")
    dropped = ", ".join(d["name"] for d in honest.details.get("dropped_shapes", [])) or "-"
    margins = [c.get("margin") for c in honest.details.get("cases", []) if c.get("margin") is not None]
    margin = f"{max(margins):.3f}" if margins else "-"
    honest_text = "pass" if honest.passed else f"**{honest.verdict}**: {honest.reason[:160]}"
    path = workdir / f"{problem}_variant.py"
    path.write_text(variant_source(problem))
    wrong = pipeline.evaluate(task, path)
    caught = "**passed (not caught)**" if wrong.passed else f"{wrong.verdict}, {_where(wrong.reason)}"
    wall = time.monotonic() - start  # both evaluations, baselines prepared once (reuse_inputs)
    # The derived shapes' device cost: the same honest kernel on the same file with a manifest that asks for the
    # main shape only (what a bare file was checked at before derived shapes), device time held per evaluation.
    main_only = workdir / "main_only"
    main_only.mkdir(exist_ok=True)
    (main_only / f"{problem}.py").write_text((BARE / f"{problem}.py").read_text())
    (main_only / f"{problem}.toml").write_text('description = "main shape only"\n')
    plain = pipeline.evaluate(load_task(main_only / f"{problem}.py"), BARE / "kernels" / f"{problem}.py")
    held, held_plain = (_held(o) for o in (honest, plain))
    cost = f"{held:.2f} / {held_plain:.2f} = {held / held_plain:.2f}x" if held and held_plain else "-"
    return (f"| {problem} | {derived} | {dropped} | {honest_text} | {margin} | {VARIANTS[problem][0]} | {caught} "
            f"| {cost} | {wall:.0f} |")


def _held(outcome) -> float | None:
    """Seconds the evaluation held the device (its turns, every process)."""
    return (outcome.details.get("device_turns") or {}).get("held_s")


def _where(reason: str) -> str:
    if "at shape " not in reason:
        return reason[:80]
    return "at shape " + reason.split("at shape ", 1)[1].split(" ", 1)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--problems", default=",".join(VARIANTS))
    args = parser.parse_args()
    from appliance.evaluation.pipeline import EvalSettings, Pipeline, resolve_device
    from sandbox.jail import Jail

    device = resolve_device(args.device)
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    pipeline = Pipeline(Jail(gpu=0 if device == "cuda" else None),
                        EvalSettings(device=device, baselines=("eager",), timing_budget_s=0.1, reuse_inputs=True))
    print(f"\nBare KernelBench problems through the gate on {device}\n\n{HEADER}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for problem in args.problems.split(","):
            try:
                rows.append(row(pipeline, problem, Path(tmp)))
            except Exception as exc:  # noqa: BLE001 - one broken problem must not cost the other rows
                rows.append(f"| {problem} | failed: {type(exc).__name__}: {str(exc)[:200]} | | | | | | | |")
            print(rows[-1], flush=True)
    pipeline.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
