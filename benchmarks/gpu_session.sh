set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
stat -fc %T /sys/fs/cgroup; cat /proc/self/cgroup
echo "=== gpu tests (gate, shared)"
timeout 200 python3 -m pytest tests/sandbox/test_gate.py tests/sandbox/test_shared.py -q -p no:cacheprovider -m "gpu or not gpu" -x 2>&1 | tail -15
echo "=== quiet probe"
timeout 260 python3 benchmarks/quiet_probe.py --device cuda --candidate benchmarks/results/softmax-compile-seed-h200.py --copies 8 --slots 4 2>$OUT/quiet.err | tail -8
tail -3 $OUT/quiet.err
echo "=== KB relu at full size"
timeout 100 python3 -m appliance eval benchmarks/kernelbench/relu.py benchmarks/kernelbench/kernels/relu.py --device cuda --mode full --baselines eager --timing-budget 0.3 --json > $OUT/relu.json 2>$OUT/relu.err; echo rc=$?
python3 -c "
import json,sys
d=json.load(open('$OUT/relu.json')); print(d['verdict'], d['stage'], str(d['reason'])[:400])
for t in d.get('timings',[]): print(' ', t['shape'], t['implementation'], t['median_ms'])
" 2>&1 | tail -12
tail -5 $OUT/relu.err
