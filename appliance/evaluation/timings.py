"""The timing rows an evaluation reports: per shape and implementation the referee's median and its evidence
(how it timed, what it took off, how many timed calls it checked), the work per call, and the roofline; and the
speedups and the pass reason quoted from them."""

from __future__ import annotations

from appliance.evaluation import evidence
from appliance.tasks import Task

# Numbers the referee reports beside the median: how it timed (batches, the round trip it took off, the cost of
# its own copy of the inputs and read of the outputs, both taken off) and how many timed calls it checked.
TIMING_EVIDENCE = ("batches", "calls_per_batch", "tiny_ms", "read_ms", "stage_ms", "checked_calls",
                   "check_probability", "checked_elements_after_the_first", "outputs_in_arena", "raw_window_ms",
                   "energy_j_per_call", "avg_power_w", "fixed_ms", "own_fixed_ms", "fixed_cap_ms", "small_batch_ms",
                   "large_batch_ms", "fused_compare")


def timing_rows(task: Task, prepared: dict, candidate: dict, device: str, ceilings: dict | None) -> list[dict]:
    """A row per shape and implementation. Bytes per call: the manifest's, else the least the referee moved (the
    inputs it made and the outputs it collected), so that `impossible` needs no manifest."""
    rows = []
    moved = {s["name"]: s["input_bytes"] + s["output_bytes"] for s in prepared["shapes"]}
    for sh in (s for s in prepared["shapes"] if s.get("timed", True)):  # (derived shapes: correctness only)
        name = sh["name"]
        flops, nbytes = task.work(sh["sizes"])
        nbytes = nbytes or moved.get(name)
        impls = {"candidate": candidate.get(name, {})} | prepared["timings"].get(name, {})
        for impl, t in impls.items():
            row = {"shape": name, "sizes": sh["sizes"], "implementation": impl, "device": device,
                   "median_ms": t.get("median_ms"), "iqr_ms": t.get("iqr_ms"), "min_ms": t.get("min_ms"),
                   "reps": t.get("reps"), "error": t.get("error"), "flops": flops, "bytes": nbytes}
            row |= {k: t[k] for k in TIMING_EVIDENCE if isinstance(t.get(k), (int, float))}
            if isinstance(t.get("referee_s"), dict):  # where the referee's timing stage went, seconds per phase
                row["referee_s"] = {str(k)[:40]: v for k, v in list(t["referee_s"].items())[:20]
                                    if isinstance(v, (int, float))}
            if t.get("median_ms") and flops:
                row["tflops"] = flops / t["median_ms"] / 1e9
            if t.get("median_ms") and nbytes:
                row["gbps"] = nbytes / t["median_ms"] / 1e6
            row |= evidence.roofline(ceilings, flops, nbytes, task.manifest.dtype, t.get("median_ms"))
            rows.append(row)
    return rows


def speedup(main: dict, baseline: str) -> float | None:
    cand, base = main.get("candidate", {}).get("median_ms"), main.get(baseline, {}).get("median_ms")
    return base / cand if cand and base else None


CPU_TIMING_NOTE = ("timed on the CPU, its Triton kernels in Triton's interpreter: not GPU speed, so no speedup is "
                   "quoted (--json keeps the ratios, marked so)")


def pass_reason(main: dict, device: str) -> str:
    cand = main["candidate"]["median_ms"]
    if device != "cuda":
        return f"correct on every shape and seed; main shape {cand:.4g} ms, {CPU_TIMING_NOTE}"
    parts = [f"correct on every shape and seed; main shape {cand:.4g} ms"]
    for b in ("eager", "compile"):
        sp = speedup(main, b)
        if sp:
            parts.append(f"{sp:.3g}x vs {b}")
    return ", ".join(parts)
