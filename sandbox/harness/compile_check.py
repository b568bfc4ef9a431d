"""Compile-only check of a candidate on a host without a GPU (a CPU-only node of a Ray cluster): its Triton kernels
are built for the evaluation GPUs' architecture with Triton's own compiler and ptxas, so a kernel that cannot build is
rejected before it takes a GPU worker's slot. Runs jailed, as the candidate: it imports the candidate's code.

    TRITON_INTERPRET=1 python -m sandbox.harness.compile_check record SPEC
        one forward at the task's small size under the interpreter; every kernel launch written down (the kernel,
        its argument types, constexprs, num_warps and num_stages)
    python -m sandbox.harness.compile_check build SPEC
        each recorded launch compiled for spec["arch"] (e.g. 90 for the H200)
    python -m sandbox.harness.compile_check canary SPEC
        a known-good kernel compiled the same way: a host whose compiler or ptxas does not work must not reject
        anything (the screen turns itself off)

The interpreter runs Python as Python, so a kernel that it runs may still not build (a `break`, a Python call, a
type the compiler refuses); that is what `build` finds. A launch the interpreter refused is built too: only the
compiler's refusal rejects a candidate, and only when every recorded launch of that kernel is refused (the autotuner
skips a config that does not build; the interpreter runs them all). Arguments of other types than tensors, ints,
floats and bools (a TMA descriptor, say) are not typed here: such a launch is not built.

Result (spec["result"]): record: {"status": "recorded", "launches": [...]}; build and canary: {"status": "built",
"kernels": N}, or for build {"status": "compile_error", "kernel", "reason"}; any: {"status": "inconclusive",
"reason"} when the check itself could not be made (the GPU evaluation decides).
The task's own file is loaded here to make inputs: the candidate may see it, as an LLM sees it in its prompt.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import sys
import traceback
from pathlib import Path

from sandbox.harness.common import load_module, write_result

TRITON_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64",
                "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}


def main(argv: list[str]) -> int:
    command, spec_path = argv
    spec = json.loads(Path(spec_path).read_text())
    try:
        result = {"record": record, "build": build, "canary": canary}[command](spec)
    except Exception as exc:  # noqa: BLE001 - whatever broke the check, the GPU evaluation will see again
        result = {"status": "inconclusive", "reason": f"{type(exc).__name__}: {exc}"[:2000],
                  "traceback": traceback.format_exc()[-4000:]}
    write_result(spec["result"], result)
    return 0


def launch_of(fn, args: tuple, kwargs: dict) -> dict:
    """A kernel launch as data: the @triton.jit function's name, Triton's signature and constexprs, its options."""
    import torch

    params = inspect.signature(fn).parameters
    bound = dict(zip(params, args)) | {k: v for k, v in kwargs.items() if k in params}
    signature, constexprs = {}, {}
    for name, param in params.items():
        value = bound.get(name, param.default)
        if "constexpr" in str(param.annotation) or value is None:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + TRITON_TYPES[str(value.dtype).removeprefix("torch.")]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            return {"kernel": fn.__name__, "untyped": f"{name}: {type(value).__name__}"}
    return {"kernel": fn.__name__, "signature": signature, "constexprs": constexprs,
            "options": {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}}


def recording_launches(on_launch) -> None:
    """Under TRITON_INTERPRET=1: call on_launch(launch) for every kernel launch from now on (autotuned ones too)."""
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def recording(self, *args, grid, warmup, **kwargs):
        on_launch(launch_of(self.fn, args, kwargs))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recording


def record(spec: dict) -> dict:
    import torch

    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("record runs under the Triton interpreter (TRITON_INTERPRET=1)")
    task = load_module(spec["task_file"], "task")
    for name, value in spec["sizes"].items():
        setattr(task, name, value)
    torch.manual_seed(0)
    init = list(task.get_init_inputs())
    args = list(task.get_inputs())
    if spec.get("dtype"):
        dtype = getattr(torch, spec["dtype"])
        args = [a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    launches: list[dict] = []
    recording_launches(lambda launch: launches.append(launch) if launch not in launches else None)
    candidate = load_module(spec["candidate_file"], "candidate")
    torch.manual_seed(0)
    model = candidate.ModelNew(*init)
    if spec.get("dtype"):
        model = model.to(getattr(torch, spec["dtype"]))
    try:
        with torch.no_grad():
            model(*args)
    except Exception as exc:  # noqa: BLE001
        if not launches:
            raise
        # The interpreter refused a launch it had been given (a semantic error in the kernel, say): the compiler
        # gets that launch all the same, and its word decides.
        return {"status": "recorded", "launches": launches, "forward_error": f"{type(exc).__name__}: {exc}"[:2000]}
    return {"status": "recorded", "launches": launches}


def jit_function(obj):
    """The @triton.jit function under autotune/heuristics wrappers (each keeps the one it wraps as `.fn`)."""
    from triton.runtime.jit import JITFunction

    while obj is not None and not isinstance(obj, JITFunction):
        obj = getattr(obj, "fn", None)
    return obj


def build_launch(module, launch: dict, arch: int, warp_size: int = 32):
    """Compile one recorded launch for a CUDA GPU of compute capability `arch` (e.g. 90); returns Triton's kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = jit_function(getattr(module, launch["kernel"], None))
    if fn is None:
        return None
    source = ASTSource(fn, launch["signature"], constexprs=launch["constexprs"])
    return triton.compile(source, target=GPUTarget("cuda", arch, warp_size), options=launch["options"])


def refused_by_compiler(exc: BaseException) -> bool:
    """The compiler's word on the kernel (its front end, or ptxas rejecting the code), as opposed to a tool that is
    missing, killed or broken on this host, which says nothing about the kernel."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import PTXASError

    if isinstance(exc, CompilationError):
        return True
    if isinstance(exc, PTXASError):
        code = re.search(r"failed with error code (\d+)", str(exc))
        return bool(code) and int(code[1]) < 128  # 128 + N: ptxas died of signal N (the jail's limits, say)
    return False


def build(spec: dict) -> dict:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("build runs without the Triton interpreter")
    launches = [launch for launch in json.loads(Path(spec["launches_file"]).read_text())["launches"]
                if "untyped" not in launch]
    module = load_module(spec["candidate_file"], "candidate")
    refusals: dict[str, list[str]] = {}
    built: set[str] = set()
    for launch in launches:
        try:
            kernel = build_launch(module, launch, spec["arch"])
        except Exception as exc:  # noqa: BLE001 - the compiler's refusal, or our own failure (undecided)
            if not refused_by_compiler(exc):
                raise
            refusals.setdefault(launch["kernel"], []).append(f"{type(exc).__name__}: {exc}"[:3000])
            continue
        if kernel is not None:
            built.add(launch["kernel"])
    refused = [name for name in refusals if name not in built]  # every launch of it refused
    if refused:
        return {"status": "compile_error", "kernel": refused[0], "reason": refusals[refused[0]][0]}
    return {"status": "built", "kernels": len(built)}


CANARY_SOURCE = """
import triton
import triton.language as tl


@triton.jit
def canary_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)
"""
CANARY_LAUNCH = {"kernel": "canary_kernel", "signature": {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32",
                                                          "BLOCK": "constexpr"},
                 "constexprs": {"BLOCK": 256}, "options": {"num_warps": 4}}


def canary(spec: dict) -> dict:
    path = Path(spec["canary_file"])
    path.write_text(CANARY_SOURCE)
    build_launch(load_module(path, "canary"), CANARY_LAUNCH, spec["arch"])
    return {"status": "built", "kernels": 1}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
