# This session's last GPU call (2026-12-06): the referee's attack tests on the GPU after the fixed-cost change, then
# softmax against do_bench with both baselines' intercepts capping the candidate's (what the device time left allows).
set -uo pipefail
export OUT=${OUT:-/tmp/gpu-session}; mkdir -p $OUT
GPU_TESTS="referee_attacks" TESTS_S=100 bash benchmarks/referee_gpu.sh tests
source scripts/gpu_env.sh
timeout ${MEASURE_S:-140} python3 benchmarks/measurement.py --tasks softmax --repeats 5 2>$OUT/measure.err | tail -3
grep -o "softmax [0-9]*/5: [0-9.]* ms\|own_fixed_ms [0-9.]*, fixed_cap_ms [0-9.]*, small_batch_ms [0-9.]*, large_batch_ms [0-9.]*" $OUT/measure.err | paste - -
