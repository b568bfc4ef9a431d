#!/usr/bin/env python3
"""load_inline builds per hour, without and with torch's headers precompiled by the appliance (sandbox/builds.py).

    python3 benchmarks/build_speed.py [--candidate tests/fixtures/candidates/cuda_inline_softmax.py] [--at-once 8]

--at-once copies of the candidate are imported at the same time, each in a fresh process with a fresh
TORCH_EXTENSIONS_DIR (so each one builds from scratch), as that many evaluations in flight would build them; once
with no precompiled header, then once with it (its own build timed apart). Unjailed: the candidate is our own
fixture, and a jail adds nothing to a compiler's work. Prints a Markdown table: seconds per build (median, max),
the wall seconds of the round and builds per hour. Leaves the precompiled header in place (the appliance would
build it anyway); `--remove-after` deletes it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sandbox.builds import ensure_torch_pch, pch_paths  # noqa: E402

CHILD = """
import runpy, sys, time
t0 = time.perf_counter()
from sandbox.builds import keep_trusted_pch
keep_trusted_pch()  # as the kernel server does before it imports a candidate
runpy.run_path(sys.argv[1])
print(f"{time.perf_counter() - t0:.2f}")
"""


def build_round(candidate: Path, at_once: int) -> tuple[list[float], float]:
    """Seconds per build and the round's wall seconds."""
    t0 = time.perf_counter()
    procs = []
    for _ in range(at_once):
        env = os.environ | {"TORCH_EXTENSIONS_DIR": tempfile.mkdtemp(prefix="build-speed-"),
                            "PYTHONPATH": str(REPO)}
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD, str(candidate)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    seconds = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"a build failed: {err[-2000:]}")
        seconds.append(float(out.strip().splitlines()[-1]))
    return seconds, time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidate", type=Path, default=REPO / "tests/fixtures/candidates/cuda_inline_softmax.py")
    parser.add_argument("--at-once", type=int, default=8)
    parser.add_argument("--remove-after", action="store_true")
    args = parser.parse_args()
    import torch.utils.cpp_extension as ext

    rows = []
    ext.remove_extension_h_precompiler_headers()  # "before": as a host without the appliance's header
    seconds, wall = build_round(args.candidate, args.at_once)
    rows.append(("no precompiled header", seconds, wall))
    print(f"before: {seconds} in {wall:.1f} s", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    status = ensure_torch_pch()
    made = time.perf_counter() - t0
    print(f"precompiled header: {status} ({made:.1f} s, {pch_paths()[0].stat().st_size / 2**20:.0f} MiB)"
          if pch_paths()[0].exists() else f"precompiled header: {status}", file=sys.stderr, flush=True)
    if pch_paths()[0].exists():
        seconds, wall = build_round(args.candidate, args.at_once)
        rows.append(("torch's headers precompiled (sandbox/builds.py)", seconds, wall))
    print(f"| {args.candidate.name}, {args.at_once} at once, {os.cpu_count()} cores | s per build: median | max | "
          "round wall s | builds / h |\n|---|---|---|---|---|")
    for name, seconds, wall in rows:
        print(f"| {name} | {statistics.median(seconds):.1f} | {max(seconds):.1f} | {wall:.1f} | "
              f"{len(seconds) / wall * 3600:.0f} |")
    print(f"\nThe header itself: {status}, once per host and torch install ({made:.1f} s here).")
    if args.remove_after:
        ext.remove_extension_h_precompiler_headers()
    return 0


if __name__ == "__main__":
    sys.exit(main())
