"""Where the appliance keeps its state, and how the user overrides it (flags beat environment beat defaults)."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# The suite, baselines and model profiles: in a checkout, beside the package; in a wheel install, where the wheel's
# data files went (pyproject.toml [tool.setuptools.data-files]).
DATA_ROOT = REPO_ROOT if (REPO_ROOT / "benchmarks/tasks").is_dir() else Path(sys.prefix) / "share/appliance"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _positive_float(name: str) -> float | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not (number > 0 and math.isfinite(number)):
        from appliance.errors import ConfigError

        raise ConfigError(f"{name}={value!r}: expected a positive number")
    return number


@dataclass
class Settings:
    home: Path  # APPLIANCE_HOME: database, job directories
    db_url: str  # any SQLAlchemy URL; SQLite file under home by default
    suite_dir: Path  # the bundled task suite (benchmarks/tasks)
    unsafe_no_jail: bool  # development only: run harness processes without bubblewrap
    llm_url: str | None = None  # APPLIANCE_LLM_URL: vLLM's OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1
    llm_model: str = ""  # APPLIANCE_LLM_MODEL: the served model name
    llm_api_key: str = "EMPTY"  # APPLIANCE_LLM_API_KEY
    llm_max_tokens: int = 4096  # APPLIANCE_LLM_MAX_TOKENS: completion tokens per request (prompt + this <= context)
    llm_max_tokens_set: bool = False  # whether the environment set it (a model profile's max_tokens yields to it)
    # APPLIANCE_EXECUTOR: where evaluations run: local (in this process; the controller always uses worker processes)
    # | workers (one worker process per GPU) | ray://HOST:PORT | auto | HOST:PORT (Ray)
    executor: str = "local"
    # APPLIANCE_JOBS_DIR: evaluations' job folders (sources and records; inputs and outputs live in buffers the
    # referee shares with the kernel server, never in files). Default: APPLIANCE_HOME/jobs.
    jobs: Path | None = None
    # APPLIANCE_HOST_MEMORY_GIB: host memory this host's evaluations in flight may hold, in all (referee and server
    # processes; on the CPU, their shared buffers). Default: 75% of MemTotal (appliance/evaluation/host_memory.py).
    host_memory_gib: float | None = None
    # The jail's limits per jailed process (sandbox/jail.py), for every evaluation of this host: `eval`, searches,
    # worker processes and Ray actors alike. APPLIANCE_JAIL_MEMORY_GIB (memory cgroup), APPLIANCE_JAIL_PIDS
    # (processes + threads), APPLIANCE_JAIL_DISK_GIB (what a job's folders may hold), APPLIANCE_JAIL_CPU_SECONDS
    # (CPU time per process; default: every core for the whole timeout).
    jail_memory_gib: float = 32.0
    jail_pids: int = 1024
    jail_disk_gib: float = 16.0
    jail_cpu_seconds: int | None = None
    # APPLIANCE_UNSAFE_NO_MEMORY_LIMIT=1: OPERATOR OPT-OUT. Evaluate where no memory limit can be enforced (a memory
    # bomb can then take the host into a global OOM); every verdict is stored with memory_limited = false.
    unsafe_no_memory_limit: bool = False
    # APPLIANCE_LLM_GPU: the GPU index vLLM serves from, which never evaluates (None: not set).
    llm_gpu: str | None = None
    # APPLIANCE_CONTROLLER_STALE_S: a run whose controller's heartbeat is older than this is taken over (an LLM
    # request may hold a loop for minutes).
    controller_stale_s: float = 600.0
    # APPLIANCE_WORKER_TIMEOUT: seconds to wait for an evaluation worker to start and answer.
    worker_timeout_s: float = 120.0
    # APPLIANCE_RAY_PLACEMENT_TIMEOUT: seconds to wait for a Ray actor to be placed on a node with a free GPU.
    ray_placement_timeout_s: float = 300.0

    @classmethod
    def load(cls, db_url: str | None = None) -> Settings:
        home = Path(os.environ.get("APPLIANCE_HOME") or Path.home() / ".local/share/appliance")
        url = db_url or os.environ.get("APPLIANCE_DB_URL") or f"sqlite:///{home / 'appliance.db'}"
        suite = Path(os.environ.get("APPLIANCE_SUITE") or DATA_ROOT / "benchmarks/tasks")
        return cls(home=home, db_url=url, suite_dir=suite,
                   unsafe_no_jail=_truthy(os.environ.get("APPLIANCE_UNSAFE_NO_JAIL")),
                   llm_url=os.environ.get("APPLIANCE_LLM_URL") or None,
                   llm_model=os.environ.get("APPLIANCE_LLM_MODEL", ""),
                   llm_api_key=os.environ.get("APPLIANCE_LLM_API_KEY", "EMPTY"),
                   llm_max_tokens=int(os.environ.get("APPLIANCE_LLM_MAX_TOKENS", "4096")),
                   llm_max_tokens_set="APPLIANCE_LLM_MAX_TOKENS" in os.environ,
                   executor=os.environ.get("APPLIANCE_EXECUTOR") or "local",
                   jobs=Path(os.environ["APPLIANCE_JOBS_DIR"]) if os.environ.get("APPLIANCE_JOBS_DIR") else None,
                   host_memory_gib=_positive_float("APPLIANCE_HOST_MEMORY_GIB"),
                   jail_memory_gib=_positive_float("APPLIANCE_JAIL_MEMORY_GIB") or 32.0,
                   jail_pids=int(_positive_float("APPLIANCE_JAIL_PIDS") or 1024),
                   jail_disk_gib=_positive_float("APPLIANCE_JAIL_DISK_GIB") or 16.0,
                   jail_cpu_seconds=int(_positive_float("APPLIANCE_JAIL_CPU_SECONDS") or 0) or None,
                   unsafe_no_memory_limit=_truthy(os.environ.get("APPLIANCE_UNSAFE_NO_MEMORY_LIMIT")),
                   llm_gpu=(os.environ["APPLIANCE_LLM_GPU"].strip() if "APPLIANCE_LLM_GPU" in os.environ else None),
                   controller_stale_s=_positive_float("APPLIANCE_CONTROLLER_STALE_S") or 600.0,
                   worker_timeout_s=_positive_float("APPLIANCE_WORKER_TIMEOUT") or 120.0,
                   ray_placement_timeout_s=_positive_float("APPLIANCE_RAY_PLACEMENT_TIMEOUT") or 300.0)

    def jail(self, gpu: int | None = None, unsafe_no_jail: bool = False, **overrides):
        """The jail every evaluation of this host uses, with this host's limits (flags may override them)."""
        from sandbox.jail import Jail

        options = dict(memory_bytes=int(self.jail_memory_gib * 2**30), pids_max=self.jail_pids,
                       disk_bytes=int(self.jail_disk_gib * 2**30), cpu_seconds=self.jail_cpu_seconds,
                       unsafe_no_memory_limit=self.unsafe_no_memory_limit)
        return Jail(unsafe_no_jail=unsafe_no_jail, gpu=gpu, **options | overrides)

    @property
    def host_memory_bytes(self) -> int | None:
        return None if self.host_memory_gib is None else int(self.host_memory_gib * 2**30)

    @property
    def jobs_dir(self) -> Path:
        """The job folders' parent, made if missing; refused when another user owns it or may write to it (on a
        shared tmpfs such as /dev/shm someone else could have made it first, and swap a job's files)."""
        from appliance.errors import InfrastructureError

        path = self.jobs or self.home / "jobs"
        path.mkdir(parents=True, exist_ok=True)
        st = path.stat()
        if st.st_uid != os.geteuid() or st.st_mode & 0o002:
            raise InfrastructureError(f"{path} (the job folders) is owned by uid {st.st_uid} or writable by every "
                                      f"user (mode {st.st_mode & 0o7777:o}): another user could swap an evaluation's "
                                      "files. Remove it, or set APPLIANCE_JOBS_DIR to a folder of this user's")
        return path
