"""Helpers shared by the referee and the kernel server: module loading, device turns, errors as data."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import socket
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# The pipes to the device gate (sandbox/gate.py), read before any candidate code runs in this process.
_TURN_FDS = tuple(int(fd) for fd in os.environ.pop("APPLIANCE_TURN_FDS", "").split(",") if fd) or None


def prepare_device(device: str) -> None:
    """Must run before torch/triton are imported: on the CPU, Triton kernels run in its interpreter."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"


# ATen's float unary ops that oneMKL's vector maths (VML) computes on the CPU.
_VML_OPS = ("exp", "expm1", "log", "log10", "log1p", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos",
            "atan", "sinh", "cosh", "tanh", "erf", "erfc", "erfinv", "trunc")


def settle_cpu_math() -> None:
    """Call each VML op once per float dtype on one element, right after `import torch`, before anything runs on
    several threads. oneMKL 2024.2 (in torch's CPU wheels) picks each VML function's kernel at its first call, and a
    first call split over intra-op threads can compute one thread's whole share with the low-accuracy kernel (about
    1.5e-4 relative for exp) although torch asks for high accuracy (pytorch/pytorch#188792). In a referee that would
    make the eager Model look less accurate than it is, and so loosen the precision-tied bound; in a kernel server,
    fail an honest candidate. One element runs on one thread. (Seen here once: an honest softmax in our tests.)"""
    import torch

    for dtype in (torch.float32, torch.float64):
        one = torch.full((1,), 0.5, dtype=dtype)
        for name in _VML_OPS:
            getattr(torch, name)(one)


def _take(kind: bytes) -> None:
    request, grant = _TURN_FDS
    os.write(request, kind)
    if os.read(grant, 1) != b"G":
        raise RuntimeError("the device gate closed before granting a turn")


@contextmanager
def device_turn(shared: bool = False) -> Iterator[None]:
    """A turn on the evaluation device (sandbox/gate.py), taken by the referee only: exclusive for measuring (no
    other work of ours on the device), shared for light use (first calls, correctness; never during a measurement).
    Without a gate (a single evaluation, the CPU tests) the block just runs."""
    if _TURN_FDS is None:
        yield
        return
    _take(b"S" if shared else b"A")
    try:
        yield
    finally:
        os.write(_TURN_FDS[0], b"R")


def device_memory_freed() -> None:
    """Tell the gate this process holds no device memory any more (sandbox/gate.py): its bytes stop counting
    against the budget. A later turn is admitted again. Without a gate there is no one to tell."""
    if _TURN_FDS is not None:
        os.write(_TURN_FDS[0], b"F")


def load_module(path: str | Path, name: str, display_path: str | None = None):
    """Import a Python file as a module. `display_path` names the file in tracebacks (the user's path)."""
    path = Path(path)
    source = path.read_text()
    code = compile(source, display_path or str(path), "exec")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    sys.modules[name] = module  # dataclasses, pickling and Triton's source lookup need the module registered
    exec(code, module.__dict__)
    return module


def as_outputs(result: Any) -> list | None:
    """A forward() result as a list of tensors, or None when it is something else."""
    import torch

    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)) and result and all(isinstance(t, torch.Tensor) for t in result):
        return list(result)
    return None


def cast_floating(values: list, dtype) -> list:
    import torch

    return [v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in values]


def error_info(exc: BaseException, file_of_interest: str) -> dict:
    """Type, message and the innermost line of `file_of_interest` (the candidate's or task's file)."""
    frames = traceback.extract_tb(exc.__traceback__)
    line = None
    for fr in frames:
        if fr.filename == file_of_interest:
            line = fr.lineno
    if isinstance(exc, SyntaxError) and exc.filename == file_of_interest:
        line = exc.lineno
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {
        "type": f"{type(exc).__module__}.{type(exc).__name__}",
        "message": str(exc).strip()[:2000],
        "line": line,
        "traceback": text[-6000:],
    }


