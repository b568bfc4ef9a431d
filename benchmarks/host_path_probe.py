#!/usr/bin/env python3
"""Where an evaluation's host-side seconds go when many run at once: each step of the harness's data path timed in
N processes started together, for N = 1 and N = --many.

    python benchmarks/host_path_probe.py [--gib 1] [--sets 3] [--many 12] [--dir /dev/shm/probe]

Steps, per process: import torch (+ triton), CUDA context, page-locked allocation of one set, copy of a memory-mapped
torch.save file into it (what the harness does), the same bytes read() from a raw file into it, upload from
page-locked and from memory-mapped (pageable) memory, download into page-locked memory, torch.save of it; then the
path the harness takes now (sandbox/harness/transfer.py): staged uploads from the mapped files, an output file
created and mapped, a staged download into it, and that file read back to the device.
The input files are shared by all processes, as a run's input sets are. Prints one Markdown table of medians.

Our own code only (no candidate): it runs unjailed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

def worker(directory: Path, sets: int, start_at: float, out: Path) -> None:
    while time.time() < start_at:  # every process starts its work at the same moment
        time.sleep(0.001)
    t = {}
    c = time.perf_counter
    t0 = c()
    import torch
    import triton  # noqa: F401

    t["import torch+triton"] = c() - t0
    t0 = c()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t["cuda context"] = c() - t0
    first = torch.load(directory / "set-0.pt", weights_only=True, mmap=True, map_location="cpu")["args"][0]
    nbytes = first.numel() * first.element_size()
    t0 = c()
    pinned = torch.empty(first.shape, dtype=first.dtype, pin_memory=True)
    t["page-locked alloc (1 set)"] = c() - t0
    t0 = c()
    for k in range(sets):
        mapped = torch.load(directory / f"set-{k}.pt", weights_only=True, mmap=True, map_location="cpu")["args"][0]
        pinned.copy_(mapped)
    t["mmap -> page-locked (all sets)"] = c() - t0
    t0 = c()
    for k in range(sets):
        with open(directory / f"set-{k}.bin", "rb", buffering=0) as f:
            f.readinto(memoryview(pinned.numpy()).cast("B"))
    t["read() -> page-locked (all sets)"] = c() - t0
    t0 = c()
    on_device = pinned.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    t["upload from page-locked (1 set)"] = c() - t0
    t0 = c()
    mapped = torch.load(directory / "set-1.pt", weights_only=True, mmap=True, map_location="cpu")["args"][0]
    again = mapped.to("cuda")
    torch.cuda.synchronize()
    t["upload from mmap, pageable (1 set)"] = c() - t0
    t0 = c()
    pinned.copy_(on_device, non_blocking=True)
    torch.cuda.synchronize()
    t["download to page-locked (1 set)"] = c() - t0
    t0 = c()
    torch.save([pinned], out.with_suffix(".pt"))
    t["torch.save to /dev/shm (1 set)"] = c() - t0
    out.with_suffix(".pt").unlink()
    # The harness's path since the eighth session (sandbox/harness/transfer.py): no set page-locked, no torch.save.
    from sandbox.harness.transfer import OutputRecord, Staging, create_output_file

    staging = Staging("cuda")
    staging.upload(first[:1 << 20])  # its two page-locked chunks allocated
    torch.cuda.synchronize()
    t0 = c()
    for k in range(sets):
        mapped = torch.load(directory / f"set-{k}.pt", weights_only=True, mmap=True, map_location="cpu")["args"][0]
        staged = staging.upload(mapped)
    torch.cuda.synchronize()
    t["staged upload from mmap (all sets)"] = c() - t0
    t0 = c()
    name = f"{out.stem}-out"
    [host] = create_output_file(out.parent, name, [on_device])
    t["output file created and mapped (1 set)"] = c() - t0
    t0 = c()
    staging.download(on_device, host)
    t["staged download into it (1 set)"] = c() - t0
    del host
    t0 = c()
    [back] = OutputRecord(out.parent, name, 2 * nbytes).upload(staging)
    torch.cuda.synchronize()
    t["output file read, staged upload (1 set)"] = c() - t0
    # The files' own pages locked in place instead (Staging.pin: the driver's cuMemHostRegister, read-only for the
    # inputs), outside any turn: the copy in the turn is then a DMA alone.
    t0 = c()
    mapped_sets = [torch.load(directory / f"set-{k}.pt", weights_only=True, mmap=True, map_location="cpu")["args"][0]
                   for k in range(sets)]
    t["inputs pinned in place"] = float(sum(staging.pin(m) for m in mapped_sets))
    t["pin mapped inputs (all sets)"] = c() - t0
    t0 = c()
    for m in mapped_sets:
        direct = staging.upload(m)
    torch.cuda.synchronize()
    t["upload from pinned (all sets)"] = c() - t0
    assert torch.equal(direct[:1 << 20].cpu(), mapped_sets[-1][:1 << 20])
    t0 = c()
    staging.unpin()
    t["unpin (all sets)"] = c() - t0
    [host] = create_output_file(out.parent, name, [on_device])
    t0 = c()
    t["output pinned in place"] = float(staging.pin(host, read_only=False))
    t["pin output file (1 set)"] = c() - t0
    t0 = c()
    staging.download(on_device, host)
    torch.cuda.synchronize()
    t["download into pinned file (1 set)"] = c() - t0
    staging.unpin()
    del host
    record = OutputRecord(out.parent, name, 2 * nbytes)
    t0 = c()
    record.pin(staging)
    t["pin output file read-only, check side (1 set)"] = c() - t0
    t0 = c()
    [back] = record.upload(staging)
    torch.cuda.synchronize()
    t["upload from it (1 set)"] = c() - t0
    assert torch.equal(back.view(torch.uint8)[:1 << 20], on_device.view(torch.uint8)[:1 << 20])
    staging.unpin()
    for suffix in (".bin", ".json"):
        (out.parent / f"{name}{suffix}").unlink()
    del again, staged, back, direct
    t["GB/s basis"] = nbytes / 1e9
    out.write_text(json.dumps(t))


def main() -> int:
    if sys.argv[1:2] == ["--worker"]:
        worker(Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), Path(sys.argv[5]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--sets", type=int, default=3)
    p.add_argument("--many", type=int, default=12)
    p.add_argument("--dir", default="/dev/shm/probe")
    args = p.parse_args()
    import torch

    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    n = int(args.gib * (1 << 30)) // 4
    for k in range(args.sets):
        x = torch.full((n,), float(k))
        torch.save({"args": [x]}, d / f"set-{k}.pt")
        x.numpy().tofile(d / f"set-{k}.bin")
    del x
    rows = {}
    for procs in (1, args.many):
        start_at = time.time() + 2.0
        outs = [d / f"result-{procs}-{i}.json" for i in range(procs)]
        children = [subprocess.Popen([sys.executable, __file__, "--worker", str(d), str(args.sets), str(start_at),
                                      str(o)]) for o in outs]
        t0 = time.time()
        for child in children:
            child.wait()
        wall = time.time() - max(start_at, t0)
        results = [json.loads(o.read_text()) for o in outs if o.exists()]
        rows[procs] = {k: statistics.median(r[k] for r in results) for k in results[0]} | {"wall (all)": wall}
    print(f"\n| step (median s per process) | 1 process | {args.many} at once |\n|---|---|---|")
    for k in rows[1]:
        if k != "GB/s basis":
            print(f"| {k} | {rows[1][k]:.3f} | {rows[args.many][k]:.3f} |")
    print(f"(one set = {rows[1]['GB/s basis']:.2f} GB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
