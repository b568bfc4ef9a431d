"""The evaluation pipeline: a referee and a kernel server per evaluation, each in a jail of its own.

    1. baselines (once per task with reuse_inputs): the referee times the task's Model, eager and torch.compile'd,
       served by a kernel server of their own; its record holds each shape's outputs and the calibration (the
       round trip and the cost of the referee's read of outputs) that every candidate of the task is timed with;
    2. candidate: the referee (sandbox/harness/referee.py: the task's code, the inputs, the output buffers, the
       clock) drives the candidate's kernel server (sandbox/harness/server.py) over a socket pair: correctness on
       every shape and seed against float64, then timing on fresh inputs with secret checks of timed calls.

Nothing the candidate's process writes is believed: it writes no record, no times and no outputs but the bytes in
the referee's buffers. Every way a candidate can fail becomes an `Outcome` with a verdict, the stage it reached and a
specific reason; only a broken task (TaskError) or a broken host (InfrastructureError) raises.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypedDict

from appliance.errors import EvaluationCancelled, InfrastructureError, TaskError
from appliance.evaluation import evidence
from appliance.evaluation.host_memory import HostMemory, evaluation_bytes
from appliance.evaluation.job_folders import JobFolder, remove_tree
from appliance.evaluation.records import MAX_RESULT_BYTES, read_result, read_text
from appliance.evaluation.static_checks import static_rejection
from appliance.evaluation.residency import evaluation_gpus, memory_budget, resident_estimate
from appliance.evaluation.timings import pass_reason, speedup, timing_rows
from appliance.evaluation.verdicts import Rejection, host_out_of_memory, library_fallback, verdict_of
from appliance.tasks import RebuiltTasks, Task
from sandbox.builds import ensure_torch_pch
from sandbox.gate import DeviceGate, TurnAbandoned
from sandbox.jail import Jail, JailResult, JailUnavailable

STAGES = ("load", "compile", "correctness", "timing", "done")
# An evaluation holds, per shape, a batch's inputs and outputs, the referee's private copy of the inputs, the
# server's outputs, and the float64 reference of one call (residency.py): several times one call's bytes.
TOO_BIG_HINT = ("One evaluation holds several times a call's inputs and outputs (timing pool, private copy, "
                "outputs, float64 check): give the task smaller sizes (its module-level sizes, or a manifest's "
                "[[shapes]]), or evaluate it on a GPU with more memory")


@dataclass
class EvalSettings:
    device: str = "auto"  # auto | cpu | cuda
    mode: str | None = None  # small | full; default: full on a GPU, small on the CPU
    baselines: tuple[str, ...] = ("eager", "compile")
    timing_budget_s: float = 1.0  # per shape and implementation
    candidate_timeout_s: float = 600.0
    reference_timeout_s: float = 1200.0
    jobs_dir: Path | None = None
    keep_job_dir: bool = False
    state_dir: Path | None = None  # where per-GPU facts (measured ceilings) are cached between evaluations
    profile: bool = False  # Nsight Compute summary of a passing candidate (GPU only; the loop asks for promising ones)
    # Keep one task's inputs and baseline timings for the next candidates (a search evaluates many candidates of one
    # task; drawing and writing gigabytes of inputs again for each is most of an evaluation's time at full size).
    reuse_inputs: bool = False
    # What this host's evaluations may hold in host memory, in all (APPLIANCE_HOST_MEMORY_GIB; None: a share of
    # MemTotal). A fact of the host, like jobs_dir: not sent to workers, which read their own.
    host_memory_bytes: int | None = None
    # Stop every other evaluation's processes while one measures (sandbox/gate.py): off only to measure what the
    # quiet costs and buys (benchmarks/quiet_probe.py).
    quiet_measurements: bool = True
    # Elements of each output a sampled timed call is judged at, after each shape's first (judged whole); None: the
    # referee's CHECKED_ELEMENTS. Tests set it small to reach that path at small sizes.
    checked_elements: int | None = None
    # Large outputs judged in one fused pass on the GPU (sandbox/harness/compare_kernel.py); off only to measure
    # what it saves (benchmarks/check_cost.py).
    fused_compare: bool = True


class Details(TypedDict, total=False):
    """What an Outcome's details hold (stored as JSON with the evaluation). Evidence, from trusted processes only:"""

    backends: list[str]  # what the candidate's source uses (Triton, load_inline, CuPy)
    shapes: list[dict]  # the baselines' record of each shape: sizes, where it came from (the file, the manifest,
    # derived), inputs' and outputs' bytes, the reference's ops
    dropped_shapes: list[dict]  # derived shapes the task's own Model could not run, and why
    wall_s: dict[str, float]  # seconds per process of this evaluation
    gpu_index: int | None
    host_memory: dict  # what it held of the host-memory budget, and waited for it
    device_turns: dict  # its turns on the device: held, waited, joules, per process
    device_gate: dict  # the device's states so far
    jail: dict  # the kernel server's limits and the limit events seen
    stage_s: dict  # the referee's seconds per stage (and the baselines' when this evaluation prepared them)
    cases: list[dict]  # the correctness cases the referee checked
    provenance: dict  # own launches and ATen ops: reported by the server, a policy check on honest output
    evidence: dict  # launches per call, roofline fraction, energy per call, the GPU's ceilings
    rejected_by: str  # the check that made the verdict (Rejection.check): referee, jail, library_fallback, ...
    retried_alone: str  # why it was run again with the device to itself (out of device memory beside others)
    second_measurement: dict  # a large speedup measured again
    ncu: dict  # Nsight Compute's summary of one call
    precompiled_headers: str  # load_inline candidates: torch's headers precompiled for their builds (sandbox/builds)
    # Untrusted artifacts: text the candidate's process produced. Shown to people and fed to proposers only
    # bounded and fenced as untrusted output (appliance/proposers/untrusted.py); never read as evidence.
    candidate_stderr: str
    traceback: str
    line: int
    type: str


