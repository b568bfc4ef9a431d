# This session's GPU call (2026-12-06): the referee's GPU attack tests and the CUDA candidates after the fixed-cost
# change; whose intercept is whose (eager, compile, the candidate); load_inline builds per hour.
set -uo pipefail
export OUT=${OUT:-/tmp/gpu-session}; mkdir -p $OUT
GPU_TESTS="referee_attacks or cuda_and_cupy" TESTS_S=150 bash benchmarks/referee_gpu.sh tests
source scripts/gpu_env.sh
echo "=== intercepts: rmsnorm baseline with eager and compile"
timeout 90 python3 -m appliance eval benchmarks/tasks/rmsnorm.py benchmarks/baselines/rmsnorm.py --device cuda \
  --mode full --baselines eager,compile --json > $OUT/intercepts.json 2>$OUT/intercepts.err; echo rc=$?
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/intercepts.json"))
print(d["verdict"], str(d["reason"])[:200])
for t in d["timings"]:
    if t["shape"] == "main":
        print(" ", t["implementation"], {k: t.get(k) for k in ("median_ms", "calls_per_batch", "fixed_ms", "own_fixed_ms",
              "fixed_cap_ms", "small_batch_ms", "large_batch_ms", "tiny_ms")})
PY
echo "=== builds"
BUILDS_S=${BUILDS_S:-150} BUILDS_AT_ONCE=8 bash benchmarks/referee_gpu.sh builds
