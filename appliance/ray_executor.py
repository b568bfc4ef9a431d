"""Evaluation workers on a Ray cluster (`--executor ray://HOST:PORT`, `auto`, or a GCS address HOST:PORT).

Each worker is a Ray actor, `EvaluationWorker`, that holds one GPU of some node (`num_gpus=1`; one CPU on a CPU-only
cluster) and runs a plain local `Pipeline` there: the same jail and harness as a local worker. The controller keeps
one `RayPipeline` per actor; the search loop uses it like a local `Pipeline`. Candidates and verdicts travel through
Ray (the task's and the candidate's text in, an `Outcome` back); the run state stays in the controller's database.

Faults: an actor or node that dies mid-evaluation fails the evaluations it had in flight with InfrastructureError
(the loop re-queues such a candidate once, then records an infrastructure failure). Ray restarts the actor
(`max_restarts=-1`) on whatever node has room, a node that comes back included; until it is placed, an evaluation
sent to it waits up to APPLIANCE_RAY_PLACEMENT_TIMEOUT seconds (default 300) and then fails the same way.

Ray is optional (`pip install '.[ray]'`): it is imported only here, and only when a Ray executor is asked for.
Every host needs the same Python, the same Ray and the appliance installed (the wheelhouse), because the jail on a
worker mounts that worker's own Python installation and `sandbox` package.
"""

from __future__ import annotations

import dataclasses
import socket
import tempfile
import time
from pathlib import Path

from appliance.errors import EvaluationCancelled, InfrastructureError, TaskError
from appliance.evaluation.compile_screen import SCREEN_TIMEOUT_S
from appliance.evaluation.job_folders import JobFolder, remove_tree
from appliance.evaluation.pipeline import (EvalSettings, Outcome, Pipeline, SentThreshold, default_slots,
                                          evaluate_sent, sent_threshold)
from appliance.tasks import RebuiltTasks, Task, task_files


def _ray():
    try:
        import ray
    except ImportError:
        raise InfrastructureError("--executor needs Ray on this host: pip install 'kernel-optimizer-appliance[ray]' "
                                  "(or install the wheelhouse built with the ray extra)") from None
    return ray


def connect(address: str) -> None:
    """Join the cluster as a driver (once per process)."""
    ray = _ray()
    if ray.is_initialized():
        return
    try:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise InfrastructureError(f"cannot join the Ray cluster at {address!r}: {e}. Is the head running "
                                  "(`ray status` on it)?") from None


def cluster_device(address: str, device: str) -> str:
    """`auto` on Ray means the cluster's GPUs, not this host's: the controller may have none."""
    connect(address)
    if device != "auto":
        return device
    return "cuda" if _ray().cluster_resources().get("GPU", 0) >= 1 else "cpu"


def _close_actor(actor) -> None:
    """The actor's own clean-up (its files on its node), then the actor."""
    ray = _ray()
    try:
        ray.get(actor.close.remote(), timeout=30)
    except Exception:  # noqa: BLE001 - a dead or unplaced actor has nothing to clean; kill it all the same
        pass
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


def default_slots_on_cluster(address: str, device: str) -> int:
    """Evaluations in flight per worker when the user does not say: `default_slots` of each GPU host, from its own
    cores and GPUs (not the controller's), the smallest over the cluster's GPU hosts, since the loop gives every worker
    the same number."""
    connect(address)
    return slots_for_nodes(_ray().nodes(), device)


def slots_for_nodes(nodes: list[dict], device: str) -> int:
    """default_slots_on_cluster for `ray.nodes()`' records."""
    if device != "cuda":
        return default_slots(0)
    hosts = [n.get("Resources", {}) for n in nodes if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) >= 1]
    return min((default_slots(int(r["GPU"]), int(r.get("CPU", 0)) or None) for r in hosts), default=default_slots(1))


def ray_pipelines(address: str, settings: EvalSettings, slots: int, unsafe: bool) -> list[RayPipeline]:
    """One worker per GPU of the cluster; on a CPU-only cluster (CI, development) one per node."""
    ray = _ray()
    connect(address)
    if settings.device == "cuda":
        count = int(ray.cluster_resources().get("GPU", 0))
        if count == 0:
            raise InfrastructureError(f"the Ray cluster at {address!r} has no GPU: join a GPU host "
                                      "(systemd/appliance-ray-worker.service) or pass --device cpu")
    else:
        count = sum(1 for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1)
        if count == 0:
            raise InfrastructureError(f"the Ray cluster at {address!r} has no node with a free CPU")
    actor = ray.remote(EvaluationWorker).options(
        num_gpus=1 if settings.device == "cuda" else 0,
        num_cpus=0 if settings.device == "cuda" else 1,  # GPUs are what a GPU worker waits for
        max_concurrency=slots + 1,  # `slots` evaluations (each after a ping), and a cancel_unmeasured beside them
        max_restarts=-1,  # a lost actor comes back on any node with room, for as long as the run lasts
        max_task_retries=0,  # an evaluation lost with its node is the loop's to re-queue, not Ray's to repeat
        scheduling_strategy="SPREAD",
    )
    return [RayPipeline(actor.remote(settings, slots, unsafe), i, settings, slots, unsafe) for i in range(count)]



