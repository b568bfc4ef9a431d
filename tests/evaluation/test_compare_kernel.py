"""sandbox/harness/compare_kernel.py: compare.py's rules in one Triton pass must give the torch path's verdicts and
numbers. On the CPU the kernel runs in Triton's interpreter (a child process: TRITON_INTERPRET is read when the
kernel is defined); on a GPU, compiled, at a size where the referee uses it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Each case: the candidate's output as an expression of (r: the float64 reference, e: eager in fp32, x: the input),
# what both rules must say of it. Fused and torch paths run on the same tensors; the script prints both.
CASES = {
    "honest": "e.clone()",  # eager itself: within any bound
    "another_order": "(x.double().exp() / x.double().exp().sum(-1, keepdim=True)).float()",
    "scaled": "e * 1.002",  # a systematic 0.2% error: far over a softmax's fp32 bound
    "few_off": "torch.where(torch.arange(e.numel(), device=e.device).reshape(e.shape) % 997 == 0, e + 0.01, e)",
    "stale": "torch.roll(e, 1, 0)",
    "nan": "torch.where(torch.arange(e.numel(), device=e.device).reshape(e.shape) == 5, float('nan'), e)",
    "bf16": "e.bfloat16()",
    # The task's Model may return a view as its reference (an attacker review's finding: the kernel read the
    # memory under a strided or broadcast reference, so a candidate returning that memory passed).
    "strided_ref": ("e2.contiguous()", "torch.softmax(x2.double(), -1)[:, ::2]", "torch.softmax(x2, -1)[:, ::2]"),
    "strided_ref_cheat": ("torch.softmax(x2, -1).reshape(-1)[:e2.numel()].reshape(e2.shape)",
                          "torch.softmax(x2.double(), -1)[:, ::2]", "torch.softmax(x2, -1)[:, ::2]"),
    "broadcast_ref": ("e2.contiguous()", "x.double().mean().expand(rows, 1000)", "x.mean().expand(rows, 1000)"),
    "broadcast_ref_cheat": ("x.double().mean().reshape(1).expand(rows * 1000).clone().reshape(rows, 1000).float() "
                            "+ torch.arange(rows * 1000, device=x.device).reshape(rows, 1000) * 1e-3",
                            "x.double().mean().expand(rows, 1000)", "x.mean().expand(rows, 1000)"),
}

SCRIPT = r"""
import json, sys, torch
from sandbox.harness import compare, compare_kernel
compare.FUSED_MIN_ELEMENTS = 1
device, cases, explicit = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
g = torch.Generator().manual_seed(0)
rows = 16 if device == "cpu" else 8192
x = torch.randn(rows, 1000, generator=g).to(device)
x2 = torch.randn(rows, 2000, generator=g).to(device)
result = {}
for name, expr in cases.items():
    r, e = torch.softmax(x.double(), -1), torch.softmax(x, -1)
    if isinstance(expr, list):  # (candidate, reference, eager): a reference that is a view
        r, e2 = eval(expr[1]), eval(expr[2])
        e = e2
        c = eval(expr[0])
    else:
        c = eval(expr)
    dtype = str(c.dtype).removeprefix("torch.")
    eager = e.to(c.dtype)
    tol = {dtype: {"atol": 1e-6, "rtol": 1e-3}} if explicit else {}
    expected = [{"dtype": dtype, "shape": list(c.shape)}]
    both = {}
    for way, devices in (("fused", {device}), ("torch", set())):
        compare.FUSED_DEVICES = devices
        margins = []
        per_element = compare.compare_outputs([c], [r], expected, tol, "here", eager=[eager], margins=margins)
        in_norm = compare.compare_in_norm([c], [r], tol, "here", eager=[eager])
        both[way] = {"per_element": per_element and per_element["kind"], "in_norm": in_norm and in_norm["kind"],
                     "margin": margins[0] if margins else None,
                     "norm_reason": in_norm and in_norm["reason"]}
    bound = compare._Explicit(**tol[dtype]) if explicit else compare._PrecisionTied(eager, r, compare.UNIT_ROUNDOFF[dtype])
    compare.FUSED_DEVICES = {device}
    stats = compare._fused_stats(c, r, bound)
    d = c.double() - r
    both["stats"] = stats and {k: stats[k] for k in ("err_sq", "err_max", "ref_sq", "ref_max")}
    both["direct"] = {"err_sq": float((d * d).sum()), "err_max": float(d.abs().max()), "ref_sq": float((r * r).sum()),
                      "ref_max": float(r.abs().max())}
    result[name] = both
print(json.dumps(result))
"""


def _run(device: str, explicit: bool, env_extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env_extra | {"PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, device, json.dumps(CASES), "1" if explicit else "0"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _same_verdicts(result: dict, explicit: bool) -> None:
    for name, both in result.items():
        fused, torch_ = both["fused"], both["torch"]
        assert fused["per_element"] == torch_["per_element"], name
        assert fused["in_norm"] == torch_["in_norm"], name
        if torch_["margin"] is not None:  # (on a GPU the kernel's fused multiply-adds round eager's excess error,
            # a difference of nearly equal numbers, a little differently: 2e-8 of it seen on an H100)
            assert fused["margin"] == pytest.approx(torch_["margin"], rel=1e-6), name
        if name == "nan":
            assert both["stats"] is None  # the torch path judges anything non-finite
            continue
        for key, value in both["direct"].items():
            assert both["stats"][key] == pytest.approx(value, rel=1e-9, abs=1e-300), (name, key)
    # The cases are no vacuous agreement: honest ones pass, wrong ones fail, under either rule.
    assert result["honest"]["torch"]["per_element"] is None and result["honest"]["torch"]["in_norm"] is None
    assert result["another_order"]["torch"]["per_element"] is None
    for wrong in ("scaled", "few_off", "stale"):
        assert result[wrong]["torch"]["per_element"] == "wrong_output", wrong
    assert result["nan"]["torch"]["per_element"] == "nan_inf"
    for view in ("strided_ref", "broadcast_ref"):
        assert result[view]["torch"]["per_element"] is None and result[view]["torch"]["in_norm"] is None, view
        assert result[view + "_cheat"]["torch"]["per_element"] == "wrong_output", view
    if not explicit:
        assert result["stale"]["torch"]["in_norm"] == "wrong_output"


@pytest.mark.parametrize("explicit", [False, True], ids=["precision_tied", "explicit_tolerance"])
def test_the_fused_pass_agrees_with_the_torch_path_interpreted(explicit):
    _same_verdicts(_run("cpu", explicit, {"TRITON_INTERPRET": "1"}), explicit)


@pytest.mark.gpu
@pytest.mark.parametrize("explicit", [False, True], ids=["precision_tied", "explicit_tolerance"])
def test_the_fused_pass_agrees_with_the_torch_path_on_the_gpu(explicit):
    _same_verdicts(_run("cuda", explicit, {}), explicit)
