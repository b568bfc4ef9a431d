"""Where a run's evaluations happen: one pipeline per evaluation GPU (or one for the CPU), in this process, in worker
processes (appliance/worker.py) or on a Ray cluster (appliance/ray_executor.py); and, on a cluster, the CPU-only
nodes that check candidates build before a GPU sees them. The command line and the controller ask here."""

from __future__ import annotations

from typing import Callable

from appliance.config import Settings
from appliance.errors import ApplianceError
from appliance.evaluation.host_memory import HostMemory
from appliance.evaluation.pipeline import EvalSettings, Pipeline, default_slots, resolve_device
from appliance.proposers.mix import parse_names
from appliance.search.loop import OptimizeConfig

UNSAFE_WARNING = "[bold red]UNSAFE: --unsafe-no-jail: candidates run WITHOUT the jail.[/]"


def on_ray(settings: Settings) -> bool:
    return settings.executor not in ("local", "workers")


def pipelines(settings: Settings, config: OptimizeConfig, gpus: str | None, unsafe: bool,
              say: Callable[[str], None], supervisor=None) -> list:
    """One pipeline (worker) per evaluation GPU, or one for the CPU; each with `config.workers` evaluations in flight.
    With a `supervisor` (the controller) or executor `workers`: each a worker process (appliance/worker.py); with a
    Ray executor: one per GPU of the Ray cluster (appliance/ray_executor.py); else in this process. `say` gets
    lines for the operator (rich markup)."""
    ray = on_ray(settings)
    if ray:
        from appliance import ray_executor

        if gpus:
            raise ApplianceError("--gpus is for local workers; on Ray each worker host says which GPUs it lends "
                                 "(`ray start --num-gpus`, CUDA_VISIBLE_DEVICES)")
        dev = ray_executor.cluster_device(settings.executor, config.device)  # the cluster's GPUs, not this host's
    else:
        dev = resolve_device(config.device)
    indices = _evaluation_gpus(settings, gpus) if dev == "cuda" and not ray else [None]
    if config.workers:
        slots = config.workers
    elif ray:
        slots = ray_executor.default_slots_on_cluster(settings.executor, dev)  # from the GPU hosts, not this one
    else:
        slots = default_slots(0 if dev != "cuda" else len(indices))
    if unsafe:
        say(UNSAFE_WARNING)
    evaluation = EvalSettings(device=dev, mode=config.mode,
                              baselines=("eager", "compile") if dev == "cuda" else ("eager",),
                              timing_budget_s=config.timing_budget_s, jobs_dir=settings.jobs_dir,
                              state_dir=settings.home, host_memory_bytes=settings.host_memory_bytes,
                              profile=config.profile and dev == "cuda", reuse_inputs=True)
    if ray:
        return ray_executor.ray_pipelines(settings.executor, evaluation, slots, unsafe)
    if supervisor is None and settings.executor == "workers":
        from appliance.worker import WorkerSupervisor

        # Not persistent: the workers it starts stop when the run closes its pipelines.
        supervisor = WorkerSupervisor(settings.home, log=lambda line: say(f"workers: {line}"))
    if supervisor is not None:
        return supervisor.pipelines(indices, evaluation, slots, unsafe)
    memory = HostMemory(settings.host_memory_bytes)  # this process's evaluations, on every GPU it uses
    return [Pipeline(settings.jail(g, unsafe), evaluation, slots=slots, host_memory=memory) for g in indices]


def _evaluation_gpus(settings: Settings, gpus: str | None) -> list[int]:
    """--gpus, else every visible GPU but the one vLLM serves from (APPLIANCE_LLM_GPU)."""
    if gpus:
        return [int(g) for g in gpus.split(",")]
    import torch

    serving = settings.llm_gpu or ""
    indices = [i for i in range(torch.cuda.device_count()) if str(i) != serving]
    if not indices:
        raise ApplianceError(f"no evaluation GPU: the only GPU is the LLM's (APPLIANCE_LLM_GPU={serving}); "
                             "pass --gpus or --device cpu")
    return indices


def compile_screens(settings: Settings, config: OptimizeConfig, pipelines: list, unsafe: bool,
                    say: Callable[[str], None]) -> list:
    """Compile-only checks on the Ray cluster's CPU-only nodes (evaluation/compile_screen.py), for candidates that
    may not build (the LLM's) on a cluster whose evaluation workers hold GPUs; none otherwise."""
    on_gpus = [p for p in pipelines if on_ray(settings) and p.gpu is not None]
    if parse_names(config.proposer) == ["tune"] or not on_gpus:
        return []
    from appliance import ray_executor

    try:
        archs = {p.arch() for p in on_gpus}
        if len(archs) != 1:  # kernels for one architecture may not build for another: no one answer to check
            say(f"compile-only checks are off: the GPU workers differ in architecture ({sorted(archs)})")
            return []
        arch = archs.pop()
        screens = ray_executor.compile_screens(settings.executor, arch, unsafe) if arch else []
    except Exception as e:  # noqa: BLE001 - without screening a run is slower, never wrong
        say(f"compile-only checks on CPU-only nodes are off: {type(e).__name__}: {e}")
        return []
    if screens:
        say(f"{len(screens)} CPU-only node(s) check that candidates build for sm_{arch} before the GPUs see them")
    return screens