UNTRUSTED_DETAILS = ("candidate_stderr", "traceback", "line", "type")


@dataclass
class Outcome:
    verdict: str  # "pass" or a failure kind
    stage: str  # the stage that failed, or "done"
    reason: str
    jailed: bool
    device: str
    mode: str
    memory_limited: bool = True  # False only under the operator's opt-out (sandbox/jail.py unsafe_no_memory_limit)
    timings: list[dict] = field(default_factory=list)
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    environment: dict = field(default_factory=dict)
    details: Details = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


RECHECK_SPEEDUP = 10.0  # a speedup over torch.compile past this is measured a second time before it is reported
RECHECK_AGREEMENT = 1.25  # ... and must hold within this factor
SERVER_GRACE_S = 10.0  # a kernel server told to exit gets this long before it is stopped
PROFILE_MIN_GAIN = 1.03  # a passing candidate is profiled (Nsight Compute) when it beats the run's best by 3%


class SentThreshold:
    """Pipeline.profile_if where the search's database is out of reach (a worker process, a Ray actor): the
    controller sends, with each evaluation, the speedup vs eager a passing candidate must beat to be profiled
    (loop.ProfileNewBests.threshold; infinite when its proposers read no profiles; None when it has no opinion, so
    the settings decide). That threshold left the controller tens of seconds before it is used, and other
    evaluations here may have beaten it meanwhile: each of those would hold the device ~10 s for a profile, so the
    bar is also PROFILE_MIN_GAIN over the best this worker profiled since."""

    def __init__(self):
        self.local = threading.local()  # the threshold of the evaluation this thread runs, and its task
        self.best_profiled: dict[str, float] = {}  # per task: runs of other tasks have other speedups
        self.lock = threading.Lock()

    def set(self, above: float | None, task: dict | None = None) -> None:
        """The threshold an evaluation brings, and its task (task_files) whose profiled best it is compared with."""
        self.local.above = above
        self.local.task = "" if task is None else hashlib.sha256(
            (task.get("source", "") + "\0" + task.get("manifest", "")).encode()).hexdigest()

    def __call__(self, speedup: float | None) -> bool:
        above = getattr(self.local, "above", None)
        if above is None:
            return True
        task = getattr(self.local, "task", "")
        with self.lock:
            if speedup is None or speedup <= max(above, PROFILE_MIN_GAIN * self.best_profiled.get(task, 0.0)):
                return False
            self.best_profiled[task] = speedup
            return True


def sent_threshold(profile_if) -> float | None:
    """What a client sends with an evaluation: its predicate's threshold (loop.ProfileNewBests), or None."""
    threshold = getattr(profile_if, "threshold", None)
    return threshold() if threshold else None


