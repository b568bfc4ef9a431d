"""One timing loop for the candidate and the baselines alike, so their numbers compare.

GPU: warm up, flush L2 before every call, CUDA events around each call, adaptive repetition count.
CPU: the same loop with perf_counter; results are labelled device="cpu" and never mixed with GPU numbers.
Input sets rotate so that no two consecutive calls see the same tensors.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable


def time_calls(
    fn: Callable,
    input_sets: list[list],
    device: str,
    budget_s: float = 1.0,
    min_reps: int = 5,
    max_reps: int = 300,
) -> dict:
    import torch

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    flush = _l2_flusher() if cuda else (lambda: None)

    # Warm-up: every input set once (JIT compiles, caches, allocator), then estimate the cost of one call.
    with torch.no_grad():
        for args in input_sets:
            fn(*args)
        sync()
        t0 = time.perf_counter()
        fn(*input_sets[0])
        sync()
        estimate = max(time.perf_counter() - t0, 1e-6)
        reps = int(min(max_reps, max(min_reps, budget_s / estimate)))

        samples = []
        if cuda:
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
            for i, (start, end) in enumerate(events):
                args = input_sets[i % len(input_sets)]
                flush()
                start.record()
                fn(*args)
                end.record()
            sync()
            samples = [s.elapsed_time(e) for s, e in events]
        else:
            for i in range(reps):
                args = input_sets[i % len(input_sets)]
                t0 = time.perf_counter()
                fn(*args)
                samples.append((time.perf_counter() - t0) * 1e3)
    return summarize(samples, device)


def summarize(samples_ms: list[float], device: str) -> dict:
    q = statistics.quantiles(samples_ms, n=4) if len(samples_ms) >= 2 else [samples_ms[0]] * 3
    return {
        "median_ms": statistics.median(samples_ms),
        "iqr_ms": q[2] - q[0],
        "min_ms": min(samples_ms),
        "reps": len(samples_ms),
        "device": device,
    }


def _l2_flusher() -> Callable[[], None]:
    """Writing a buffer larger than L2 evicts the previous call's data (H200: 60 MB of L2)."""
    import torch

    props = torch.cuda.get_device_properties(0)
    size = max(2 * getattr(props, "L2_cache_size", 64 << 20), 256 << 20)
    buf = torch.empty(size // 4, dtype=torch.int32, device="cuda")
    return lambda: buf.zero_()
