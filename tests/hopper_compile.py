"""Compile a candidate's Triton kernels for Hopper (sm_90) on a machine without a GPU: Triton ships ptxas, so a
kernel that would not build on the H200 (an unsupported construct, a bad constexpr path) fails here, in CPU CI. The
recording and the build are the product's compile-only check (sandbox/harness/compile_check.py); this adds the
registers and stack bytes of each build.

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


def record(task_path: str, out: str, *candidate_paths: str) -> None:
    import torch

    from sandbox.harness.common import load_module
    from sandbox.harness.compile_check import recording_launches

    launches: list[dict] = []
    current = {}

    def on_launch(launch: dict) -> None:
        launch = {"candidate": current["path"], **launch}
        if launch not in launches:
            launches.append(launch)

    recording_launches(on_launch)
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

    from sandbox.harness.common import load_module
    from sandbox.harness.compile_check import build_launch

    cuobjdump = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    modules, results = {}, []
    for launch in json.loads(Path(recorded).read_text()):
        path = launch["candidate"]
        module = modules.get(path) or modules.setdefault(path, load_module(path, f"candidate{len(modules)}"))
        kernel = build_launch(module, launch, arch=90)
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