def default_slots(gpus: int, cores: int | None = None) -> int:
    """Evaluations in flight per device when the user does not say, on a host with `gpus` evaluation GPUs and
    `cores` CPU cores (default: this host's). On a GPU, most of an evaluation is CPU work (processes, imports, files)
    and the gate bounds how many hold device memory at once, so up to half the host's cores per GPU, between 3 and 8;
    the CPU evaluates one at a time (the Triton interpreter is CPU-bound itself)."""
    if gpus == 0:
        return 1
    return max(3, min(8, (cores or os.cpu_count() or 2) // (2 * gpus)))


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch  # the controller only asks whether CUDA is there; it never runs task or candidate code

    return "cuda" if torch.cuda.is_available() else "cpu"


def detect_backends(source: str) -> list[str]:
    """Kernel backends a candidate's source uses, by the imports and calls that each one needs."""
    found = []
    if re.search(r"^\s*(import|from)\s+triton\b", source, re.M):
        found.append("triton")
    if re.search(r"\bload_inline\b|\bcpp_extension\b", source):
        found.append("cuda")
    if re.search(r"^\s*(import|from)\s+cupy\b", source, re.M):
        found.append("cupy")
    return found


@dataclass(eq=False)
class _InFlight:
    """One evaluation in progress: what `Pipeline.cancel_unmeasured` calls off."""

    tag: str | None = None  # whose it is (a worker's client), for cancel_unmeasured(tag)
    cancel: threading.Event = field(default_factory=threading.Event)
    groups: set[str] = field(default_factory=set)  # its referee-and-server sessions' groups at the gate


class Pipeline:
    """One evaluation device's worker. `evaluate` may be called from `slots` threads at once: their loading,
    compiling and checking overlap, while correctness and timing take turns on the device (sandbox/gate.py)."""

    def __init__(self, jail: Jail, settings: EvalSettings, slots: int = 1, host_memory: HostMemory | None = None):
        self.jail, self.settings, self.slots = jail, settings, max(1, slots)
        self.gpu = jail.gpu  # (evaluation/evaluator.py: what the loop reads)
        # What a person watching one evaluation is told as it goes (`appliance eval` in a terminal): stage names.
        self.progress: Callable[[str], None] = lambda _stage: None
        meter = None
        if jail.gpu is not None:
            from sandbox.harness.energy import EnergyMeter

            meter = EnergyMeter(jail.gpu)
        self.gate = DeviceGate(energy_meter=meter, memory_bytes=memory_budget(jail.gpu),
                               pause_others=settings.quiet_measurements)
        # One process's pipelines share one (cli.py); a worker process per GPU takes its GPU's share of the host's.
        self.host_memory = host_memory or HostMemory(settings.host_memory_bytes,
                                                     share=1 / evaluation_gpus() if jail.gpu is not None else 1.0)
        self.folder = JobFolder(settings.jobs_dir)  # this pipeline's job folders, swept if its process is killed
        self._ceilings: dict | None = None
        self._prepared: dict[str, tuple[Path, dict]] = {}  # task key -> (inputs dir, prepare's result)
        self._prepared_ahead: dict[str, tuple[float, list[dict]]] = {}  # key -> (wall s, device turns) not yet charged
        self._once = threading.Lock()  # one thread prepares a task's inputs; the rest wait
        self._ceilings_lock = threading.Lock()  # the GPU's ceilings: kept, read and measured by one thread at a time
        # With settings.profile: which passing candidates get an Nsight Compute run (given the speedup vs eager).
        # A search sets it (loop.ProfileNewBests): a profile holds the device longer than the evaluation itself.
        self.profile_if: Callable[[float | None], bool] | None = None
        self._in_flight: set[_InFlight] = set()
        self._called_off: dict[str | None, float] = {}  # tag (None: everyone's) -> when cancel_unmeasured was called
        self._in_flight_lock = threading.Lock()
        self._current = threading.local()  # .call: the evaluation this thread runs

    def cancel_unmeasured(self, tag: str | None = None) -> int:
        """Call off every evaluation in progress (of `tag`'s, if given) that has not begun measuring (a run's time
        is up): its processes are killed and its `evaluate` raises EvaluationCancelled. One that measures goes on and
        gets its verdict. Returns how many were called off."""
        cancelled = 0
        with self._in_flight_lock:
            self._called_off[tag] = time.monotonic()  # (and what was asked for before now, not yet started)
            for call in self._in_flight:
                if tag is not None and call.tag != tag:
                    continue
                if not call.cancel.is_set() and self.gate.abandon_unmeasured(call.groups):
                    call.cancel.set()
                    cancelled += 1
        return cancelled

    @staticmethod
    def _derived_secret() -> bytes:
        """The key one evaluation's derived sizes are drawn with (tasks.secret_draw)."""
        return os.urandom(16)

    def close(self) -> None:
        """Forget the baselines kept for reuse, and remove this pipeline's folder."""
        self._prepared.clear()
        self.folder.release()

    def evaluate(self, task: Task, candidate_path: str | Path, tag: str | None = None,
                 asked_at: float | None = None) -> Outcome:
        """The verdict on one candidate file. `tag` names whose evaluation it is and `asked_at` (time.monotonic())
        when it was asked for (a worker's request may wait for a slot): for cancel_unmeasured."""
        asked_at = time.monotonic() if asked_at is None else asked_at
        s = self.settings
        device = resolve_device(s.device)
        mode = s.mode or ("full" if device == "cuda" else "small")
        try:
            self.jail.check()
        except JailUnavailable as e:
            raise InfrastructureError(str(e)) from None
        candidate_path = Path(candidate_path)
        if not candidate_path.is_file():
            raise TaskError(str(candidate_path), "no such candidate file")
        source = candidate_path.read_text(errors="replace")
        base = dict(verdict="pass", stage="done", reason="", jailed=not self.jail.unsafe_no_jail,
                    memory_limited=self.jail.memory_limit_enforced(), device=device, mode=mode)
        if rejection := static_rejection(source, task.source):  # before anything is prepared: in well under 1 s
            return Outcome(**base | dict(verdict=rejection.verdict, stage=rejection.stage, reason=rejection.reason),
                           details={"rejected_by": rejection.check})
        backends = detect_backends(source)
        refused = [b for b in backends if b not in task.manifest.backends]
        if refused:
            return Outcome(**base | dict(verdict="backend_not_allowed", stage="load",
                                         reason=f"candidate uses {', '.join(refused)}; the task allows "
                                                f"{', '.join(task.manifest.backends)}"),
                           details={"backends": backends})

        # A kept job folder goes beside the pipeline's (which goes with the pipeline), for the user to read.
        job = Path(tempfile.mkdtemp(prefix="eval-", dir=self.folder.root if s.keep_job_dir else self.folder.path))
        call = _InFlight(tag)
        with self._in_flight_lock:
            if asked_at <= max(self._called_off.get(tag, -math.inf), self._called_off.get(None, -math.inf)):
                remove_tree(job)
                raise EvaluationCancelled("called off before it started")
            self._in_flight.add(call)
        self._current.call = call
        with contextlib.ExitStack() as held:  # host memory, held until the job folder is gone
            try:
                return self._run(task, candidate_path, job, device, mode, base, backends, held)
            finally:
                with self._in_flight_lock:
                    self._in_flight.discard(call)
                self.gate.forget(call.groups)
                self._current.call = None
                if not s.keep_job_dir:
                    remove_tree(job)

    def prepare(self, task: Task) -> None:
        """Make and keep the task's inputs and baselines now (with reuse_inputs), so that the first candidate sent
        here does not wait for them: a run prepares every worker at once, while its seed is evaluated."""
        if not self.settings.reuse_inputs:
            return
        device = resolve_device(self.settings.device)
        self._kept_inputs(task, device, self.settings.mode or ("full" if device == "cuda" else "small"), {}, [],
                          ahead=True)

    def _common_spec(self, task: Task, device: str, mode: str, secret: bytes | None = None) -> dict:
        """What every referee of the task is told. A bare file's derived sizes: the rules' own for the baselines
        (the largest, for the memory estimate), drawn anew from `secret` for each candidate (tasks.secret_draw)."""
        return {"device": device, "dtype": task.manifest.dtype, "seeds": list(range(task.manifest.seeds)),
                "shapes": [vars(sh) for sh in task.shapes(mode, secret)],
                "timing_budget_s": self.settings.timing_budget_s,
                "tolerances": task.tolerances()} | (
                    {"checked_elements": self.settings.checked_elements} if self.settings.checked_elements else {}) | (
                    {} if self.settings.fused_compare else {"fused_compare": False})

    def _key(self, task: Task, device: str, mode: str) -> str:
        return "|".join([str(task.path), hashlib.sha256((task.source + task.manifest_text).encode()).hexdigest(), mode,
                         device, ",".join(self.settings.baselines)])

    def _kept_inputs(self, task: Task, device: str, mode: str, wall: dict, turns: list[dict],
                     ahead: bool = False) -> dict:
        """The baselines' record for this task (kept with reuse_inputs), made by the first caller; the others wait.
        A record made `ahead` of any evaluation is charged (wall seconds, device turns) to the first one."""
        key = self._key(task, device, mode)
        call: _InFlight | None = getattr(self._current, "call", None)
        while not self._once.acquire(timeout=0.5):  # (another thread prepares: a call-off need not wait for it)
            if call is not None and call.cancel.is_set():
                raise EvaluationCancelled("called off while the task's baselines were being prepared")
        try:
            kept = self._prepared.get(key)
            if kept is not None:
                if ahead:
                    return kept  # what was charged (or is pending) stays so
                ahead_wall, ahead_turns = self._prepared_ahead.pop(key, (0.0, []))
                wall["prepare"] = ahead_wall
                turns.extend(ahead_turns)
                return kept
            workdir = Path(tempfile.mkdtemp(prefix="prepare-", dir=self.folder.path))
            try:
                self._prepared[key] = self._prepare(task, device, mode, workdir, wall, turns)
                if ahead:
                    self._prepared_ahead[key] = (wall["prepare"], list(turns))
            finally:
                remove_tree(workdir)
            return self._prepared[key]
        finally:
            self._once.release()

    def _prepare(self, task: Task, device: str, mode: str, job: Path, wall: dict, turns: list[dict]) -> dict:
        """The baselines (the task's Model, eager and torch.compile'd, served by a kernel server of their own) are
        timed by the referee with the device to themselves; candidates of the task wait for them. Their record holds
        the shapes' outputs and the calibration every candidate of the task is timed with. A worker's first prepare
        on a GPU also measures the GPU's ceilings, in the same exclusive process, unless they are cached."""
        s = self.settings
        cache = self._ceilings_cache()
        ceilings = device == "cuda" and self._ceilings is None and not (cache and cache.is_file())
        reference = job / "reference"
        reference.mkdir()
        shutil.copy(task.path, reference / "task.py")
        impls = [{"name": b, "file": str(reference / "task.py"), "cls": "Model", "compile": b == "compile"}
                 for b in s.baselines]
        spec = self._common_spec(task, device, mode) | {"role": "baselines", "implementations": impls}

        def run(with_ceilings: bool) -> dict:
            return self._session(task, spec | {"ceilings": with_ceilings}, job, server_ro=[reference],
                                 timeout=s.reference_timeout_s, wall=wall, turns=turns, label="prepare",
                                 exclusive=True, resident_bytes=self._whole_budget())[0]

        try:
            result = run(ceilings)
        except InfrastructureError:
            if not ceilings:
                raise
            # The ceilings are measured first (before any task code): a prepare that crashed with them is run once
            # more without, so that measuring them can cost the roofline, never the task.
            result = run(False)
        if result["status"] != "ok":
            raise InfrastructureError(f"the baselines' kernel server failed ({result['status']}): "
                                      f"{str(result.get('reason'))[:500]}")
        measured = result.pop("ceilings", None)
        if isinstance(measured, dict) and "measured" in measured:
            with self._ceilings_lock:
                self._keep_ceilings(measured, result["environment"])
        return result

    def _run(self, task, candidate_path, job, device, mode, base, backends, held: contextlib.ExitStack) -> Outcome:
        s = self.settings
        wall: dict[str, float] = {}  # seconds per process of this evaluation
        turns: list[dict] = []  # device turns of this evaluation's processes
        # 1. The baselines and the calibration, from the task's own code (or kept from an earlier candidate).
        self.progress(f"preparing the task: its inputs at {len(task.shapes(mode))} shape(s), the baselines "
                      f"({', '.join(s.baselines)}) loaded, checked against float64 and timed")
        if s.reuse_inputs:
            prepared = self._kept_inputs(task, device, mode, wall, turns)
        else:
            prepared_dir = job / "prepare"
            prepared_dir.mkdir()
            prepared = self._prepare(task, device, mode, prepared_dir, wall, turns)
        environment = prepared["environment"]
        details: Details = {"backends": backends, "shapes": prepared["shapes"], "wall_s": wall,
                            "gpu_index": self.jail.gpu, "dropped_shapes": prepared.get("dropped_shapes", [])}
        resident = resident_estimate(prepared["shapes"], device)
        host_bytes = evaluation_bytes(resident, device, outputs_in_memory=device == "cpu")  # CPU pools: memfds
        waited = held.enter_context(self.host_memory.hold(host_bytes))
        budget = self.host_memory.budget()
        details["host_memory"] = {"held_gib": round(host_bytes / 2**30, 2), "wait_s": round(waited, 2),
                                  "budget_gib": None if budget is None else round(budget / 2**30, 1)}

        # 2. The referee serves the candidate fresh inputs, times it and checks it. The server reads the submitted
        #    source from a read-only folder: nothing it writes changes what a retry or a profile run evaluates.
        if "cuda" in backends and device == "cuda":  # load_inline on a GPU host: torch's headers precompiled by
            details["precompiled_headers"] = ensure_torch_pch()  # us, once, before any jail builds (sandbox/builds)
        source = job / "source"
        source.mkdir()
        shutil.copy(candidate_path, source / "candidate.py")
        impl = [{"name": "candidate", "file": str(source / "candidate.py"), "cls": "ModelNew"}]
        # Derived sizes of this evaluation's own, secret until it is served them: what a candidate learns of them
        # (its own failure's reason, say) says nothing of the next evaluation's.
        spec = self._common_spec(task, device, mode, self._derived_secret()) | {
            "role": "candidate", "implementations": impl, "calibration": prepared["calibration"]}
        kept = {sh["name"] for sh in prepared["shapes"]}  # not the derived shapes the reference could not run
        spec["shapes"] = [sh for sh in spec["shapes"] if sh["name"] in kept]
        self.progress(f"the candidate, jailed: loading and compiling, correctness at {len(kept)} shape(s) and "
                      f"{task.manifest.seeds} seed(s), then timing")
        referee, run = self._candidate(task, spec, job, source, resident, wall, turns, details)
        if referee.get("shapes"):  # the sizes this evaluation checked (a bare file's derived ones drawn for it)
            details["shapes"] = referee["shapes"]
        details["dropped_shapes"] = details["dropped_shapes"] + referee.get("dropped_shapes", [])
        details["device_turns"] = _sum_turns(turns)
        details["candidate_stderr"] = run.stderr[-4000:]
        details["jail"] = {"limits": run.limits, "limit_events": run.limit_events, "output_bytes": run.output_bytes}
        details["stage_s"] = {"referee": referee.get("stage_s")}
        if wall.get("prepare"):  # the evaluation that prepared the task's baselines (or is charged for it)
            details["stage_s"]["prepare"] = prepared.get("stage_s")
        details["cases"] = referee.get("cases", [])
        details["device_gate"] = self.gate.occupancy()  # the device's states so far (benchmarks read the change)
        failure = verdict_of(referee, run, s.candidate_timeout_s)
        if failure and (why := host_out_of_memory(run, failure)):
            raise InfrastructureError(why)
        if failure:
            reason = failure.reason
            if "retried_alone" in details:
                reason += (" (retried alone after running out of memory beside other evaluations: it also "
                           "failed with the device to itself)")
            untrusted = referee.get("untrusted") or {}
            details.update({k: untrusted[k] for k in UNTRUSTED_DETAILS if k != "candidate_stderr" and untrusted.get(k)})
            details["rejected_by"] = failure.check
            reason = reason.replace("candidate.py line", f"{candidate_path} line")
            return Outcome(**base | dict(verdict=failure.verdict, stage=failure.stage, reason=reason),
                           environment=environment, details=details)

        # 3. The referee passed it: the checks of its record, in order (the first that fires names the verdict).
        details["provenance"] = referee.get("provenance", {})
        ceilings = self._device_ceilings(job, environment, turns) if device == "cuda" else None
        usable = ceilings if ceilings and "measured" in ceilings else None  # not when measuring them failed
        timings = timing_rows(task, prepared, referee["timings"], device, usable)
        main_row = next((t for t in timings if t["shape"] == "main" and t["implementation"] == "candidate"), {})
        details["evidence"] = {"launches_per_call": details["provenance"].get("own_launches"),
                               "roofline_fraction": main_row.get("roofline_fraction"),
                               "energy_j_per_call": main_row.get("energy_j_per_call"), "ceilings": ceilings}
        passed = Passed(task, prepared, referee, timings, usable, details, lambda: self._candidate(
            task, spec, job, source, resident, wall, turns, details))
        for check in (_library_fallback, _impossible, self._holds_when_measured_again):
            if rejection := check(passed):
                details["rejected_by"] = rejection.check
                return Outcome(**base | dict(verdict=rejection.verdict, stage=rejection.stage,
                                             reason=rejection.reason),
                               timings=timings, environment=environment, details=details)
        main = {t["implementation"]: t for t in timings if t["shape"] == "main"}
        details["device_turns"] = _sum_turns(turns)
        if s.profile and device == "cuda" and (self.profile_if is None or self.profile_if(speedup(main, "eager"))):
            details["ncu"] = self._profile(task, spec, job, source, turns)
            details["device_turns"] = _sum_turns(turns)
        return Outcome(**base | dict(reason=pass_reason(main, device)), timings=timings,
                       speedup_vs_eager=speedup(main, "eager"), speedup_vs_compile=speedup(main, "compile"),
                       environment=environment, details=details)

    def _holds_when_measured_again(self, passed: Passed) -> Rejection | None:
        """A speedup over torch.compile past RECHECK_SPEEDUP is measured once more, by a fresh referee and server,
        and reported only if it holds; the slower of the two times stands."""
        main = {t["implementation"]: t for t in passed.timings if t["shape"] == "main"}
        if (speedup(main, "compile") or 0) <= RECHECK_SPEEDUP:
            return None
        again, run2 = passed.measure_again()
        second = (again.get("timings") or {}).get("main", {}).get("median_ms")
        passed.details["second_measurement"] = {"status": again.get("status"), "median_ms": second}
        if verdict_of(again, run2, self.settings.candidate_timeout_s) or not second:
            return Rejection("timing_mismatch", "timing", (
                f"a {speedup(main, 'compile'):.3g}x speedup over torch.compile did not hold when measured again "
                f"({str(again.get('verdict') or again.get('status'))[:60]})"), "measured_again")
        first = main["candidate"]["median_ms"]
        if second > RECHECK_AGREEMENT * first:
            return Rejection("timing_mismatch", "timing", (
                f"measured again, the main shape took {second:.4g} ms instead of {first:.4g} ms: a "
                f"{speedup(main, 'compile'):.3g}x speedup over torch.compile is reported only if it holds"),
                "measured_again")
        main["candidate"]["median_ms"] = max(first, second)  # (the row itself: the slower of the two stands)
        return None

    def _candidate(self, task: Task, spec: dict, job: Path, source: Path, nbytes: int, wall: dict,
                   turns: list[dict], details: dict) -> tuple[dict, JailResult]:
        """The referee's record of the candidate, and the candidate server's run."""

        def once(resident_bytes: int | None) -> tuple[dict, JailResult]:
            return self._session(task, spec, job, server_ro=[source], timeout=self.settings.candidate_timeout_s,
                                 wall=wall, turns=turns, label="candidate", resident_bytes=resident_bytes)

        referee, run = once(nbytes)
        # Out of device memory beside other evaluations may be their doing, not the candidate's (the budget holds
        # estimates): once more, alone (None: admitted only when nothing else is resident); that run's verdict
        # stands. Not when what it asked for would not fit beside its own share even alone.
        untrusted = referee.get("untrusted") or {}
        said = {"message": f"{untrusted.get('type', '')} {referee.get('reason', '')}"}
        if (referee.get("status") == "rejected" and "OutOfMemoryError" in str(untrusted.get("type"))
                and (referee.get("turns") or {}).get("neighbours") and self._could_fit_alone(said, nbytes)):
            details["retried_alone"] = str(referee.get("reason"))[:500]
            referee, run = once(None)
        return referee, run

    def _session(self, task: Task, spec: dict, job: Path, *, server_ro: list[Path], timeout: float, wall: dict,
                 turns: list[dict], label: str, exclusive: bool = False, resident_bytes: int | None = 0,
                 server_prefix: Callable[[Path], tuple[str, ...]] | None = None,
                 workdir: Path | None = None) -> tuple[dict, JailResult]:
        """One referee and one kernel server, each in a jail of its own, joined by a socket pair: the referee's
        record and the server's run. The referee (trusted harness, the task's code) takes the device turns; the
        server holds none. A broken task is a TaskError, a broken referee an InfrastructureError. A referee out of
        device memory beside other evaluations is run again alone, in the same folders."""
        retry = workdir is not None
        workdir = workdir or Path(tempfile.mkdtemp(prefix=f"{label}-", dir=job))
        referee_dir, server_dir = workdir / "referee", workdir / "server"
        referee_dir.mkdir(exist_ok=retry)
        server_dir.mkdir(exist_ok=retry)
        shutil.copy(task.path, referee_dir / "task.py")
        result_path = referee_dir / "result.json"
        result_path.unlink(missing_ok=True)
        spec_path = referee_dir / "spec.json"
        spec_path.write_text(json.dumps(spec | {"task_file": str(referee_dir / "task.py"),
                                                "task_display": str(task.path), "result": str(result_path),
                                                "call_timeout_s": timeout + 60}))
        from sandbox.harness.referee import ENV_FD as SERVER_FD
        from sandbox.harness.server import ENV_FD as REFEREE_FD

        group = str(workdir)  # referee and kernel server: not stopped by each other's measurements
        call: _InFlight | None = getattr(self._current, "call", None)
        if call is not None:
            with self._in_flight_lock:  # (with cancel_unmeasured: a group added after it is never missed)
                if call.cancel.is_set():
                    raise EvaluationCancelled(f"{label}: called off before it measured")
                call.groups.add(group)
        cancel = call.cancel if call is not None else None
        ours, theirs = socket.socketpair()
        stop, server_run = threading.Event(), {}

        def serve() -> None:
            try:
                server_run["run"] = self.jail.run(
                    [*(server_prefix(server_dir) if server_prefix else ()), _python(), "-m", "sandbox.harness.server",
                     spec["device"]], workdir=server_dir,
                    ro=server_ro, env={REFEREE_FD: str(theirs.fileno())}, extra_fds=(theirs.detach(),),
                    timeout_s=timeout, stop=stop, paused_by=self.gate, group=group)
            except BaseException as exc:  # noqa: BLE001 - raised below, in the evaluating thread
                server_run["error"] = exc

        server = threading.Thread(target=serve, daemon=True, name=f"{label}-server")
        server.start()
        try:
            run = self.jail.run([_python(), "-m", "sandbox.harness.referee", str(spec_path)], workdir=referee_dir,
                                env={SERVER_FD: str(ours.fileno())}, extra_fds=(ours.detach(),),
                                timeout_s=timeout + self.settings.reference_timeout_s, gate=self.gate,
                                exclusive=exclusive, resident_bytes=resident_bytes, group=group, stop=cancel)
        except TurnAbandoned:  # (an exclusive run, the task's prepare, called off while it waited for the device)
            raise EvaluationCancelled(f"{label}: called off before it measured") from None
        finally:
            # It was told to exit; one that does not within SERVER_GRACE_S of its own running time is stopped (time
            # it spends stopped while another evaluation measures does not count).
            grace = SERVER_GRACE_S
            while grace > 0 and server.is_alive() and not (cancel is not None and cancel.is_set()):
                server.join(timeout=0.5)
                if not self.gate.stopped(group):
                    grace -= 0.5
            stop.set()
            server.join()
        # Killed on purpose: no verdict, unless its record was written whole (atomically) before that; then it
        # stands, however long the kernel server took to exit (or the referee itself, once it had written it).
        stopped = cancel is not None and cancel.is_set()
        if stopped and read_result(result_path) is None:
            raise EvaluationCancelled(f"{label}: called off before it measured")
        if "error" in server_run:
            raise server_run["error"]
        wall[label] = round(wall.get(label, 0.0) + run.wall_s, 2)
        server_paused = server_run["run"].paused_s if "run" in server_run else 0.0
        turns.append((run.turns or {}) | {"paused_s": run.paused_s + server_paused})
        result = read_result(result_path)
        if result and result.get("status") == "out_of_memory" and (run.turns or {}).get("neighbours"):
            return self._session(task, spec, job, server_ro=server_ro, timeout=timeout, wall=wall, turns=turns,
                                 label=label, exclusive=exclusive, resident_bytes=None, server_prefix=server_prefix,
                                 workdir=workdir)
        if result and result.get("status") == "out_of_memory":
            raise TaskError(str(task.path), f"the reference ({label}) ran out of device memory with the device to "
                                            f"itself: {str(result.get('message'))[:600]}. {TOO_BIG_HINT}")
        if run.timed_out:
            raise TaskError(str(task.path), f"the reference ({label}) did not finish within "
                                            f"{timeout + self.settings.reference_timeout_s:.0f} s")
        for event, limit, setting in (("disk_limit", "disk_bytes", "APPLIANCE_JAIL_DISK_GIB"),
                                      ("oom_kill", "memory_bytes", "APPLIANCE_JAIL_MEMORY_GIB")):
            if run.limit_events.get(event):
                raise TaskError(str(task.path), f"the reference ({label}) needs more than the jail's "
                                                f"{run.limits.get(limit, 0) / 2**30:.3g} GiB ({event}): raise "
                                                f"{setting} (or eval's --{'disk' if event == 'disk_limit' else 'memory'}"
                                                "-limit)")
        if result is None or (run.returncode != 0 and not stopped):
            raise InfrastructureError(f"the referee ({label}) failed with exit code {run.returncode}: "
                                      f"{run.stderr[-3000:]}")
        if result["status"] == "task_error":
            raise TaskError(str(task.path), result["reason"], result.get("line"))
        result["turns"] = run.turns
        return result, server_run["run"]

    def _profile(self, task: Task, spec: dict, job: Path, source: Path, turns: list[dict]) -> dict:
        """Nsight Compute around the (already passed) candidate's kernel server, over one call the referee asks for,
        in the same jails as its evaluation."""
        ncu = shutil.which("ncu") or next((p for p in NCU_PATHS if os.path.isfile(p)), None)
        if not ncu:
            return {"error": "Nsight Compute (ncu) is not installed on this host; install the CUDA toolkit's "
                             "nsight-compute package to get profiles"}
        logs: list[Path] = []

        def prefix(server_dir: Path) -> tuple[str, ...]:
            logs.append(server_dir / "ncu.csv")
            return tuple(evidence.ncu_command(ncu, str(logs[0])))

        try:
            referee, run = self._session(task, spec | {"role": "profile"}, job, server_ro=[source], timeout=300,
                                         wall={}, turns=turns, label="profile", exclusive=True,
                                         resident_bytes=self._whole_budget(), server_prefix=prefix)
        except (TaskError, InfrastructureError) as e:
            return {"error": f"the profile run failed: {str(e)[:500]}"}
        text = read_text(logs[0], MAX_RESULT_BYTES) if logs else None
        summary = evidence.ncu_summary(text) if text else {}
        if referee.get("status") != "ok" or run.returncode != 0 or not text or "error" in summary:
            tail = " ".join((run.stderr.strip() or text or "").splitlines()[-3:])[-500:]
            return {"error": f"ncu exited with code {run.returncode}: {tail}"}
        return summary

    def _device_ceilings(self, job: Path, environment: dict, turns: list[dict]) -> dict | None:
        """The GPU's measured ceilings: once per worker (cached per GPU model and driver), in the jail."""
        with self._ceilings_lock:
            return self._measure_ceilings(job, environment, turns)

    def _ceilings_cache(self) -> Path | None:
        return (self.settings.state_dir / f"ceilings-gpu{self.jail.gpu}.json") if self.settings.state_dir else None

    def _keep_ceilings(self, measured: dict, environment: dict) -> None:
        cache = self._ceilings_cache()
        self._ceilings = measured | {"key": _ceilings_key(environment)}
        if cache:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._ceilings))
            os.replace(tmp, cache)  # whole or not at all: another worker may read it now

    def _measure_ceilings(self, job: Path, environment: dict, turns: list[dict]) -> dict | None:
        """Where prepare did not measure them (it failed to, or ran before this GPU's driver changed)."""
        key, cache = _ceilings_key(environment), self._ceilings_cache()
        if self._ceilings is None and cache and cache.is_file():
            cached = read_result(cache)  # unreadable: measured again
            self._ceilings = cached if cached and cached.get("key") == key else None
        if self._ceilings is None or self._ceilings.get("key") != key:
            workdir = job / "ceilings"
            workdir.mkdir()
            run = self.jail.run([_python(), "-m", "sandbox.harness.ceilings", str(workdir / "ceilings.json")],
                                workdir=workdir, timeout_s=300, gate=self.gate, exclusive=True,
                                resident_bytes=self._whole_budget())
            turns.append(run.turns or {})
            measured = read_result(workdir / "ceilings.json")
            if run.returncode != 0 or measured is None:
                # Without ceilings there is no roofline, but the evaluation itself stands.
                return {"error": f"measuring the GPU's ceilings failed: {run.stderr.strip()[-300:]}"}
            self._keep_ceilings(measured, environment)
        return self._ceilings

    def _could_fit_alone(self, result: dict, nbytes: int) -> bool:
        """Whether the allocation an out-of-memory error names ("Tried to allocate 20.00 GiB") fits in the budget beside
        the process's own estimate; True when either is unknown."""
        # The candidate's process wrote the message: read it as text, never trust it to parse.
        found = re.search(r"Tried to allocate (\d+(?:\.\d+)?) ?([KMGT]i?B|bytes|B)\b", str(result.get("message", "")))
        if not found or not self.gate.memory_bytes:
            return True
        scale = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 1e3, "MB": 1e6,
                 "GB": 1e9, "TB": 1e12}
        return float(found[1]) * scale[found[2]] <= self.gate.memory_bytes - (nbytes or 0)

    def _whole_budget(self) -> int:
        """What a process that measures from start to end holds: the whole budget, as it is alone on the device
        anyway (0 where there is no budget: nothing to wait for, as before there was one)."""
        return self.gate.memory_bytes or 0


