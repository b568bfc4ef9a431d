"""Which side's memory is fast, and where a cross-process call's time goes (GPU only, unjailed).

A parent (the referee's role) and a child (the kernel server's role) joined by a socket pair. The child times one
task's baseline with do_bench on: its own tensors; inputs in a pool the parent created (imported); inputs in a
pool it created itself; outputs born in an arena imported from the parent (sandbox/harness/arena.py). Then the
parent times calls across the socket with its own clock while the child records CUDA events around its forward.

    python3 benchmarks/ownership_probe.py [--task rmsnorm] [--sizes batch_size=2048]
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


def setup(args):
    import torch

    from appliance.tasks import load_task
    from sandbox.harness.common import load_module
    from sandbox.harness.task_code import init_inputs, make_inputs, set_sizes

    task = load_task(REPO / "benchmarks/tasks" / f"{args.task}.py")
    task.sizes = task.sizes | {k: int(v) for k, v in (kv.split("=") for kv in args.sizes.split(",") if kv)}
    shape = vars(task.shapes("full")[0])
    spec = {"device": "cuda", "dtype": task.manifest.dtype, "task_display": str(task.path)}
    module = load_module(task.path, "task")
    set_sizes(module, shape)
    init, x = init_inputs(spec, module, 0), make_inputs(spec, module, shape, 0)
    torch.manual_seed(0)
    model = load_module(REPO / "benchmarks/baselines" / f"{args.task}.py", "cand").ModelNew(*init).cuda()
    return model, x, spec, module, shape


def child(args, fd: int) -> int:
    import torch
    from triton.testing import do_bench

    from sandbox import protocol
    from sandbox.harness.arena import Arena
    from sandbox.harness.shared import Pool

    sock = socket.socket(fileno=fd)
    model, x, *_ = setup(args)
    bench = lambda fn: do_bench(fn, warmup=50, rep=300, return_mode="median")  # noqa: E731
    pools, arena, views = {}, None, {}
    while True:
        msg, fds = protocol.receive(sock)
        op = msg["op"]
        if op == "exit":
            return 0
        if op == "pool":
            pools[msg["name"]] = Pool.attach("cuda", fds[0], msg["nbytes"])
            views[msg["name"]] = [pools[msg["name"]].tensor(e) for e in msg["entries"]]
            if msg["name"] == "arena":
                p = pools["arena"]
                arena = Arena(p._ptr, p._size)
            protocol.send(sock, {"ok": True})
        elif op == "bench":
            with torch.no_grad():
                out = {}
                out["child local"] = bench(lambda: model(*x))
                imported = views["inputs"]
                out["child, inputs imported"] = bench(lambda: model(*imported))
                own = Pool.create("cuda", pools["inputs"].nbytes)
                mine = [own.tensor(e) for e in msg["entries"]]
                for v, a in zip(mine, x):
                    v.copy_(a)
                out["child, inputs own pool"] = bench(lambda: model(*mine))
                with torch.cuda.use_mem_pool(arena.pool):
                    y = model(*imported)
                out["arena holds output"] = arena.holds(y.data_ptr(), y.numel() * y.element_size())
                del y

                def in_arena():
                    with torch.cuda.use_mem_pool(arena.pool):
                        return model(*imported)
                out["child, inputs imported, outputs in arena"] = bench(in_arena)
                out["child, own pool, outputs in arena"] = bench(lambda: in_arena())
            protocol.send(sock, {"ok": True, "bench": out})
        elif op == "call":
            use_arena = msg.get("arena")
            ins = views["inputs"]
            with torch.no_grad():
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter()
                e0.record()
                for _ in range(msg["k"]):
                    if use_arena:
                        with torch.cuda.use_mem_pool(arena.pool):
                            y = model(*ins)
                    else:
                        y = model(*ins)
                e1.record()
                torch.cuda.synchronize()
                t1 = time.perf_counter()
            where = int(y.data_ptr()) - arena.base if use_arena else -1
            protocol.send(sock, {"ok": True, "gpu_ms": e0.elapsed_time(e1), "host_ms": (t1 - t0) * 1e3,
                                 "offset": where})
            del y
        elif op == "empty":
            torch.cuda.synchronize()
            protocol.send(sock, {"ok": True})


def parent(args) -> int:
    import torch
    from triton.testing import do_bench

    from sandbox import protocol
    from sandbox.harness.shared import Pool, layout

    model, x, spec, module, shape = setup(args)
    with torch.no_grad():
        y = model(*x)
    entries, nbytes = layout([(str(a.dtype).removeprefix("torch."), tuple(a.shape), None) for a in x])
    inputs = Pool.create("cuda", nbytes)
    views = [inputs.tensor(e) for e in entries]
    for v, a in zip(views, x):
        v.copy_(a)
    out_bytes = y.numel() * y.element_size()
    arena = Pool.create("cuda", 4 * out_bytes + (256 << 20))
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(theirs.fileno()), "--task", args.task,
                             "--sizes", args.sizes], pass_fds=[theirs.fileno()], cwd=REPO)
    theirs.close()

    def ask(msg, fds=()):
        protocol.send(ours, msg, fds)
        return protocol.receive(ours)[0]

    for name, pool, ents in (("inputs", inputs, entries), ("arena", arena, [])):
        fd = pool.export_fd()
        ask({"op": "pool", "name": name, "nbytes": pool.nbytes, "entries": ents}, (fd,))
        os.close(fd)
    rows = {}
    with torch.no_grad():
        rows["parent local (do_bench)"] = do_bench(lambda: model(*x), warmup=50, rep=300, return_mode="median")
        rows["parent, its own pool (do_bench)"] = do_bench(lambda: model(*views), warmup=50, rep=300,
                                                           return_mode="median")
    rows |= ask({"op": "bench", "entries": entries})["bench"]
    clock = time.perf_counter
    flush = torch.empty(64 << 20, dtype=torch.int32, device="cuda")

    def empty():
        t0 = clock()
        ask({"op": "empty"})
        return (clock() - t0) * 1e3

    e = statistics.median(empty() for _ in range(31))
    rows["empty round trip ms"] = e
    for use_arena in (False, True):
        for k in (1, 4):
            for do_flush in (True, False):
                host, gpu, child_host = [], [], []
                for _ in range(40):
                    if do_flush:
                        flush.zero_()
                    torch.cuda.synchronize()
                    t0 = clock()
                    a = ask({"op": "call", "k": k, "arena": use_arena})
                    host.append(((clock() - t0) * 1e3 - e) / k)
                    gpu.append(a["gpu_ms"] / k)
                    child_host.append(a["host_ms"] / k)
                label = f"cross, k={k}, outputs {'arena' if use_arena else 'local'}, {'flushed' if do_flush else 'no flush'}"
                rows[label] = (f"referee clock - empty {statistics.median(host[5:]):.4g} | child host "
                               f"{statistics.median(child_host[5:]):.4g} | child events {statistics.median(gpu[5:]):.4g}")
    print(f"## {args.task} {args.sizes or 'full'}")
    for k, v in rows.items():
        print(f"| {k} | {v if isinstance(v, str) else round(v, 5)} |", flush=True)
    protocol.send(ours, {"op": "exit"})
    proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--task", default="rmsnorm")
    p.add_argument("--sizes", default="")
    p.add_argument("--child", type=int, default=None)
    a = p.parse_args()
    sys.exit(child(a, a.child) if a.child is not None else parent(a))
