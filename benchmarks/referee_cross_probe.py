"""Cross-process timing on the GPU, unjailed: the referee's Slots and Link against a real kernel server process,
for one task's baseline at its main shape, with parts of the referee's per-batch work turned off, to see which
costs the call's time. Prints one line per variant: median ms per call (request to answer, minus the empty round
trip), and the collection's ms.

    python3 benchmarks/referee_cross_probe.py [--task rmsnorm] [--sizes batch_size=2048]
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    import torch

    from appliance.tasks import load_task
    from sandbox.harness.common import load_module
    from sandbox.harness.referee import Link, Slots
    from sandbox.harness.task_code import init_inputs, make_inputs, set_sizes
    from sandbox.protocol import Stage

    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="rmsnorm")
    parser.add_argument("--sizes", default="")
    args = parser.parse_args()
    task = load_task(REPO / "benchmarks/tasks" / f"{args.task}.py")
    task.sizes = task.sizes | {k: int(v) for k, v in (kv.split("=") for kv in args.sizes.split(",") if kv)}
    shape = vars(task.shapes("full")[0])
    spec = {"device": "cuda", "dtype": task.manifest.dtype, "task_display": str(task.path), "seeds": [0]}
    module = load_module(task.path, "task")
    set_sizes(module, shape)
    init, example = init_inputs(spec, module, 0), make_inputs(spec, module, shape, 0)
    out = module.Model(*init).cuda()(*example)
    sh = {"shape": shape, "example": example, "outputs": [{"dtype": str(out.dtype).removeprefix("torch."),
                                                           "shape": list(out.shape)}]}
    ours, theirs = socket.socketpair()
    server = subprocess.Popen([sys.executable, "-m", "sandbox.harness.server", "cuda"], pass_fds=[theirs.fileno()],
                              env=os.environ | {"APPLIANCE_REFEREE_FD": str(theirs.fileno())}, cwd=REPO)
    theirs.close()
    link = Link(ours)
    link.ask({"op": "load", "file": str(REPO / "benchmarks/baselines" / f"{args.task}.py"), "cls": "ModelNew"},
             Stage.LOAD)
    link.ask({"op": "build", "init": list(init), "seed": 0, "dtype": spec["dtype"]}, Stage.LOAD)
    slots = Slots(link, "cuda", "timing", sh, 1)
    flush = torch.empty(64 << 20, dtype=torch.int32, device="cuda")
    clock = time.perf_counter

    def empty() -> float:
        t0 = clock()
        link.ask({"op": "empty"}, Stage.TIMING)
        return (clock() - t0) * 1e3

    e = statistics.median(empty() for _ in range(31))
    fresh = make_inputs(spec, module, shape, 1)
    for name, fill, do_flush, land in [("fill+flush+land", True, True, True), ("fill+flush", True, True, False),
                                       ("flush only", False, True, False), ("nothing", False, False, False),
                                       ("fill only", True, False, False), ("fill+flush, sleep 5 ms", True, True,
                                                                            False)]:
        calls, collects = [], []
        for i in range(60):
            if fill:
                slots.fill(0, fresh)
            if do_flush:
                flush.zero_()
            torch.cuda.synchronize()
            if "sleep" in name:
                time.sleep(0.005)
            t0 = clock()
            link.ask({"op": "call", "calls": [slots.call(0)]}, Stage.TIMING)
            t1 = clock()
            link.ask({"op": "land"}, Stage.TIMING)
            t2 = clock()
            calls.append((t1 - t0) * 1e3 - e)
            collects.append((t2 - t1) * 1e3 - e)
        print(f"| {args.task} {args.sizes} | {name} | call {statistics.median(calls[10:]):.4g} ms | land "
              f"{statistics.median(collects[10:]):.4g} ms | empty {e:.3g} ms |", flush=True)
    link.ask({"op": "exit"}, Stage.TIMING) if False else None
    ours.close()
    server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