def is_compile_error(exc: BaseException) -> bool:
    """Kernel build failures from any backend: Triton (compiler or interpreter), load_inline, CuPy/NVRTC."""
    import subprocess

    name = type(exc).__name__
    module = type(exc).__module__
    if name in ("CompilationError", "CompileException") or module.startswith("triton.compiler"):
        return True
    if name == "InterpreterError":  # TRITON_INTERPRET wraps semantic errors (bad arange, unknown tl.* ...)
        return any(k in str(exc) for k in ("ValueError", "AttributeError", "TypeError", "NameError", "CompilationError"))
    if isinstance(exc, subprocess.CalledProcessError):
        return True
    return isinstance(exc, (RuntimeError, ImportError, OSError)) and "Error building extension" in str(exc)


def environment(device: str) -> dict:
    """What produced the numbers: device, driver and library versions."""
    import torch

    env = {
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "hostname": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
    }
    env["triton"] = _triton_version()
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_sms=props.multi_processor_count, cuda=torch.version.cuda,
                   gpu_memory_gib=round(props.total_memory / 2**30, 1), driver=_driver_version())
    return env


def _triton_version() -> str | None:
    """From the installed package's metadata: importing Triton only for its version cost the CPU referee of every
    evaluation a fifth of a second."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triton")
    except PackageNotFoundError:
        try:
            import triton

            return triton.__version__
        except Exception:  # noqa: BLE001 - a missing Triton is reported, not fatal
            return None


def _driver_version() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        for word in text.split():
            if word.count(".") >= 1 and word.replace(".", "").isdigit():
                return word
    except OSError:
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # noqa: BLE001 - driver version is evidence, not a requirement
        return None


def cpu_seconds() -> float:
    """CPU seconds this process and its finished children (ptxas, nvcc) have used: with the stages' wall seconds,
    it shows whether an evaluation waits or computes on the host."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return round(own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime, 2)


def write_result(path: str | Path, result: dict) -> None:
    """Write atomically, so a process killed mid-write leaves no half result."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    os.replace(tmp, path)


def anon_rss_gib() -> float | None:
    """This process's private resident memory (RssAnon: heap, CUDA's host-side state; not the mapped input and output
    files, which lie in the job folder once), in GiB; None where /proc cannot say. What the controller's host-memory
    budget (appliance/evaluation/host_memory.py) allows per process is checked against these readings."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return round(int(line.split()[1]) / 2**20, 3)
    except (OSError, ValueError, IndexError):
        pass
    return None


def rss_peak(previous: float | None) -> float | None:
    """The larger of `previous` and the private memory now (anon_rss_gib); `previous` where /proc cannot say."""
    rss = anon_rss_gib()
    return previous if rss is None else max(rss, previous or 0.0)


class Stages:
    """Seconds per stage of this process (informational: where an evaluation's time goes); the result adds the
    process's CPU seconds over all stages as "cpu_s", and the most private memory read at a stage's end as
    "rss_anon_peak_gib" (see `summary`)."""

    def __init__(self):
        self.clock = time.perf_counter  # bound before the candidate is imported
        self.seconds: dict[str, float] = {}
        self.last = self.clock()
        self.rss_peak: float | None = None

    def done(self, stage: str) -> None:
        now = self.clock()
        self.seconds[stage] = round(self.seconds.get(stage, 0.0) + now - self.last, 3)
        self.last = now
        self.rss_peak = rss_peak(self.rss_peak)

    def summary(self) -> dict:
        """The seconds per stage, with "cpu_s" and "rss_anon_peak_gib" (where /proc could say)."""
        self.rss_peak = rss_peak(self.rss_peak)
        extra = {"rss_anon_peak_gib": self.rss_peak} if self.rss_peak is not None else {}
        return self.seconds | {"cpu_s": cpu_seconds()} | extra
