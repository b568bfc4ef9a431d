"""Judging the numbers a candidate's timing loop reported, on the trusted side.

- Timer cross-check: the device-wide measurement (events with a device-wide synchronize, sync latency subtracted)
  must agree with the quoted event median. Work left on another stream, or a timer that lies, shows up as a
  device-wide time well above the quoted one.
- Roofline: each timing's fraction of the time the task's bytes and FLOPs need at the GPU's measured ceilings; a
  result above what the hardware can do at all is impossible, never a win.
"""

from __future__ import annotations

# A quoted median may be this much below the device-wide one before it counts as a mismatch: generous, because
# a false rejection of an honest kernel is worse than missing a few microseconds of hidden work.
IMPOSSIBLE_MARGIN = 1.15  # over the best measured ceiling, when the datasheet does not know the GPU
HALF_PRECISION = {"bfloat16", "float16"}


def memory_ceiling(ceilings: dict) -> float:
    m = ceilings["measured"]
    return max(m["read_bytes_per_s"], m["write_bytes_per_s"], m["copy_bytes_per_s"])


def compute_ceiling(ceilings: dict, dtype: str | None) -> float:
    key = "bf16_flops" if dtype in HALF_PRECISION else "tf32_flops"
    return ceilings["measured"][key]


def roofline(ceilings: dict | None, flops: float | None, nbytes: float | None, dtype: str | None,
             median_ms: float | None) -> dict:
    """{"roofline_fraction": achieved / attainable, "bound": "memory"|"compute"}, or {} without the inputs."""
    if not ceilings or not median_ms or not (flops or nbytes):
        return {}
    t_mem = (nbytes or 0) / memory_ceiling(ceilings)
    t_compute = (flops or 0) / compute_ceiling(ceilings, dtype)
    attainable_ms = max(t_mem, t_compute) * 1e3
    return {"roofline_fraction": attainable_ms / median_ms, "bound": "memory" if t_mem >= t_compute else "compute"}


def impossible(ceilings: dict | None, flops: float | None, nbytes: float | None, dtype: str | None,
               median_ms: float | None) -> str | None:
    """Why this timing is faster than the hardware allows, or None."""
    if not ceilings or not median_ms:
        return None
    seconds = median_ms / 1e3
    sheet = ceilings.get("datasheet")
    if nbytes:
        limit = sheet["bytes_per_s"] if sheet else memory_ceiling(ceilings) * IMPOSSIBLE_MARGIN
        if nbytes / seconds > limit:
            return (f"{nbytes / seconds / 1e12:.3g} TB/s would exceed the GPU's memory bandwidth limit of "
                    f"{limit / 1e12:.3g} TB/s ({'datasheet peak' if sheet else 'measured ceiling + 15%'}): the "
                    "kernel cannot have moved the task's bytes in that time")
    if flops:
        key = "bf16_flops" if dtype in HALF_PRECISION else "tf32_flops"
        limit = sheet[key] if sheet else compute_ceiling(ceilings, dtype) * IMPOSSIBLE_MARGIN
        if flops / seconds > limit:
            return (f"{flops / seconds / 1e12:.3g} TFLOP/s would exceed the GPU's {key.split('_')[0]} peak of "
                    f"{limit / 1e12:.3g} TFLOP/s: the kernel cannot have done the task's arithmetic in that time")
    return None


# Nsight Compute: the sections whose raw metrics make the summary. Clocks are never touched (--clock-control none).
NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "WarpStateStats")
# DRAM throughput, % of peak: the SpeedOfLight section's name for it in recent Nsight Compute (the H200 host's, where
# the older name below is absent and was read as 0 %), then the older one.
DRAM_METRICS = ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                "dram__throughput.avg.pct_of_peak_sustained_elapsed")
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"


def ncu_command(ncu: str, log_file: str) -> list[str]:
    sections = [arg for name in NCU_SECTIONS for arg in ("--section", name)]
    return [ncu, "--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all",
            *sections, "--csv", "--page", "raw", "--log-file", log_file]


def ncu_summary(csv_text: str) -> dict:
    """Kernels of one profiled call -> DRAM throughput, achieved occupancy and top stall reasons, each kernel
    weighted by its duration. The log comes from inside the jail: it is advice for the next proposal, never a verdict."""
    import csv
    import io

    lines = [line for line in csv_text.splitlines() if line.startswith('"')]  # ncu's own ==PROF== lines are not CSV
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))[1:]  # the first row holds the units
    kernels = []
    for row in rows:
        def num(key: str) -> float:
            try:
                return float(str(row.get(key, "")).replace(",", ""))
            except ValueError:
                return 0.0

        stalls = {k[len(STALL_PREFIX):-len(STALL_SUFFIX)]: num(k) for k in row
                  if k.startswith(STALL_PREFIX) and k.endswith(STALL_SUFFIX)}
        kernels.append({"name": row.get("Kernel Name", "?")[:80], "ns": num("gpu__time_duration.sum"),
                        "dram_pct": num(next((k for k in DRAM_METRICS if k in row), DRAM_METRICS[0])),
                        "occupancy_pct": num("sm__warps_active.avg.pct_of_peak_sustained_active"), "stalls": stalls})
    if not kernels:
        return {"error": "Nsight Compute reported no kernel for the profiled call"}
    total = sum(k["ns"] for k in kernels) or 1.0

    def weighted(key: str) -> float:
        return sum(k[key] * k["ns"] for k in kernels) / total

    stalls: dict[str, float] = {}
    for k in kernels:
        for reason, value in k["stalls"].items():
            stalls[reason] = stalls.get(reason, 0.0) + value * k["ns"] / total
    top = sorted(stalls.items(), key=lambda kv: -kv[1])[:3]
    return {"kernels": len(kernels), "gpu_time_us": total / 1e3, "dram_throughput_pct": weighted("dram_pct"),
            "achieved_occupancy_pct": weighted("occupancy_pct"),
            "top_stalls": [{"reason": r, "cycles_per_issue": v} for r, v in top],
            "names": [k["name"] for k in kernels[:5]]}