def evaluate_sent(pipeline: Pipeline, tasks: RebuiltTasks, files: dict, source: str, display_path: str,
                  job_root: Path, tag: str | None = None, asked_at: float | None = None) -> Outcome:
    """An evaluation sent from another process or host (worker processes, Ray actors): the task and the candidate
    arrive as text and are written under `job_root`; the outcome and a TaskError name the sender's files."""
    job = Path(tempfile.mkdtemp(prefix="candidate-", dir=job_root))
    try:
        task = tasks.get(files)
        path = job / Path(display_path).name
        path.write_text(source)
        outcome = pipeline.evaluate(task, path, tag, asked_at)
    except TaskError as e:
        if e.path.startswith(str(tasks.root)):  # our copy of the task: name the sender's
            raise TaskError(files["path"], e.message, e.line) from None
        raise
    finally:
        remove_tree(job)
    outcome.reason = outcome.reason.replace(str(path), display_path)
    return outcome


@dataclass
class Passed:
    """What the checks after a referee's pass look at: the task, the baselines' record, the referee's record, the
    timing rows (a check may amend them), the GPU's ceilings, the outcome's details, and a fresh measurement."""

    task: Task
    prepared: dict
    referee: dict
    timings: list[dict]
    ceilings: dict | None
    details: dict
    measure_again: Callable[[], tuple[dict, JailResult]]


