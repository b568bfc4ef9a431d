#!/usr/bin/env bash
# The referee's GPU call: a smoke evaluation, the GPU tests, then the measurement table (referee vs do_bench, CV).
#   bash benchmarks/referee_gpu.sh [smoke,tests,measure,measure_small,suite,bare_suite,bundled,bare,builds,check_cost]   (default: all; output under $OUT)
set -uo pipefail
parts=",${1:-smoke,tests,measure,measure_small,suite},"  # (commas round every part: "measure" is not "measure_small")
out=${OUT:-/tmp/referee-gpu}; mkdir -p "$out"
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if [[ $parts == *,smoke,* ]]; then
  timeout 240 python3 -m appliance eval tests/fixtures/tasks/rowsoftmax.py tests/fixtures/candidates/good.py \
    --device cuda --mode full --baselines eager,compile --json > "$out/smoke.json" 2> "$out/smoke.err"
  python3 - "$out/smoke.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("smoke: no JSON", e); sys.exit(0)
print("smoke:", d["verdict"], d["stage"], d["reason"][:300])
for t in d["timings"]:
    print(" ", t["shape"], t["implementation"], t["median_ms"], {k: t.get(k) for k in ("batches", "calls_per_batch", "raw_window_ms", "tiny_ms", "fixed_ms", "own_fixed_ms", "fixed_cap_ms", "small_batch_ms", "large_batch_ms", "stage_ms", "read_ms", "outputs_in_arena", "checked_calls", "energy_j_per_call")})
PY
  tail -5 "$out/smoke.err"
fi
if [[ $parts == *,tests,* ]]; then
  timeout ${TESTS_S:-420} python3 -m pytest ${GPU_TEST_FILES:-tests/sandbox/test_shared.py tests/evaluation/test_gpu.py} -q \
    -p no:cacheprovider -k "${GPU_TESTS:-not bundled_baseline_full_size and not cuda_and_cupy and not never_ends}" \
    2>&1 | tail -25
fi
if [[ $parts == *,measure,* ]]; then
  timeout ${MEASURE_S:-400} python3 benchmarks/measurement.py --tasks ${MEASURE_TASKS:-rmsnorm,softmax} --repeats ${REPEATS:-10} \
    2>"$out/measure.err" | tail -8
fi
if [[ $parts == *,check_cost,* ]]; then  # the checked timed calls judged whole against sampled (device time)
  timeout ${CHECK_COST_S:-300} python3 benchmarks/check_cost.py --tasks ${CHECK_COST_TASKS:-rmsnorm} \
    --repeats ${REPEATS:-2} --ways ${CHECK_COST_WAYS:-whole,sampled,sampled+fused} 2>"$out/check_cost.err" | tee "$out/check_cost.md" | tail -6
fi
if [[ $parts == *,measure_small,* ]]; then
  timeout ${SMALL_S:-300} python3 benchmarks/measurement.py --tasks rmsnorm --sizes batch_size=2048 --repeats ${REPEATS:-10} --in-flight ${IN_FLIGHT:-3} \
    2>"$out/measure_small.err" | tail -4
fi
if [[ $parts == *,suite,* ]]; then  # evaluations per GPU-hour: the tuner on rmsnorm, beside the naive harness
  timeout ${SUITE_S:-330} python3 benchmarks/optimize_suite.py --tasks rmsnorm --max-candidates 1000 \
    --max-wall ${SUITE_WALL:-240} --in-flight ${SUITE_IN_FLIGHT:-16} --out /dev/shm/suite ${SUITE_NAIVE:---compare-naive --naive-max 5} \
    2>"$out/suite.err" | tail -6
fi
if [[ $parts == *,bare_suite,* ]]; then  # evaluations per GPU-hour with derived shapes on: a bare file, its own kernel tuned
  timeout ${BARE_SUITE_S:-240} python3 benchmarks/optimize_suite.py --tasks ${BARE_SUITE_TASKS:-benchmarks/bare/row_sum.py} \
    --from-kernels benchmarks/bare/kernels --max-candidates 1000 --max-wall ${BARE_SUITE_WALL:-180} --in-flight 16 \
    --out /dev/shm/bare-suite 2>"$out/bare_suite.err" | tail -4
fi
if [[ $parts == *,bundled,* ]]; then  # every bundled baseline through the gate at full size (eager baseline only)
  for name in ${BUNDLED_TASKS:-$(ls benchmarks/tasks/*.py | xargs -n1 basename | sed "s/\.py$//")}; do
    task=benchmarks/tasks/$name.py
    timeout ${BUNDLED_EACH_S:-60} python3 -m appliance eval "$task" "benchmarks/baselines/$name.py" --device cuda \
      --mode full --baselines eager --timing-budget ${BUNDLED_BUDGET_S:-0.3} --json > "$out/bundled-$name.json" \
      2> "$out/bundled-$name.err"
    python3 - "$name" "$out/bundled-$name.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[2]))
except Exception as e:
    print(f"| {sys.argv[1]} | no result ({type(e).__name__}) | | |"); sys.exit(0)
main = next((t for t in d.get("timings", []) if t["shape"] == "main" and t["implementation"] == "candidate"), {})
print(f"| {sys.argv[1]} | {d['verdict']} | {main.get('median_ms')} | {str(d['reason'])[:160]} |")
PY
  done
fi
if [[ $parts == *,bare,* ]]; then  # bare KernelBench files: honest kernels pass, wrong variants are caught (issue 25)
  timeout ${BARE_S:-300} python3 benchmarks/bare_suite.py --device cuda ${BARE_PROBLEMS:+--problems $BARE_PROBLEMS} \
    2>"$out/bare.err" | tee "$out/bare.md" | tail -14
fi
if [[ $parts == *,builds,* ]]; then  # load_inline builds per hour, without and with the precompiled header (issue 26)
  timeout ${BUILDS_S:-300} python3 benchmarks/build_speed.py --at-once ${BUILDS_AT_ONCE:-8} ${BUILDS_CANDIDATE:+--candidate $BUILDS_CANDIDATE} 2>"$out/builds.err" | tail -6
  tail -3 "$out/builds.err"
fi
