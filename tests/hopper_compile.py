"""Compile a candidate's Triton kernels for Hopper (sm_90) on a machine without a GPU: Triton ships ptxas, so a
kernel that would not build on the H200 (an unsupported construct, a bad constexpr path) fails here, in CPU CI.

    python -m tests.hopper_compile record TASK OUT.json CANDIDATE...   (run with TRITON_INTERPRET=1)
    python -m tests.hopper_compile compile OUT.json                    (run without it)

`record` runs each candidate's forward once under the interpreter on the task's main shape with one row/batch of
1 (the row length, which picks the block sizes, stays as at full size) and writes down every kernel launch: the
kernel, its argument types, constexprs and num_warps. `compile` builds each recorded launch for sm_90 and prints
the launches with their registers and stack bytes (spills) as JSON; a launch that does not build exits non-zero.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64", "int32": "i32",
          "int8": "i8", "uint8": "u8", "bool": "i1"}


def record(task_path: str, out: str, *candidate_paths: str) -> None:
    import inspect

    import torch
    from triton.runtime.interpreter import InterpretedFunction

    from sandbox.harness.common import load_module

    launches: list[dict] = []
    run = InterpretedFunction.run
    current = {}

    def recording(self, *args, grid, warmup, **kwargs):
        params = inspect.signature(self.fn).parameters
        bound = dict(zip(params, args)) | {k: v for k, v in kwargs.items() if k in params}
        signature, constexprs = {}, {}
        for name, param in params.items():
            value = bound.get(name, param.default)
            if "constexpr" in str(param.annotation):
                signature[name], constexprs[name] = "constexpr", value
            elif isinstance(value, torch.Tensor):
                signature[name] = "*" + DTYPES[str(value.dtype).removeprefix("torch.")]
            elif isinstance(value, bool):
                signature[name] = "i1"
            elif isinstance(value, int):
                signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            else:
                signature[name] = "fp32"
        launch = {"candidate": current["path"], "kernel": self.fn.__name__, "signature": signature,
                  "constexprs": constexprs, "options": {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}}
        if launch not in launches:
            launches.append(launch)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recording
    task = load_module(task_path, "task")
    for name in ("batch_size", "batch", "n_rows", "rows"):  # one row: the row length is what picks the blocks
        if isinstance(getattr(task, name, None), int):
            setattr(task, name, 1)
    for path in candidate_paths:
        current["path"] = path
        torch.manual_seed(0)
        model = load_module(path, "candidate").ModelNew(*task.get_init_inputs())
        with torch.no_grad():
            model(*task.get_inputs())
    Path(out).write_text(json.dumps(launches))


def compile_for_hopper(recorded: str) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from sandbox.harness.common import load_module

    cuobjdump = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    modules, results = {}, []
    for launch in json.loads(Path(recorded).read_text()):
        path = launch["candidate"]
        module = modules.get(path) or modules.setdefault(path, load_module(path, f"candidate{len(modules)}"))
        source = ASTSource(getattr(module, launch["kernel"]), launch["signature"], constexprs=launch["constexprs"])
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=launch["options"])
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(kernel.asm["cubin"])
            cubin.flush()
            usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", cubin.name], capture_output=True,
                                   text=True, check=True).stdout
        registers, stack = re.search(r"REG:(\d+).*?STACK:(\d+)", usage).groups()
        results.append(launch | {"registers": int(registers), "stack": int(stack)})
    print(json.dumps(results))


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "record":
        assert os.environ.get("TRITON_INTERPRET") == "1", "record runs under the interpreter"
        record(*rest)
    else:
        compile_for_hopper(*rest)
