"""Model profiles (models/*.toml), the vLLM command built from them, and `appliance model serve|check|list`: against
stdlib HTTP fakes, and (marked `llm`) a real vLLM serving SmolLM2-135M on the CPU."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from typer.testing import CliRunner

from appliance.model_cli import model_app
from appliance.models import ProfileError, available, load_profile, preflight, vllm_command
from tests.conftest import REPO

BUNDLED = ("qwen3-coder-30b-a3b-fp8", "gpt-oss-20b", "devstral-small", "smollm2-135m-cpu")
MINIMAL = 'description = "d"\nweights_dir = "WEIGHTS"\nserved_name = "m"\n'


def model(*args: str):
    return CliRunner().invoke(model_app, [str(a) for a in args], catch_exceptions=False)


def write(tmp_path, text: str, name: str = "p.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ("APPLIANCE_MODELS", "APPLIANCE_MODEL_PROFILES", "APPLIANCE_LLM_URL", "APPLIANCE_LLM_MODEL",
                "APPLIANCE_LLM_MAX_TOKENS"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_profiles_load(name):
    assert name in available()
    p = load_profile(name)
    assert p.name == name and p.description and p.served_name and p.path == str(REPO / "models" / f"{name}.toml")


def test_every_file_in_models_loads():
    assert set(BUNDLED) <= set(available())
    for name in available():
        load_profile(name)


def test_profile_by_path_and_placeholder(tmp_path, monkeypatch):
    monkeypatch.setenv("APPLIANCE_MODELS", str(tmp_path / "weights"))
    p = load_profile(write(tmp_path, MINIMAL.replace("WEIGHTS", "${APPLIANCE_MODELS}/m")))
    assert p.weights_dir == str(tmp_path / "weights/m") and p.name == "p"
    assert load_profile("qwen3-coder-30b-a3b-fp8").weights_dir.startswith(str(tmp_path / "weights"))
    monkeypatch.delenv("APPLIANCE_MODELS")
    assert load_profile("gpt-oss-20b").weights_dir == "/srv/appliance/models/gpt-oss-20b"
    assert load_profile("smollm2-135m-cpu").interpreter == os.path.expanduser(
        "~/.cache/appliance-test-llm/venv/bin/python")


@pytest.mark.parametrize("text, expected", [
    (MINIMAL + "colour = 1\n", "colour: Extra inputs are not permitted"),
    (MINIMAL + "[vllm]\nmax_len = 5\n", "vllm.max_len: Extra inputs are not permitted"),
    (MINIMAL + "[vllm]\ngpu_memory_utilization = 1.5\n", "vllm.gpu_memory_utilization"),
    (MINIMAL + 'device = "tpu"\n', "device"),
    ('description = "d"\nweights_dir = "w"\n', "served_name: Field required"),
    (MINIMAL + "gpu = [0]\n[vllm]\ntensor_parallel_size = 2\n", "one GPU per rank"),
    (MINIMAL + '[env]\nCUDA_VISIBLE_DEVICES = "1"\n', "CUDA_VISIBLE_DEVICES set by the appliance"),
    (MINIMAL.replace("WEIGHTS", "${HOME}/m"), "only ${APPLIANCE_MODELS} is known"),
    (MINIMAL + 'name = "x"\n', "`name` is not a profile field"),
    (MINIMAL + "port = \n", "Invalid value"),  # TOML syntax: tomllib's message has the line
])
def test_bad_profiles_name_file_and_field(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert str(e.value).startswith(str(path)) and expected in str(e.value), str(e.value)


def test_unknown_profile_lists_available(tmp_path):
    with pytest.raises(ProfileError, match="unknown model profile 'nope'.*gpt-oss-20b.*qwen3-coder-30b-a3b-fp8"):
        load_profile("nope")
    with pytest.raises(ProfileError, match="no such profile file"):
        load_profile(tmp_path / "missing.toml")


def test_vllm_command_cuda_profile():
    p = load_profile("qwen3-coder-30b-a3b-fp8")
    argv, env = vllm_command(p)
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]  # python unset: this one
    joined = " ".join(argv)
    for part in (f"--model {p.weights_dir}", "--served-model-name qwen3-coder-30b-a3b", "--host 127.0.0.1",
                 "--port 8000", "--gpu-memory-utilization 0.9", "--max-model-len 65536", "--quantization fp8",
                 "--enable-auto-tool-choice --tool-call-parser qwen3_coder", "--tensor-parallel-size 1"):
        assert part in joined
    assert "--enforce-eager" not in argv
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
    assert "--reasoning-parser openai_gptoss" in " ".join(vllm_command(load_profile("gpt-oss-20b"))[0])
    assert vllm_command(load_profile("devstral-small"))[0][-6:] == [
        "--tokenizer-mode", "mistral", "--config-format", "mistral", "--load-format", "mistral"]


def test_vllm_command_tensor_parallel_gpus(tmp_path):
    p = load_profile(write(tmp_path, MINIMAL + "gpu = 2\n[vllm]\ntensor_parallel_size = 2\n"))
    argv, env = vllm_command(p)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and "--tensor-parallel-size 2" in " ".join(argv)
    p = load_profile(write(tmp_path, MINIMAL + "gpu = [5, 7]\n[vllm]\ntensor_parallel_size = 2\n"))
    assert vllm_command(p)[1]["CUDA_VISIBLE_DEVICES"] == "5,7"


def test_vllm_command_cpu_profile():
    p = load_profile("smollm2-135m-cpu")
    argv, env = vllm_command(p)
    assert argv[0] == p.interpreter and argv[argv.index("--port") + 1] == "8011"
    assert argv[-5:] == ["--max-model-len", "2048", "--dtype", "bfloat16", "--enforce-eager"]
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU model must not touch the evaluation GPUs
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HF_HUB_OFFLINE"] == "1"


def test_serve_dry_run_prints_command_and_warns():
    result = model("serve", "qwen3-coder-30b-a3b-fp8", "--dry-run", "--port", "8100", "--gpu", "3")
    assert result.exit_code == 0, result.output
    assert "CUDA_VISIBLE_DEVICES=3 " in result.stdout and "HF_HUB_OFFLINE=1" in result.stdout
    assert "-m vllm.entrypoints.openai.api_server" in result.stdout and "--port 8100" in result.stdout
    assert "does not exist" in result.stderr  # no weights on this machine: said, yet nothing started


def test_serve_refuses_missing_or_incomplete_weights(tmp_path):
    path = write(tmp_path, MINIMAL.replace("WEIGHTS", str(tmp_path / "w")) + f'python = "{sys.executable}"\n')
    result = model("serve", path)
    assert result.exit_code == 2 and "does not exist" in result.stderr and "never downloads" in result.stderr
    (tmp_path / "w").mkdir()
    (tmp_path / "w/model.safetensors").write_text("")
    result = model("serve", path)
    assert result.exit_code == 2 and "no config.json" in result.stderr
    (tmp_path / "w/config.json").write_text("{}")
    # Now only vLLM is missing (this venv has none): said before any process starts.
    assert [p for p in preflight(load_profile(path)) if "vLLM is not installed" not in p] == []


def test_list_json():
    result = model("list", "--json")
    assert result.exit_code == 0
    rows = {r["name"]: r for r in json.loads(result.stdout)["profiles"]}
    assert set(BUNDLED) <= set(rows)
    assert rows["gpt-oss-20b"]["served_name"] == "gpt-oss-20b" and rows["gpt-oss-20b"]["gpus"] == [0]



def test_list_shows_a_broken_profile_beside_the_good_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("APPLIANCE_MODEL_PROFILES", str(tmp_path))
    write(tmp_path, MINIMAL, "good.toml")
    write(tmp_path, MINIMAL + "colour = 1\n", "bad.toml")
    rows = {r["name"]: r for r in json.loads(model("list", "--json").stdout)["profiles"]}
    assert rows["good"]["weights_present"] is False and "colour" in rows["bad"]["error"]
    with pytest.raises(ProfileError, match="available in .*: bad, good"):
        load_profile("nope")

def test_check_reports_missing_health(fake_llm):
    server = fake_llm(health=False)
    result = model("check", "--url", server.url, "--model", "fake", "--timeout", "5")
    assert result.exit_code == 1
    assert "no vLLM server" in result.stderr and "/health" in result.stderr
    assert "appliance model serve PROFILE" in result.stderr  # the fix


def test_check_passes_and_reports_window_and_model(fake_llm, monkeypatch):
    server = fake_llm(max_model_len=4096)
    result = model("check", "--url", server.url, "--model", "fake", "--max-tokens", "1024")
    assert result.exit_code == 0, result.output
    assert "ok:" in result.stdout
    monkeypatch.setenv("APPLIANCE_LLM_URL", server.url)  # the proposer's own settings are the defaults
    monkeypatch.setenv("APPLIANCE_LLM_MODEL", "other")
    result = model("check", "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == 1 and not report["ok"] and report["max_tokens"] == 4096
    assert "'other' is not served" in report["problems"][0] and "fake" in report["problems"][0]
    [problem] = json.loads(model("check", "--json", "--model", "fake").stdout)["problems"]
    assert "max_tokens=4096 leaves too little of fake's 4096-token window" in problem


def test_check_takes_url_and_model_from_profile(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = write(tmp_path, MINIMAL + f"port = {port}\n", name="mine.toml")
    report = json.loads(model("check", "--profile", path, "--json", "--timeout", "2").stdout)
    assert report["url"] == f"http://127.0.0.1:{port}/v1" and report["model"] == "m"
    assert "appliance model serve mine starts one" in report["problems"][0]


# A real vLLM (CPU build, SmolLM2-135M-Instruct, 2,048-token window): scripts/test_llm_server.sh start prints the URL.
REAL_URL = os.environ.get("APPLIANCE_TEST_LLM_URL")
needs_real = pytest.mark.skipif(not REAL_URL, reason="set APPLIANCE_TEST_LLM_URL (scripts/test_llm_server.sh start)")


@pytest.mark.llm
@needs_real
def test_real_check():
    # 256: the proposer's tests' budget; the default 4096 would not fit the window, and check says so.
    result = model("check", "--url", REAL_URL, "--model", "smollm2-135m", "--max-tokens", "256", "--timeout", "120")
    assert result.exit_code == 0, result.output
    result = model("check", "--url", REAL_URL, "--model", "smollm2-135m")
    assert result.exit_code == 1 and "2048-token window" in result.stderr


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.llm
@needs_real
def test_real_serve_then_check():
    port = 8012
    profile = load_profile("smollm2-135m-cpu")
    if problems := preflight(profile):
        pytest.skip("; ".join(problems))
    if _healthy(port):
        pytest.skip(f"something already answers on port {port}")
    # `serve` execs vLLM in place, as under systemd; its own session lets the finally end vLLM and its engine.
    cmd = [sys.executable, "-c", "from appliance.model_cli import model_app; model_app()",
           "serve", "smollm2-135m-cpu", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=REPO, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log: list[bytes] = []
    threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True).start()  # a full pipe would stall vLLM
    try:
        deadline = time.monotonic() + 300  # vLLM's CPU start-up beside a loaded 2-core CI took over 120 s once
        while not _healthy(port):
            tail = b"".join(log[-40:]).decode(errors="replace")
            assert proc.poll() is None, f"serve exited with {proc.returncode}:\n{tail}"
            assert time.monotonic() < deadline, f"no /health within 300 s:\n{tail}"
            time.sleep(1)
        # The profile's own max_tokens: the bundled profile passes its own check with no flag.
        result = model("check", "--profile", "smollm2-135m-cpu", "--url", f"http://127.0.0.1:{port}/v1",
                       "--timeout", "120")
        assert result.exit_code == 0, result.output
    finally:
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    """TERM, a grace period, then KILL for whatever of the group is left (vLLM's engine process)."""
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass


def test_serve_stops_on_sigterm_during_start_up_with_its_engine_children(tmp_path):
    """vLLM may ignore a SIGTERM while its engine starts: `model serve --wait` stops the whole group anyway (SIGTERM,
    then SIGKILL after the grace), children included, and exits 128 + 15."""
    weights = tmp_path / "w"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    (weights / "model.safetensors").write_text("")
    fake = tmp_path / "python"  # a "vLLM" that ignores SIGTERM, starts an engine child and never answers /health
    fake.write_text(f"#!/bin/bash\n[ \"$1\" = -c ] && exit 0\ntrap '' TERM\nsleep 600 &\necho $! > {tmp_path}/child\n"
                    "while true; do sleep 0.2; done\n")
    fake.chmod(0o755)
    path = write(tmp_path, MINIMAL.replace("WEIGHTS", str(weights)) + f'python = "{fake}"\nport = 8391\n')
    proc = subprocess.Popen([sys.executable, "-m", "appliance", "model", "serve", str(path), "--wait"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / "child").is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    child = int((tmp_path / "child").read_text())
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=40)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert gone(child)  # the engine child is gone too


def gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether a process has ended within the time. A killed process whose parent died first stays a zombie until
    init reaps it, and init may be slow to (a container's): a zombie has ended."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def test_check_asks_for_the_profiles_max_tokens_unless_the_environment_sets_it(monkeypatch):
    args = ("check", "--profile", "smollm2-135m-cpu", "--url", "http://127.0.0.1:9/v1", "--json", "--timeout", "1")
    assert json.loads(model(*args).stdout)["max_tokens"] == load_profile("smollm2-135m-cpu").max_tokens == 512
    monkeypatch.setenv("APPLIANCE_LLM_MAX_TOKENS", "300")
    assert json.loads(model(*args).stdout)["max_tokens"] == 300
