"""Checks the candidate harness makes on the candidate's behaviour inside its own process.

They cannot stop code that runs in the same process, but they catch the common tricks cheaply and name them:
patched timers/synchronisation/comparison/serialisation, inputs modified in place, lazy tensor subclasses.
The trusted side adds the checks that do not rely on this process (sandbox/harness/reference.py `check`).
"""

from __future__ import annotations

import builtins
import json
import os
import statistics
import time


def _watched() -> dict[str, object]:
    import torch

    import sandbox.harness.common as common
    import sandbox.harness.timing as timing
    import sandbox.harness.transfer as transfer

    items = {
        "time.perf_counter": (time, "perf_counter"), "time.perf_counter_ns": (time, "perf_counter_ns"),
        "time.time": (time, "time"), "time.monotonic": (time, "monotonic"),
        "torch.cuda.synchronize": (torch.cuda, "synchronize"), "torch.cuda.Event": (torch.cuda, "Event"),
        "torch.cuda.Event.record": (torch.cuda.Event, "record"),
        "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
        "torch.save": (torch, "save"), "torch.load": (torch, "load"), "torch.roll": (torch, "roll"),
        "torch.equal": (torch, "equal"), "torch.allclose": (torch, "allclose"), "torch.isnan": (torch, "isnan"),
        "torch.Tensor.clone": (torch.Tensor, "clone"), "torch.Tensor.cpu": (torch.Tensor, "cpu"),
        "torch.Tensor.copy_": (torch.Tensor, "copy_"), "torch.Tensor.detach": (torch.Tensor, "detach"),
        "torch.Tensor.__eq__": (torch.Tensor, "__eq__"),
        "json.dumps": (json, "dumps"), "os.replace": (os, "replace"), "builtins.open": (builtins, "open"),
        "statistics.median": (statistics, "median"), "timing.time_calls": (timing, "time_calls"),
        "timing.roll_inputs": (timing, "roll_inputs"), "common.write_result": (common, "write_result"),
        "torch.frombuffer": (torch, "frombuffer"), "transfer.create_output_file": (transfer, "create_output_file"),
        "transfer.OutputFiles.take": (transfer.OutputFiles, "take"),
        "transfer.Staging.download": (transfer.Staging, "download"), "transfer.Staging._drain": (transfer.Staging, "_drain"),
        "transfer.Staging.upload": (transfer.Staging, "upload"),
        "transfer.Staging._direct": (transfer.Staging, "_direct"),
    }
    return {name: getattr(owner, attr, None) for name, (owner, attr) in items.items()}


class Watch:
    """Remembers the functions the harness relies on; `changed()` names any the candidate replaced."""

    def __init__(self):
        self.originals = _watched()

    def changed(self) -> list[str]:
        now = _watched()
        return [name for name, fn in self.originals.items() if now[name] is not fn]


def settle(seconds: float = 0.02) -> None:
    """Give work the candidate left running on its own threads a moment to show itself."""
    time.sleep(seconds)


def snapshot(args: list) -> list:
    import torch

    return [a.clone() if isinstance(a, torch.Tensor) else None for a in args]


def mutated(args: list, before: list) -> list[int]:
    """Indices of tensor inputs whose contents changed (NaN-aware, bit-exact otherwise)."""
    import torch

    changed = []
    for i, (a, b) in enumerate(zip(args, before)):
        if b is None:
            continue
        if a.is_floating_point() or a.is_complex():
            same = bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
        else:
            same = torch.equal(a, b)
        if not same:
            changed.append(i)
    return changed


def subclass_outputs(outs: list) -> list[str]:
    """Outputs that are not plain tensors (lazy or instrumented subclasses compute when inspected)."""
    import torch

    return [type(o).__qualname__ for o in outs if type(o) is not torch.Tensor]
