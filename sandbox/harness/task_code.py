"""The task's own code, as the referee runs it: loading the task, building its Model, drawing its inputs.

Everything the task's code raises is a `TaskFault`, reported against the task file, never the candidate.
"""

from __future__ import annotations

from sandbox.harness.common import cast_floating, error_info, load_module


class TaskFault(Exception):
    """The task's own code failed: reported against the task file, not the candidate."""

    def __init__(self, what: str, exc: BaseException, task_path: str):
        self.info = error_info(exc, task_path)
        self.info["what"] = what
        super().__init__(f"{what}: {self.info['type'].rsplit('.', 1)[-1]}: {self.info['message']}")


def task_call(what: str, spec: dict, fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - any failure of the task's code is a task error
        raise TaskFault(what, exc, spec["task_display"]) from exc


def load_task(spec: dict):
    return task_call("loading the task", spec, load_module, spec["task_file"], "task", spec["task_display"])


def dtype_of(spec: dict):
    import torch

    return getattr(torch, spec["dtype"]) if spec["dtype"] else None


def set_sizes(task, shape: dict) -> None:
    """KernelBench tasks read their sizes from module globals: a shape sets them before any call of the task."""
    for name, value in shape["sizes"].items():
        setattr(task, name, tuple(value) if isinstance(value, list) else value)  # a tuple size comes back as JSON


def build_model(spec: dict, task, init: list, seed: int, device: str, dtype):
    import torch

    torch.manual_seed(seed)
    model = task_call(f"Model(*get_init_inputs()) (seed {seed})", spec, lambda: task.Model(*init))
    model = model.to(device)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def init_inputs(spec: dict, task, seed: int) -> list:
    import torch

    torch.manual_seed(seed)
    return list(task_call("get_init_inputs()", spec, task.get_init_inputs))


def make_inputs(spec: dict, task, shape: dict, seed: int) -> list:
    """One input set of `shape` from the task's get_inputs() under `seed`, made on the evaluation device (drawing
    gigabytes on the CPU is slow), with the shape's distribution and the task's dtype. The same seed gives the same
    values: the referee draws a timed call's inputs again to check it."""
    import torch

    torch.manual_seed(seed)
    with torch.device(spec["device"]):
        args = list(task_call("get_inputs()", spec, task.get_inputs))
    args = apply_distribution(args, shape["distribution"], seed)
    dtype = dtype_of(spec)
    return cast_floating(args, dtype) if dtype is not None else args


def apply_distribution(args: list, dist: dict, seed: int) -> list:
    """Replace floating-point inputs' values; shapes and dtypes stay as get_inputs() made them."""
    import torch

    if dist["kind"] == "default":
        return args
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            shape, dtype, dev = a.shape, a.dtype, a.device
            gen = torch.Generator(device=dev).manual_seed((10_007 * seed + len(out) + 1) % (1 << 63))
            if dist["kind"] == "uniform":
                a = torch.rand(shape, generator=gen, device=dev)
            else:
                a = torch.randn(shape, generator=gen, device=dev)
                if dist["kind"] == "scaled":
                    shift = dist.get("shift", 0.0) * (1 if seed % 2 == 0 else -1)  # off zero, each sign in turn
                    a = (a + shift) * dist["scale"]
                elif dist["kind"] == "outliers":
                    mask = torch.rand(shape, generator=gen, device=dev) < dist["fraction"]
                    a = torch.where(mask, a * dist["scale"], a)
                elif dist["kind"] == "nonfinite" and a.numel():
                    # A fraction of the values +inf, -inf or NaN in turn (each of the three at least once).
                    flat = a.reshape(-1)
                    count = min(flat.numel(), max(3, int(flat.numel() * dist["fraction"])))
                    where = torch.randperm(flat.numel(), generator=gen, device=dev)[:count]
                    specials = torch.tensor([float("inf"), float("-inf"), float("nan")], device=dev)
                    flat[where] = specials[torch.arange(count, device=dev) % 3]
                    a = flat.reshape(shape)
            a = a.to(dtype)
        out.append(a)
    return out


def device_out_of_memory(exc: BaseException | None) -> str | None:
    """The message of a device out-of-memory error in exc or what caused it, or None."""
    while exc is not None:
        if type(exc).__name__ == "OutOfMemoryError":
            return str(exc)[:2000]
        exc = exc.__cause__ or exc.__context__
    return None
