"""A small fixed database for the snapshot tests: rows written through the Store like a GPU run would write them,
with fixed numbers and times, so every screenshot is the same on every machine. (The pilot tests use a real run.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from appliance.db import Store

TASK = '''"""Row-wise softmax over the last dimension."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


batch_size = 4096
dim = 65536


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''

MANIFEST = '''dtype = "float32"
seeds = 3
flops = "5 * batch_size * dim"
bytes = "2 * 4 * batch_size * dim"

[tolerance.float32]
atol = 1e-8
rtol = 1e-4

[[shapes]]
name = "edge"
sizes = { batch_size = 3, dim = 4097 }
'''

KERNEL = '''"""Softmax, one program per row."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

MAX_BLOCK = {block}
NUM_WARPS = {warps}


@triton.jit
def _softmax(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=float("-inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * n_cols + offs, e / tl.sum(e, 0), mask=offs < n_cols)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _softmax[(x.shape[0],)](x, y, x.shape[1], BLOCK=MAX_BLOCK, num_warps=NUM_WARPS)
        return y
'''

ENV = {"gpu": "NVIDIA H200", "driver": "570.133.20", "torch": "2.7.1+cu128", "triton": "3.3.1",
       "python": "3.12.3", "hostname": "gpu-box-01"}
T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)


def _details(kind: str, roofline: float | None) -> dict:
    cases = [{"shape": s, "seed": seed, "kind": "pass", "reason": ""} for s in ("main", "edge")
             for seed in (0, 1, 2, "timed")]
    return {"backends": ["triton"], "gpu_index": 1, "device_turns": {"held_s": 1.4, "joules": 960.0},
            "wall_s": {"prepare": 0.0, "candidate": 4.1, "check": 1.2},
            "shapes": [{"name": "main", "input_shapes": [[4096, 65536]], "outputs": [{"dtype": "float32",
                                                                                      "shape": [4096, 65536]}]},
                       {"name": "edge", "input_shapes": [[3, 4097]], "outputs": [{"dtype": "float32",
                                                                                  "shape": [3, 4097]}]}],
            "cases": cases if kind == "pass" else [],
            "provenance": {"ops": ["empty_like"], "own_launches": 1},
            "evidence": {"launches_per_call": 1, "roofline_fraction": roofline, "energy_j_per_call": 0.21},
            "jail": {"limits": {"memory_bytes": 34359738368, "pids_max": 1024, "wall_seconds": 600.0}}}


def _timings(ms: float, roofline: float) -> list[dict]:
    rows = []
    for shape, scale in (("main", 1.0), ("edge", 0.004)):
        sizes = {"batch_size": 4096, "dim": 65536} if shape == "main" else {"batch_size": 3, "dim": 4097}
        rows += [
            {"shape": shape, "sizes": sizes, "implementation": "candidate", "device": "cuda", "median_ms": ms * scale,
             "iqr_ms": ms * scale * 0.01, "min_ms": ms * scale * 0.98, "reps": 200,
             "roofline_fraction": roofline, "energy_j_per_call": 0.21 * scale},
            {"shape": shape, "sizes": sizes, "implementation": "eager", "device": "cuda", "median_ms": 1.02 * scale,
             "iqr_ms": 0.004 * scale, "min_ms": 1.0 * scale, "reps": 200},
            {"shape": shape, "sizes": sizes, "implementation": "compile", "device": "cuda", "median_ms": 0.81 * scale,
             "iqr_ms": 0.003 * scale, "min_ms": 0.8 * scale, "reps": 200},
        ]
    return rows


def fill(store: Store) -> None:
    task = store.get_or_add_task("softmax", "/srv/tasks/softmax.py", TASK, MANIFEST)
    config = {"proposer": "llm", "max_candidates": 12, "max_gpu_seconds": 7200.0, "seed": 0, "device": "cuda",
              "workers": 3, "batch": 2, "islands": 2}
    run = store.add_run(task.id, "optimize", config)
    store.update_run(run.id, status="running", state={"generation": 4, "elapsed_s": 1800.0,
                                                       "gpu_seconds": 2700.0, "energy_j": 612000.0})
    add = store.add_candidate
    seed = add(run.id, task.id, KERNEL.format(block=4096, warps=8), proposer="seed", island=0, generation=0,
               note="seed candidate")
    plan = [  # (parent, proposer, block, warps, verdict, ms, roofline, note, tokens)
        (seed, "tune", 2048, 8, "pass", 0.61, 0.62, "MAX_BLOCK 4096->2048", 0),
        (seed, "llm", 8192, 16, "pass", 0.48, 0.79, "one pass with the row in registers", 5200),
        (seed, "llm", 1000, 8, "compile_error", None, None, "odd block width", 4900),
        (seed, "llm", 4096, 4, "wrong_output", None, None, "skip the max subtraction", 5100),
    ]
    rows = [(seed, "pass", 0.74, 0.51)]
    for parent, proposer, block, warps, verdict, ms, roofline, note, tokens in plan:
        c = add(run.id, task.id, KERNEL.format(block=block, warps=warps), parent_id=parent.id, proposer=proposer,
                island=1, generation=1, note=note, tokens_in=tokens - 900 if tokens else 0,
                tokens_out=900 if tokens else 0)
        rows.append((c, verdict, ms, roofline))
    for c, verdict, ms, roofline in rows:
        details = _details(verdict, roofline)
        if verdict == "compile_error":
            details["candidate_stderr"] = ("triton.compiler.errors.CompilationError: at 4:11:\n"
                                           "    offs = tl.arange(0, BLOCK)\n"
                                           "ValueError: arange's range must be a power of 2\n")
        store.add_evaluation(
            c.id, run.id, verdict=verdict, jailed=True, device="cuda", mode="full",
            stage="done" if verdict == "pass" else ("compile" if verdict == "compile_error" else "correctness"),
            reason=(f"correct on every shape and seed; main shape {ms} ms" if verdict == "pass" else
                    "arange's range must be a power of 2" if verdict == "compile_error" else
                    "max abs err 0.41 > tol 1e-4 at shape main, seed 0"),
            speedup_vs_eager=1.02 / ms if ms else None, speedup_vs_compile=0.81 / ms if ms else None,
            environment=ENV, details=details, timings=_timings(ms, roofline) if ms else [])
    add(run.id, task.id, KERNEL.format(block=8192, warps=32), parent_id=rows[2][0].id, proposer="llm", island=1,
        generation=2, status="evaluating", note="32 warps", tokens_in=4000, tokens_out=800)
    add(run.id, task.id, KERNEL.format(block=16384, warps=16), parent_id=rows[2][0].id, proposer="tune", island=0,
        generation=2, status="queued", note="MAX_BLOCK 8192->16384")
    store.add_approval(run.id, rows[2][0].id, "approve", "alice", "one pass; diff reviewed, numbers hold at both "
                                                                  "shapes")

    other = store.add_run(task.id, "optimize", config | {"proposer": "tune", "max_candidates": 20})
    store.update_run(other.id, status="queued")
    # Fixed times: the screens show them.
    with store.engine.begin() as connection:
        for table in ("task", "run", "candidate", "evaluation", "approval"):
            connection.execute(text(f"UPDATE {table} SET created_at = :t"), {"t": _sql_time(T0)})
        later = _sql_time(T0 + timedelta(hours=1))
        connection.execute(text("UPDATE run SET created_at = :t WHERE id = 2"), {"t": later})


def _sql_time(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S.%f")  # as SQLAlchemy writes UTC times to SQLite
