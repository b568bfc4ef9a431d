#!/usr/bin/env bash
# The GPU acceptance run (on a GPU host with torch/triton but without the appliance installed):
# install the carried wheelhouse, unpack bubblewrap if the host lacks it, run the GPU tests, then evaluate every
# bundled task's baseline at full size and print the table.
#
#   scripts/build_wheelhouse.sh .whl --python 3.12 --without "torch triton numpy"   # on a connected machine
#   bash scripts/gpu_run.sh [OUT_DIR] [--only softmax,cumsum] [--skip-tests]
set -uo pipefail
out=${1:-${OUT:-gpu-results}}; shift || true
only=""; skip_tests=0
while [ $# -gt 0 ]; do
  case $1 in --only) only=$2; shift 2 ;; --skip-tests) skip_tests=1; shift ;; *) shift ;; esac
done
mkdir -p "$out"
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
if [ $skip_tests = 0 ]; then
  python3 -m pytest tests/evaluation/test_gpu.py -q -p no:cacheprovider 2>&1 | tee "$out/pytest-gpu.log" | tail -15
fi
python3 scripts/run_suite.py --out "$out/suite" ${only:+--only "$only"} 2>&1 | tee "$out/suite.log"
if [ $skip_tests = 0 ]; then
  python3 benchmarks/jail_overhead.py --device cuda --reps 3 2>&1 | tee "$out/jail-overhead.log" | tail -12
fi
