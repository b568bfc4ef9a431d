# This session's GPU call (2026-12-06): the referee's GPU attack tests and the CUDA candidates after the fixed-cost
# change; load_inline builds per hour; matmul_bias_relu's baseline at full size; whose intercept is whose.
set -uo pipefail
export OUT=${OUT:-/tmp/gpu-session}; mkdir -p $OUT
GPU_TESTS="referee_attacks or cuda_and_cupy or honest_candidate_on_gpu_with" TESTS_S=170 BUILDS_S=170 \
  BUNDLED_TASKS=matmul_bias_relu BUNDLED_EACH_S=110 bash benchmarks/referee_gpu.sh tests,builds,bundled
source scripts/gpu_env.sh
echo "=== intercepts: rmsnorm baseline with eager and compile"
timeout 100 python3 -m appliance eval benchmarks/tasks/rmsnorm.py benchmarks/baselines/rmsnorm.py --device cuda \
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