class RayPipeline:
    """An Evaluator (evaluation/evaluator.py) on the controller whose evaluations run in one Ray actor. Thread-safe: `slots` loop
    threads call `evaluate` at once, and the actor runs their calls concurrently."""

    def __init__(self, actor, index: int, settings: EvalSettings, slots: int, unsafe: bool):
        self.actor, self.index, self.settings, self.slots = actor, index, settings, max(1, slots)
        self.gpu, self.unsafe_no_jail = (index if settings.device == "cuda" else None), unsafe
        # Set by the loop. The actor cannot ask it mid-evaluation: it gets the predicate's threshold (speedup vs
        # eager a passing candidate must beat to be profiled) with each evaluation, when it has one.
        self.profile_if = None
        from appliance.config import Settings

        self.placement_timeout_s = Settings.load().ray_placement_timeout_s

    def evaluate(self, task: Task, candidate_path: str | Path) -> Outcome:
        ray = _ray()
        from ray.exceptions import GetTimeoutError, RayError, RayTaskError

        candidate_path = Path(candidate_path)
        if not candidate_path.is_file():
            raise TaskError(str(candidate_path), "no such candidate file")
        files = task_files(task)
        try:
            self._wait_until_placed()
            result = ray.get(self.actor.evaluate.remote(files, candidate_path.read_text(errors="replace"),
                                                        str(candidate_path), sent_threshold(self.profile_if)))
        except RayTaskError:
            raise  # a bug of ours on the worker: as loud as it would be in a local pipeline
        except GetTimeoutError:
            raise InfrastructureError(f"Ray worker {self.index} found no node with room within "
                                      f"{self.placement_timeout_s:.0f} s") from None
        except RayError as e:  # the actor, its process or its node died (RayActorError, NodeDiedError, ...)
            first = (str(e).strip().splitlines() or [""])[0][:300]
            raise InfrastructureError(f"Ray worker {self.index} was lost mid-evaluation ({type(e).__name__}: "
                                      f"{first}); Ray restarts it on a node with room") from None
        if isinstance(result, Outcome):
            return result
        # Our own errors come back as values: exceptions with extra constructor arguments do not survive pickling.
        if "task_error" in result:
            raise TaskError(*result["task_error"])
        if "cancelled" in result:
            raise EvaluationCancelled(f"Ray worker {self.index}: {result['cancelled']}")
        raise InfrastructureError(f"Ray worker {self.index} ({result.get('host')}): {result['infrastructure_error']}")

    def arch(self) -> int | None:
        """The worker's GPU architecture (90 for sm_90), for compile-only work on CPU-only nodes."""
        self._wait_until_placed()
        return _ray().get(self.actor.arch.remote())

    def prepare(self, task: Task) -> None:
        """Have the worker prepare the task's inputs now; what goes wrong shows again in the first evaluation."""
        ray = _ray()
        try:
            self._wait_until_placed()
            ray.get(self.actor.prepare.remote(task_files(task)))
        except ray.exceptions.RayError:
            pass

    def _wait_until_placed(self) -> None:
        """A cheap call before each evaluation: it waits for the actor to be placed (after a restart, maybe on
        another node) without putting a timeout on the evaluation itself. Calls to an actor that is restarting fail
        at once (ActorUnavailableError): nothing was sent yet, so keep asking until the deadline."""
        ray = _ray()
        unavailable = getattr(ray.exceptions, "ActorUnavailableError", ())  # Ray >= 2.22; older Ray waits by itself
        deadline = time.monotonic() + self.placement_timeout_s
        while True:
            try:
                ray.get(self.actor.ready.remote(), timeout=max(1.0, deadline - time.monotonic()))
                return
            except unavailable:
                if time.monotonic() > deadline:
                    raise ray.exceptions.GetTimeoutError("still restarting") from None
                time.sleep(1.0)

    def cancel_unmeasured(self) -> int:
        ray = _ray()
        try:
            return ray.get(self.actor.cancel_unmeasured.remote(), timeout=30)
        except ray.exceptions.RayError:
            return 0  # a lost actor's evaluations fail on their own

    def close(self) -> None:
        """Remove the worker's kept inputs and free its GPU (the next run starts its own workers)."""
        _close_actor(self.actor)


