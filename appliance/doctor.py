"""`appliance doctor`: what this host provides for jailed evaluation, and what is missing with how to fix it."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True  # a failed required check means candidates cannot be evaluated here


def run_checks(db_url: str, llm_url: str | None = None, llm_model: str = "", metrics_port: int | None = None,
               jobs_dir: Path | None = None, host_memory_bytes: int | None = None, jail=None) -> list[Check]:
    from sandbox.jail import Jail

    jail = jail or Jail()
    checks = [_bwrap(jail), _seccomp(), _jail(jail), _cgroups(jail), _userns(jail), _torch(), _gpu(), _gpu_roles(llm_url),
              _database(db_url), _llm(llm_url, llm_model)]
    if jobs_dir is not None:
        checks += [_jobs_dir(jobs_dir), _host_memory(jobs_dir, host_memory_bytes)]
    if metrics_port:
        checks.append(_metrics_port(metrics_port))
    return checks


def policy(jail=None) -> dict:
    """The jail's policy as the value every run renders into bubblewrap's arguments (sandbox/policy.py)."""
    from sandbox.jail import Jail

    return (jail or Jail()).policy().as_dict()


def policy_lines(jail=None) -> list[str]:
    from sandbox.jail import Jail
    from sandbox.policy import describe

    return describe((jail or Jail()).policy())


def _bwrap(jail) -> Check:
    path = jail.bwrap
    if not path or not os.access(path, os.X_OK):
        return Check("bubblewrap", False, "bwrap not found", "apt-get install bubblewrap (or set APPLIANCE_BWRAP)")
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip()
    return Check("bubblewrap", True, f"{path} ({version})")


def _seccomp() -> Check:
    from sandbox.seccomp import SeccompUnavailable, bpf_file

    try:
        os.close(bpf_file())
    except SeccompUnavailable as e:
        return Check("seccomp", False, str(e), "apt-get install libseccomp2; pip install pyseccomp")
    return Check("seccomp", True, "libseccomp filter compiles (pyseccomp)")


def _jail(jail) -> Check:
    from sandbox.jail import JailUnavailable

    try:
        jail.check()
    except JailUnavailable as e:
        return Check("jail", False, str(e), "see the message; `appliance eval --unsafe-no-jail` is for development only")
    who = "an unprivileged host uid of its own (the worker is root)" if jail.host_uid_mode else \
        "uid 65534 in a user namespace"
    return Check("jail", True, f"a test process ran inside bwrap with the seccomp filter, as {who}")


def _cgroups(jail) -> Check:
    """No candidate runs without a memory limit, unless the operator opted out (then a loud warning)."""
    from sandbox.cgroup import CgroupUnavailable, probe

    try:
        return Check("memory limit", True, probe())
    except (CgroupUnavailable, OSError) as e:
        if jail.unsafe_no_memory_limit:
            return Check("memory limit", False, f"{e}; UNSAFE: APPLIANCE_UNSAFE_NO_MEMORY_LIMIT is set, so candidates "
                         "run WITHOUT a memory limit (a memory bomb can take the host into a global OOM); every "
                         "verdict is stored with memory_limited = false",
                         "run the worker as root, or under systemd with Delegate=yes", required=False)
        return Check("memory limit", False, f"{e}: no memory limit can be enforced, so no candidate runs here",
                     "run the worker as root, or under systemd with Delegate=yes (cgroup v2 with memory delegated, "
                     "or cgroup v1); operator opt-out: APPLIANCE_UNSAFE_NO_MEMORY_LIMIT=1")


def _userns(jail) -> Check:
    path = Path("/proc/sys/user/max_user_namespaces")
    value = path.read_text().strip() if path.exists() else "unknown"
    if jail.host_uid_mode:
        return Check("user namespaces", True, f"max_user_namespaces={value} (not needed: the worker is root, each jail "
                     "runs as a host uid of its own)", required=False)
    ok = value != "0"
    return Check("user namespaces", ok, f"max_user_namespaces={value}", "" if ok else
                 "sysctl user.max_user_namespaces=15000")


def _torch() -> Check:
    try:
        import torch
        import triton
    except ImportError as e:
        return Check("torch/triton", False, str(e), "pip install torch triton (from the wheelhouse offline)")
    return Check("torch/triton", True, f"torch {torch.__version__}, triton {triton.__version__}, "
                                       f"Python {platform.python_version()}")


def _gpu_nodes() -> list[str]:
    return sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*"))


def _gpu() -> Check:
    nodes = _gpu_nodes()
    if not nodes:
        return Check("GPU", True, "no NVIDIA GPU device nodes: evaluations run on the CPU (Triton interpreter), "
                                  "timings labelled CPU", required=False)
    driver = Path("/proc/driver/nvidia/version")
    text = driver.read_text().splitlines()[0] if driver.exists() else "driver version unknown"
    import torch

    cuda = torch.cuda.is_available()
    return Check("GPU", cuda, f"{', '.join(nodes)}; {text.strip()}; torch sees CUDA: {cuda}",
                 "" if cuda else "install a CUDA build of torch matching the driver", required=False)


def _jobs_dir(path: Path, gpu_host: bool | None = None) -> Check:
    """Where job folders go: the referee and the kernel server share their buffers through memory, so the job
    folders hold only the task, the candidate's source and small records; any file system does."""
    return Check("jobs dir", True, f"{path} (task and candidate sources, records; inputs and outputs never touch it)",
                 required=False)


