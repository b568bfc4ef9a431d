"""How much memory an evaluation holds, and how much the evaluations in flight on a device may hold at once.

The estimate is made from trusted data only (the baselines' record of each shape's inputs and outputs) and is what
the device gate (sandbox/gate.py) and the host-memory budget (host_memory.py) admit evaluations by."""

from __future__ import annotations


MEMORY_BUDGET_FRACTION = 0.9  # of the GPU's memory: what the evaluations in flight may hold at once (sandbox/gate.py)
PROCESS_ALLOWANCE_BYTES = 1 << 30  # device memory of one process beyond its tensors: CUDA context, allocator slack
CHECK_COMPARE_BYTES = 1 << 30  # the comparison's float64 temporaries (sandbox/harness/compare.py: chunks of 16 M)


def resident_estimate(shapes: list[dict], device: str) -> int:
    """Device bytes (host bytes on the CPU) one evaluation's referee and kernel server hold at once, from trusted
    data only (the baselines' record of each shape's inputs and outputs): the referee's timing pool (a batch's
    inputs and out buffers, sandbox/harness/referee.py) and its private copy of the inputs (drawn there before
    the window), on a GPU the arena the server's outputs are made in, the
    float64 reference of one call (inputs and outputs widened), the L2 flush buffer, and each process's
    allowance."""
    from sandbox.harness.referee import arena_bytes, pool_bytes, private_bytes

    largest = max((s["input_bytes"] + s["output_bytes"] for s in shapes), default=0)
    pool = pool_bytes(device, shapes)
    # On the CPU the server's outputs live in its own memory until copied: the batch's outputs once more.
    outputs = arena_bytes(shapes) if device == "cuda" else pool
    reference64 = 4 * largest
    flush = 256 << 20 if device == "cuda" else 0
    return pool + private_bytes(device, shapes) + outputs + reference64 + flush + CHECK_COMPARE_BYTES + 2 * PROCESS_ALLOWANCE_BYTES


def memory_budget(gpu: int | None) -> int | None:
    """What the evaluations in flight on `gpu` may hold at once: MEMORY_BUDGET_FRACTION of its memory (NVML).
    None (no bound) on the CPU, or where NVML cannot say."""
    if gpu is None:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(gpu)).total
    except Exception:  # noqa: BLE001 - no NVML here: evaluations are bounded by slots alone, as before
        return None
    return int(total * MEMORY_BUDGET_FRACTION)


def evaluation_gpus() -> int:
    """This host's evaluation GPUs, each with a worker of its own sharing the host's memory: its GPUs (NVML) but
    the model server's (APPLIANCE_LLM_GPU, as `optimize` and `doctor` read it); 1 where NVML cannot say."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # noqa: BLE001 - no NVML: this device is taken to be the host's only one
        return 1
    from appliance.config import Settings

    serving = Settings.load().llm_gpu or ""
    return max(1, count - (serving.isdigit() and int(serving) < count))