class EvaluationWorker:
    """The Ray actor: a local Pipeline on the node Ray placed it on, with the GPU Ray assigned to it."""

    def __init__(self, settings: EvalSettings, slots: int, unsafe: bool):
        import ray

        from appliance.config import Settings

        gpu = int(ray.get_gpu_ids()[0]) if settings.device == "cuda" else None
        # This host's own directories (APPLIANCE_HOME of the worker's unit), not the controller's paths.
        host = Settings.load()
        home = host.home
        local = dataclasses.replace(settings, jobs_dir=host.jobs_dir, state_dir=home,
                                    host_memory_bytes=host.host_memory_bytes)
        self.pipeline = Pipeline(host.jail(gpu, unsafe), local, slots)  # this host's jail limits
        self.profile_if = self.pipeline.profile_if = SentThreshold()
        self.host = f"{socket.gethostname()}/{ray.get_runtime_context().get_node_id()[:12]}"
        self.folder = JobFolder(local.jobs_dir)  # the sources sent here (the pipeline has a folder of its own)
        self.dir = self.folder.path
        self.tasks = RebuiltTasks(self.dir / "task")

    def ready(self) -> str:
        return self.host

    def arch(self) -> int | None:
        """The GPU's compute capability as one number (90 for the H200), from NVML: no CUDA context here."""
        if self.pipeline.jail.gpu is None:
            return None
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(self.pipeline.jail.gpu)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return 10 * major + minor

    def evaluate(self, files: dict, source: str, display_path: str, profile_above: float | None = None
                 ) -> Outcome | dict:
        self.profile_if.set(profile_above, files)
        try:
            outcome = evaluate_sent(self.pipeline, self.tasks, files, source, display_path, self.dir)
        except EvaluationCancelled as e:
            return {"cancelled": str(e), "host": self.host}
        except TaskError as e:
            return {"task_error": [e.path, e.message, e.line], "host": self.host}
        except InfrastructureError as e:
            return {"infrastructure_error": str(e), "host": self.host}
        outcome.details["host"] = self.host
        return outcome

    def cancel_unmeasured(self) -> int:
        return self.pipeline.cancel_unmeasured()

    def prepare(self, files: dict) -> None:
        try:
            self.pipeline.prepare(self.tasks.get(files))
        except (TaskError, InfrastructureError):
            pass  # the evaluations that follow meet it again and report it

    def close(self) -> None:
        self.pipeline.close()
        self.folder.release()


# --- compile-only work on CPU-only nodes (appliance/evaluation/compile_screen.py) ---

def compile_screens(address: str, arch: int, unsafe: bool) -> list[RayCompileScreen]:
    """One screen per live node without a GPU, pinned there; none on a cluster of GPU hosts only."""
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    connect(address)
    screens = []
    for node in ray.nodes():
        cpus = node.get("Resources", {}).get("CPU", 0)
        if not node.get("Alive") or node.get("Resources", {}).get("GPU", 0) or cpus < 1:
            continue
        slots = max(1, min(8, int(cpus) // 2))  # each screen step is one single-threaded process
        actor = ray.remote(CompileWorker).options(
            num_cpus=1, max_concurrency=slots, max_restarts=0,  # a lost screen only means no screening there
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
        screens.append(RayCompileScreen(actor.remote(arch, slots, unsafe), slots))
    return screens


class RayCompileScreen:
    """CompileScreen's look-alike on the controller, whose work runs in a CompileWorker actor."""

    def __init__(self, actor, slots: int):
        self.actor, self.slots = actor, slots

    def screen(self, task: Task, candidate_path: str | Path, display_path: str | None = None) -> Outcome | None:
        ray = _ray()
        ref = self.actor.screen.remote(task_files(task), Path(candidate_path).read_text(errors="replace"),
                                       str(display_path or candidate_path))
        try:  # the canary, record and build steps, each bounded; more means the node is gone or full: no screening
            return ray.get(ref, timeout=3 * SCREEN_TIMEOUT_S + 60)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            return None  # the GPU evaluation decides

    def close(self) -> None:
        """Remove the node's copies (tasks, jobs), then the actor."""
        _close_actor(self.actor)


class CompileWorker:
    """The Ray actor of a CPU-only node: CompileScreen in this host's jail."""

    def __init__(self, arch: int, slots: int, unsafe: bool):
        from appliance.config import Settings
        from appliance.evaluation.compile_screen import CompileScreen

        host = Settings.load()
        self.folder = JobFolder(host.jobs_dir)
        self.dir = self.folder.path
        self.compile_screen = CompileScreen(host.jail(None, unsafe), self.dir / "jobs", arch, slots)
        self.tasks = RebuiltTasks(self.dir / "task")

    def close(self) -> None:
        self.folder.release()

    def screen(self, files: dict, source: str, display_path: str) -> Outcome | None:
        path = Path(tempfile.mkdtemp(prefix="candidate-", dir=self.dir)) / Path(display_path).name
        try:
            path.write_text(source)
            return self.compile_screen.screen(self.tasks.get(files), path, display_path)
        except (TaskError, InfrastructureError, OSError):
            return None
        finally:
            remove_tree(path.parent)
