"""Model profiles: which local open-weight model vLLM serves on the LLM GPU, and how (models/*.toml).

A profile is data, validated here; `vllm_command` turns it into the argv and environment of vLLM's OpenAI server,
and `check` asks a running server whether the proposer can use it. The appliance never downloads weights: a
profile names a local directory, and the server runs with the Hugging Face hub switched off."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from string import Template
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from appliance.config import DATA_ROOT
from appliance.errors import ApplianceError

DEFAULT_MODELS_DIR = "/srv/appliance/models"  # ${APPLIANCE_MODELS} when the variable is unset
# Set from the profile's fields (gpu) or forced (offline): a profile's env must not contradict them.
MANAGED_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
WEIGHT_MARKERS = ("config.json", "params.json")  # Hugging Face layout, or Mistral's native one (Devstral)


class ProfileError(ApplianceError):
    """A profile is missing, malformed, or names weights or an interpreter that are not there."""


def profiles_dir() -> Path:
    # Read at call time so tests and operators can point it elsewhere (the bundled models/ by default).
    return Path(os.environ.get("APPLIANCE_MODEL_PROFILES") or DATA_ROOT / "models")


def _expand(value: str) -> str:
    """`~` and `${APPLIANCE_MODELS}` only: a profile is meant to read the same on every appliance."""
    try:
        value = Template(value).substitute(APPLIANCE_MODELS=os.environ.get("APPLIANCE_MODELS") or DEFAULT_MODELS_DIR)
    except (KeyError, ValueError) as e:
        raise ValueError(f"unknown or malformed placeholder {e} in {value!r}; only ${{APPLIANCE_MODELS}} is known")
    return os.path.expanduser(value)


class VLLMArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)  # fraction of the LLM GPU vLLM may take
    max_model_len: int | None = Field(None, gt=0)  # prompt + reply window; None: the model's own
    tensor_parallel_size: int = Field(1, ge=1)
    quantization: str | None = None  # None: what the checkpoint's config says (FP8, MXFP4 ... are detected)
    dtype: str | None = None
    enforce_eager: bool = False  # skips CUDA-graph capture: slower decode, faster start; needed on CPU
    tool_call_parser: str | None = None  # also turns on --enable-auto-tool-choice
    reasoning_parser: str | None = None
    extra_args: list[str] = []  # passed verbatim, after everything else


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = ""  # the file's stem, set by load_profile
    path: str = ""  # the file, set by load_profile
    description: str
    weights_dir: str  # a local model directory (config.json + weights); ${APPLIANCE_MODELS} and ~ are expanded
    served_name: str = Field(min_length=1)  # what clients pass as `model` (APPLIANCE_LLM_MODEL)
    # Completion tokens the proposer should ask this model for (APPLIANCE_LLM_MAX_TOKENS): room for the prompt in
    # its window. None: the proposer's default (4096).
    max_tokens: int | None = Field(None, ge=1)
    device: Literal["cuda", "cpu"] = "cuda"
    gpu: int | list[int] = 0  # the LLM GPU (nvidia-smi numbering); one per tensor-parallel rank
    host: str = "127.0.0.1"  # the proposer is local; nothing else should reach the model
    port: int = Field(8000, ge=1, le=65535)
    python: str = ""  # interpreter that has vLLM (often its own venv); empty: the one running the appliance
    vllm: VLLMArgs = VLLMArgs()
    env: dict[str, str] = {}

    @field_validator("weights_dir", "python")
    @classmethod
    def _expand_paths(cls, v: str) -> str:
        return _expand(v) if v else v

    @field_validator("env")
    @classmethod
    def _no_managed_env(cls, v: dict[str, str]) -> dict[str, str]:
        if bad := sorted(set(v) & set(MANAGED_ENV)):
            raise ValueError(f"{', '.join(bad)} set by the appliance (from `gpu`, and offline always); remove them")
        return v

    @model_validator(mode="after")
    def _gpus_match_ranks(self) -> Profile:
        if isinstance(self.gpu, list) and len(self.gpu) != self.vllm.tensor_parallel_size:
            raise ValueError(f"gpu lists {len(self.gpu)} GPU(s) but vllm.tensor_parallel_size is "
                             f"{self.vllm.tensor_parallel_size}: give one GPU per rank")
        return self

    @property
    def gpus(self) -> list[int]:
        """An int is the first of tensor_parallel_size consecutive GPUs."""
        if isinstance(self.gpu, list):
            return self.gpu
        return list(range(self.gpu, self.gpu + self.vllm.tensor_parallel_size))

    @property
    def interpreter(self) -> str:
        return self.python or sys.executable

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


def available() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.toml"))


def load_profile(name_or_path: str | Path) -> Profile:
    """A bundled profile by name (models/NAME.toml), or any profile file by path."""
    text = str(name_or_path)
    if text.endswith(".toml") or os.sep in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise ProfileError(f"{path}: no such profile file")
    else:
        path = profiles_dir() / f"{text}.toml"
        if not path.is_file():
            raise ProfileError(f"unknown model profile {text!r}; available in {profiles_dir()}: "
                               f"{', '.join(available()) or 'none'}")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ProfileError(f"{path}: {e}") from None
    for key in ("name", "path"):
        if key in data:
            raise ProfileError(f"{path}: `{key}` is not a profile field (it comes from the file)")
    try:
        return Profile(**data, name=path.stem, path=str(path))
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'profile'}: {err['msg']}" for err in e.errors())
        raise ProfileError(f"{path}: {problems}") from None


def vllm_command(profile: Profile) -> tuple[list[str], dict[str, str]]:
    """vLLM's OpenAI server for this profile: argv, and the variables to set on top of the caller's environment."""
    v = profile.vllm
    argv = [profile.interpreter, "-m", "vllm.entrypoints.openai.api_server",  # the `vllm` script may not exist
            "--model", profile.weights_dir, "--served-model-name", profile.served_name,
            "--host", profile.host, "--port", str(profile.port),
            "--tensor-parallel-size", str(v.tensor_parallel_size)]
    if v.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", f"{v.gpu_memory_utilization:g}"]
    if v.max_model_len is not None:
        argv += ["--max-model-len", str(v.max_model_len)]
    for flag, value in (("--quantization", v.quantization), ("--dtype", v.dtype),
                        ("--reasoning-parser", v.reasoning_parser)):
        if value:
            argv += [flag, value]
    if v.tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", v.tool_call_parser]
    if v.enforce_eager:
        argv.append("--enforce-eager")
    argv += v.extra_args
    # vLLM's usage statistics phone home; there is no home to phone (a profile may still say otherwise).
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", **profile.env}
    env.update({
        # Air-gapped: never reach for the hub; fail fast instead of hanging on a download.
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        # The LLM must only ever see its own GPU(s): the others belong to the evaluation workers. PCI order makes
        # the index mean what nvidia-smi shows (CUDA's default order is fastest-first). CPU: no GPU at all.
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, profile.gpus)) if profile.device == "cuda" else "",
    })
    return argv, env


def weights_problem(profile: Profile) -> str | None:
    """Why the profile's weights directory cannot be served, with the fix; None when it looks complete."""
    weights = Path(profile.weights_dir)
    if not weights.is_dir():
        return (f"weights directory {weights} does not exist: copy the model's directory there (the appliance never "
                f"downloads), or set APPLIANCE_MODELS / weights_dir in {profile.path}")
    if not any((weights / marker).is_file() for marker in WEIGHT_MARKERS):
        return (f"{weights} has no config.json: it is not a complete model directory (copy the whole Hugging Face "
                f"snapshot, not just the weight files)")
    return None