def _library_fallback(passed: Passed) -> Rejection | None:
    why = library_fallback(passed.details["provenance"], passed.prepared["shapes"][0].get("ops", []),
                           passed.referee["timings"])
    return Rejection("library_fallback", "correctness", why, "library_fallback") if why else None


def _impossible(passed: Passed) -> Rejection | None:
    """A time below what the work needs at the GPU's measured ceilings (the manifest's work per call, else the
    bytes the referee moved): evidence.impossible."""
    for row in (t for t in passed.timings if t["implementation"] == "candidate"):
        if why := evidence.impossible(passed.ceilings, row.get("flops"), row.get("bytes"),
                                      passed.task.manifest.dtype, row["median_ms"]):
            return Rejection("impossible", "timing", f"{why} at shape {row['shape']}", "impossible")
    return None


def _sum_turns(turns: list[dict]) -> dict:
    """An evaluation's time with the device to itself (what GPU-seconds are charged for), its waiting, its energy;
    and each process's share (in the order they ran)."""
    joules = [t["joules"] for t in turns if t.get("joules") is not None]
    return {"turns": sum(t.get("turns", 0) for t in turns),  # a first call's compile adds one (common.py lends it)
            "held_s": round(sum(t.get("held_s", 0.0) for t in turns), 3),
            "wait_s": round(sum(t.get("wait_s", 0.0) for t in turns), 3),
            "joules": round(sum(joules), 3) if joules else None,
            "resident_wait_s": round(sum(t.get("resident_wait_s", 0.0) for t in turns), 3),
            "neighbours": max((t.get("neighbours", 0) for t in turns), default=0),
            # stopped while other evaluations measured (sandbox/gate.py), referee and kernel server each
            "paused_s": round(sum(t.get("paused_s", 0.0) for t in turns), 3),
            "held_s_by_process": [t.get("held_s", 0.0) for t in turns]}


def _python() -> str:
    import sys

    return sys.executable


NCU_PATHS = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu")


def _ceilings_key(environment: dict) -> str:
    """Cached ceilings hold for one GPU model and driver."""
    return f"{environment.get('gpu')}|{environment.get('driver')}"