def _host_memory(jobs_dir: Path, total_bytes: int | None) -> Check:
    """The host memory evaluations may hold (appliance/evaluation/host_memory.py)."""
    from appliance.evaluation.host_memory import HostMemory

    budget = HostMemory(total_bytes).budget()
    source = "APPLIANCE_HOST_MEMORY_GIB" if total_bytes else "75% of MemTotal"
    if budget is None:
        return Check("host memory", True, "MemTotal unreadable: evaluations are bounded by their number alone",
                     required=False)
    return Check("host memory", True, f"evaluations in flight may hold {budget / 2**30:.0f} GiB ({source}; split "
                 "between the GPUs)", required=False)


def _database(url: str) -> Check:
    from appliance.db.store import Store, display_url, schema_version

    shown = display_url(url)  # doctor output ends up in tickets and logs

    try:
        store = Store.open(url)
        version = schema_version(store.engine)
        store.close()
    except Exception as e:  # noqa: BLE001 - any failure here is the finding
        return Check("database", False, f"{shown}: {e}", "check --db / APPLIANCE_DB_URL and write permissions")
    return Check("database", True, f"{shown} (schema {version})")


def as_json(checks: list[Check], jail=None) -> dict:
    return {"ok": all(c.ok or not c.required for c in checks), "checks": [asdict(c) for c in checks],
            "policy": policy(jail)}


def _gpu_roles(llm_url: str | None) -> Check:
    """Which GPU serves the model and which evaluate: APPLIANCE_LLM_GPU (default 0 when a local LLM is configured)
    and every other GPU evaluates."""
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        count = 0
    if count == 0:
        return Check("GPU roles", True, "no GPU: the LLM (if any) is remote or on the CPU; evaluations on the CPU",
                     required=False)
    from appliance.config import Settings

    llm_gpu = Settings.load().llm_gpu
    if llm_gpu is None:
        llm_gpu = "0" if llm_url and "127.0.0.1" in llm_url else ""
    names = [torch.cuda.get_device_name(i) for i in range(count)]
    roles = [f"GPU {i} ({name}): {'LLM (vLLM)' if str(i) == llm_gpu else 'evaluation'}"
             for i, name in enumerate(names)]
    evaluation = [i for i in range(count) if str(i) != llm_gpu]
    ok = bool(evaluation)
    return Check("GPU roles", ok, "; ".join(roles), "" if ok else
                 "every GPU serves the LLM: leave at least one for evaluation (APPLIANCE_LLM_GPU)", required=False)


def _llm(url: str | None, model: str) -> Check:
    if not url:
        return Check("LLM endpoint", True, "APPLIANCE_LLM_URL not set: `optimize` uses the tuning proposer",
                     required=False)
    from appliance.proposers.llm import LLMSettings, check_endpoint

    problems = check_endpoint(LLMSettings(base_url=url, model=model, timeout_s=20, max_tokens=16))
    if problems:
        return Check("LLM endpoint", False, f"{url}: {problems[0]}",
                     "start it: `appliance model serve PROFILE` (or systemctl start appliance-vllm); "
                     "`appliance model check` says more")
    return Check("LLM endpoint", True, f"{url} serves {model!r} and completes a test prompt")


def _metrics_port(port: int) -> Check:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as e:
            return Check("metrics port", False, f"port {port} is taken ({e.strerror}): a running controller, or "
                         "another service", "stop the other service or use `appliance controller --metrics-port`",
                         required=False)
    return Check("metrics port", True, f"port {port} is free for `appliance controller`", required=False)