def preflight(profile: Profile) -> list[str]:
    """What would make `serve` fail at once, each with its fix; empty when the weights and vLLM are there."""
    problems = [p] if (p := weights_problem(profile)) else []
    python = shutil.which(profile.interpreter)  # a path, or a name on PATH
    if python is None:
        problems.append(f"interpreter {profile.interpreter} is not an executable: set `python` in {profile.path} "
                        f"to the Python of the venv that has vLLM")
    elif subprocess.run([python, "-c", "import importlib.util as u, sys; sys.exit(not u.find_spec('vllm'))"],
                        capture_output=True).returncode:  # find_spec: no import, so this stays quick
        problems.append(f"vLLM is not installed for {python}: install it there from the wheelhouse, or set `python` "
                        f"in {profile.path} to the interpreter of vLLM's venv")
    return problems


def check(base_url: str, model: str, max_tokens: int = 4096, api_key: str = "EMPTY",
          timeout_s: float = 60.0) -> list[str]:
    """What stops the proposer from using this server (/health, /v1/models, the window, a test completion), each
    with its fix; empty when all is well. The proposer's own check, so both agree on what "working" means."""
    from appliance.proposers.llm import LLMSettings, check_endpoint

    return check_endpoint(LLMSettings(base_url=base_url, model=model, api_key=api_key, max_tokens=max_tokens,
                                      timeout_s=timeout_s, max_retries=0))
