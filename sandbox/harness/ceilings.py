"""The GPU's real ceilings, measured once per worker: memory bandwidth (read, write and copy separately) and dense
matmul rates. Roofline fractions are quoted against these (appliance/evaluation/evidence.py); "impossible" is
judged against the datasheet peak when the GPU is known (a read-mostly kernel legitimately beats copy bandwidth).

    python -m sandbox.harness.ceilings OUT.json      (run by the controller inside the jail, on the worker's GPU)
"""

from __future__ import annotations

import json
import statistics
import sys

# Public datasheet peaks (dense, no sparsity): bytes/s of HBM, FLOP/s of tensor cores. Matched by name substring.
DATASHEET = {
    "H200": {"bytes_per_s": 4.8e12, "bf16_flops": 989e12, "tf32_flops": 494e12},
    "H100": {"bytes_per_s": 3.35e12, "bf16_flops": 989e12, "tf32_flops": 494e12},
    "A100": {"bytes_per_s": 2.04e12, "bf16_flops": 312e12, "tf32_flops": 156e12},
}


def _time_ms(fn, reps: int = 20) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def measure() -> dict:
    import torch

    n = 1 << 28  # 1 GiB of float32: far beyond L2
    x = torch.rand(n, device="cuda")
    y = torch.empty_like(x)
    nbytes = x.numel() * x.element_size()
    read = nbytes / _time_ms(lambda: torch.sum(x)) * 1e3
    write = nbytes / _time_ms(lambda: y.fill_(1.0)) * 1e3
    copy = 2 * nbytes / _time_ms(lambda: y.copy_(x)) * 1e3
    del x, y
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    bf16 = 2 * m**3 / _time_ms(lambda: a @ a, reps=10) * 1e3
    a = a.float()
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        tf32 = 2 * m**3 / _time_ms(lambda: a @ a, reps=10) * 1e3
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before  # the referee's own references run in full fp32
    name = torch.cuda.get_device_name(0)
    measured = {"read_bytes_per_s": read, "write_bytes_per_s": write, "copy_bytes_per_s": copy,
                "bf16_flops": bf16, "tf32_flops": tf32}
    sheet = next((v for k, v in DATASHEET.items() if k in name), None)
    return {"gpu": name, "measured": measured, "datasheet": sheet}


if __name__ == "__main__":
    out = measure()
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
