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
MISMATCH_RATIO = 1.5
MISMATCH_SLACK_MS = 0.05
IMPOSSIBLE_MARGIN = 1.15  # over the best measured ceiling, when the datasheet does not know the GPU
HALF_PRECISION = {"bfloat16", "float16"}


def timer_mismatch(timing: dict) -> str | None:
    wide, quoted = timing.get("device_wide_ms"), timing.get("median_ms")
    if wide is None or not quoted:
        return None
    if wide > MISMATCH_RATIO * quoted + MISMATCH_SLACK_MS:
        return (f"the timed stream says {quoted:.4g} ms per call but the whole device was busy {wide:.4g} ms per "
                "call: work outside the timed stream (a side stream or thread), or a timer that lies")
    return None


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
