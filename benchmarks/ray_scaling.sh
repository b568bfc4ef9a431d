#!/usr/bin/env bash
# Evaluations per hour on one GPU vs two through the Ray executor, on one two-GPU host (issue 8's target: >= 1.8x).
# For each GPU count: a fresh Ray head lending that many GPUs, one tuner run of TASK on it for MAX_WALL seconds
# (benchmarks/optimize_suite.py --executor), the head stopped. Compare the "steady evals / h" column: the middle
# half of the verdicts, so the run's one-off start-up (inputs, baselines, the seed alone) and its drain are left out.
#
# Each GPU gets its share of the host: with N GPUs, the head (and so its workers) and the driver run on the first
# N x CORES_PER_GPU cores (default: the host's cores / its GPUs). The target is about adding GPU hosts, each with
# its own CPUs; on one shared host the one-GPU run would otherwise have every core, and the evaluations' host work
# (processes, files in /dev/shm) the two-GPU run shares would be counted against the scaling. CORES_PER_GPU=0
# gives every run the whole host.
#
#   source scripts/gpu_env.sh && source scripts/gpu_ray_env.sh
#   bash benchmarks/ray_scaling.sh OUT_DIR [TASK=rmsnorm] [MAX_WALL=200] [GPU_COUNTS="1 2"] [optimize_suite args...]
set -uo pipefail
out=${1:?OUT_DIR}; task=${2:-rmsnorm}; max_wall=${3:-200}; counts=${4:-1 2}; shift $(( $# < 4 ? $# : 4 ))
mkdir -p "$out"
gpus_here=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
per_gpu=${CORES_PER_GPU:-$(( gpus_here > 0 ? $(nproc --all) / gpus_here : 0 ))}
for n in $counts; do
  pin=()
  if [ "$per_gpu" -gt 0 ]; then
    pin=(taskset -c "0-$(( n * per_gpu - 1 ))")
    echo "$n GPU(s): cores 0-$(( n * per_gpu - 1 ))"
  fi
  "${pin[@]}" python3 -m ray.scripts.scripts start --head --port 6379 --num-gpus "$n" --include-dashboard false \
    --disable-usage-stats >"$out/ray-head-$n.log" 2>&1 || { echo "ray head ($n GPUs) failed"; tail "$out/ray-head-$n.log"; continue; }
  "${pin[@]}" python3 benchmarks/optimize_suite.py --tasks "$task" --executor 127.0.0.1:6379 --max-candidates 1000 \
    --max-wall "$max_wall" --out "$out/gpus-$n" "$@"
  python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1
done
