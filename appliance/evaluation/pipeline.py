"""The evaluation pipeline: load/compile -> correctness -> timing, across three jailed processes.

    1. reference `prepare` (task code): writes the inputs for every shape and seed, times eager and torch.compile;
    2. candidate (untrusted): sees only its own file and those inputs; saves its outputs, times itself;
    3. reference `check` (task code again): recomputes the reference in float64 and compares the saved outputs.
       It starts with the candidate (its imports overlap the candidate's run) and reads nothing until told to go.

The candidate and the reference never share a process, and neither runs in the controller's process. Every way
a candidate can fail becomes an `Outcome` with a verdict, the stage it reached and a specific reason; only a
broken task (TaskError) or a broken host (InfrastructureError) raises.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from appliance.errors import InfrastructureError, TaskError
from appliance.evaluation import evidence
from appliance.evaluation.host_memory import HostMemory, evaluation_bytes
from appliance.evaluation.job_folders import JobFolder, remove_tree
from appliance.tasks import RebuiltTasks, Task
from sandbox.gate import DeviceGate
from sandbox.harness.transfer import DTYPE_BYTES, RECORD_MAX_BYTES, in_memory, output_file_limit, output_name
from sandbox.jail import Jail, JailResult, JailUnavailable

STAGES = ("load", "compile", "correctness", "timing", "done")
MEMORY_BUDGET_FRACTION = 0.9  # of the GPU's memory: what the evaluations in flight may hold at once (sandbox/gate.py)
PROCESS_ALLOWANCE_BYTES = 1 << 30  # device memory of one process beyond its tensors: CUDA context, allocator slack
CHECK_COMPARE_BYTES = 1 << 30  # the comparison's float64 temporaries (sandbox/harness/compare.py: chunks of 16 M)


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
    details: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


PROFILE_MIN_GAIN = 1.03  # a passing candidate is profiled (Nsight Compute) when it beats the run's best by 3%


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


class Pipeline:
    """One evaluation device's worker. `evaluate` may be called from `slots` threads at once: their loading,
    compiling and checking overlap, while correctness and timing take turns on the device (sandbox/gate.py)."""

    def __init__(self, jail: Jail, settings: EvalSettings, slots: int = 1, host_memory: HostMemory | None = None):
        self.jail, self.settings, self.slots = jail, settings, max(1, slots)
        meter = None
        if jail.gpu is not None:
            from sandbox.harness.energy import EnergyMeter

            meter = EnergyMeter(jail.gpu)
        self.gate = DeviceGate(energy_meter=meter, memory_bytes=_memory_budget(jail.gpu))
        # One process's pipelines share one (cli.py); a worker process per GPU takes its GPU's share of the host's.
        self.host_memory = host_memory or HostMemory(settings.host_memory_bytes,
                                                     share=1 / _evaluation_gpus() if jail.gpu is not None else 1.0)
        self.folder = JobFolder(settings.jobs_dir)  # this pipeline's job folders, swept if its process is killed
        self._ceilings: dict | None = None
        self._prepared: dict[str, tuple[Path, dict]] = {}  # task key -> (inputs dir, prepare's result)
        self._prepared_ahead: dict[str, tuple[float, list[dict]]] = {}  # key -> (wall s, device turns) not yet charged
        self._once = threading.Lock()  # one thread prepares a task's inputs; the rest wait
        self._ceilings_lock = threading.Lock()  # the GPU's ceilings: kept, read and measured by one thread at a time
        # With settings.profile: which passing candidates get an Nsight Compute run (given the speedup vs eager).
        # A search sets it (loop.ProfileNewBests): a profile holds the device longer than the evaluation itself.
        self.profile_if: Callable[[float | None], bool] | None = None

    def close(self) -> None:
        """Remove the inputs kept for reuse, and this pipeline's folder."""
        for inputs_dir, _ in self._prepared.values():
            shutil.rmtree(inputs_dir, ignore_errors=True)
        self._prepared.clear()
        self.folder.release()

    def evaluate(self, task: Task, candidate_path: str | Path) -> Outcome:
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
        backends = detect_backends(source)
        refused = [b for b in backends if b not in task.manifest.backends]
        if refused:
            return Outcome(**base | dict(verdict="backend_not_allowed", stage="load",
                                         reason=f"candidate uses {', '.join(refused)}; the task allows "
                                                f"{', '.join(task.manifest.backends)}"),
                           details={"backends": backends})

        # A kept job folder goes beside the pipeline's (which goes with the pipeline), for the user to read.
        job = Path(tempfile.mkdtemp(prefix="eval-", dir=self.folder.root if s.keep_job_dir else self.folder.path))
        with contextlib.ExitStack() as held:  # host memory, held until the job folder is gone
            try:
                return self._run(task, candidate_path, job, device, mode, base, backends, held)
            finally:
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

    def _common_spec(self, task: Task, device: str, mode: str) -> dict:
        return {"device": device, "dtype": task.manifest.dtype, "seeds": list(range(task.manifest.seeds)),
                "shapes": [vars(sh) for sh in task.shapes(mode)], "timing_budget_s": self.settings.timing_budget_s}

    def _key(self, task: Task, device: str, mode: str) -> str:
        return "|".join([str(task.path), hashlib.sha256((task.source + task.manifest_text).encode()).hexdigest(), mode,
                         device, ",".join(self.settings.baselines)])

    def _kept_inputs(self, task: Task, device: str, mode: str, wall: dict, turns: list[dict],
                     ahead: bool = False) -> tuple[Path, dict]:
        """(inputs dir, prepare's result) for this task, prepared by the first caller; the others wait for it.
        A preparation made `ahead` of any evaluation is charged (wall seconds, device turns) to the first one."""
        s = self.settings
        key = self._key(task, device, mode)
        with self._once:
            kept = self._prepared.get(key)
            if kept and kept[0].is_dir():
                if ahead:
                    return kept  # what was charged (or is pending) stays so
                ahead_wall, ahead_turns = self._prepared_ahead.pop(key, (0.0, []))
                wall["prepare"] = ahead_wall
                turns.extend(ahead_turns)
                return kept
            inputs_dir = Path(tempfile.mkdtemp(prefix="inputs-", dir=self.folder.path))
            reference = Path(tempfile.mkdtemp(prefix="prepare-", dir=self.folder.path))
            try:
                shutil.copy(task.path, reference / "task.py")
                spec = self._common_spec(task, device, mode) | {"task_file": str(reference / "task.py"),
                                                                "task_display": str(task.path)}
                self._prepared[key] = (inputs_dir, self._prepare(task, spec, inputs_dir, reference, wall, turns))
                if ahead:
                    self._prepared_ahead[key] = (wall["prepare"], list(turns))
            except BaseException:
                shutil.rmtree(inputs_dir, ignore_errors=True)
                raise
            finally:
                shutil.rmtree(reference, ignore_errors=True)
            return self._prepared[key]

    def _prepare(self, task: Task, task_spec: dict, inputs_dir: Path, workdir: Path, wall: dict,
                 turns: list[dict]) -> dict:
        """The baselines are timed with the device to themselves; candidates of the task wait for them. A worker's
        first prepare on a GPU also measures the GPU's ceilings, in the same exclusive process, unless they are cached
        (a cache of another GPU model or driver is measured again by _measure_ceilings)."""
        s = self.settings
        cache = self._ceilings_cache()
        ceilings = task_spec["device"] == "cuda" and self._ceilings is None and not (cache and cache.is_file())

        def run(with_ceilings: bool) -> dict:
            return self._harness(["prepare"], task_spec | {"baselines": list(s.baselines),
                                                           "inputs_dir": str(inputs_dir), "ceilings": with_ceilings},
                                 workdir=workdir, rw=[inputs_dir], timeout=s.reference_timeout_s, task=task,
                                 wall=wall, turns=turns, exclusive=True, resident_bytes=self._whole_budget())

        try:
            result = run(ceilings)
        except InfrastructureError:
            if not ceilings:
                raise
            # The ceilings are measured first (before any task code): a prepare that crashed with them is run once
            # more without, so that measuring them can cost the roofline, never the task.
            result = run(False)
        measured = result.pop("ceilings", None)
        if isinstance(measured, dict) and "measured" in measured:
            with self._ceilings_lock:
                self._keep_ceilings(measured, result["environment"])
        return result

    def _run(self, task, candidate_path, job, device, mode, base, backends, held: contextlib.ExitStack) -> Outcome:
        s = self.settings
        wall: dict[str, float] = {}  # seconds per process of this evaluation
        turns: list[dict] = []  # device turns of this evaluation's processes
        # spec: what the candidate's harness reads, mounted read-only in its jail (a candidate must not rewrite what
        # its retry alone or its profile run will read).
        dirs = {k: job / k for k in ("reference", "inputs", "candidate", "outputs", "check", "spec")}
        for d in dirs.values():
            d.mkdir()
        shutil.copy(task.path, dirs["reference"] / "task.py")
        shutil.copy(candidate_path, dirs["candidate"] / "candidate.py")
        common = self._common_spec(task, device, mode) | {"inputs_dir": str(dirs["inputs"]),
                                                          "outputs_dir": str(dirs["outputs"])}
        shapes = common["shapes"]
        task_spec = common | {"task_file": str(dirs["reference"] / "task.py"), "task_display": str(task.path)}

        # 1. Inputs and baselines, from the task's own code (or kept from an earlier candidate of this task).
        if s.reuse_inputs:
            inputs_dir, prepared = self._kept_inputs(task, device, mode, wall, turns)
            dirs["inputs"] = inputs_dir
            for spec in (common, task_spec):
                spec["inputs_dir"] = str(inputs_dir)
        else:
            prepared = self._prepare(task, task_spec, dirs["inputs"], dirs["reference"], wall, turns)
        environment = prepared["environment"]
        details = {"backends": backends, "shapes": prepared["shapes"], "wall_s": wall, "gpu_index": self.jail.gpu}
        cand_bytes, check_bytes = resident_estimate(Path(common["inputs_dir"]), common, prepared["shapes"])
        output_files = _expected_output_files(common["seeds"], prepared["shapes"])
        # Host memory for this evaluation's processes and output files, before either process starts.
        host_bytes = evaluation_bytes(sum(output_files.values()), device, in_memory(dirs["outputs"]))
        waited = held.enter_context(self.host_memory.hold(host_bytes))
        budget = self.host_memory.budget()
        details["host_memory"] = {"held_gib": round(host_bytes / 2**30, 2), "wait_s": round(waited, 2),
                                  "budget_gib": None if budget is None else round(budget / 2**30, 1)}

        # The trusted check starts now, beside the candidate: its start-up (Python, torch, the task) overlaps the
        # candidate's run, and it reads nothing until told to go (step 3); any other way out of here stops it.
        check = _EarlyCheck(lambda: self._harness(
            ["check"], task_spec | {"prepared_shapes": prepared["shapes"], "tolerances": task.tolerances(),
                                    "go_file": str(dirs["check"] / "go"), "stop_file": str(dirs["check"] / "stop")},
            workdir=dirs["check"], ro=[dirs["reference"], dirs["inputs"], dirs["outputs"]],
            timeout=2 * s.candidate_timeout_s + s.reference_timeout_s,  # the candidate may run twice (see below)
            task=task, wall=wall, turns=turns, resident_bytes=check_bytes), dirs["check"])
        try:
            # 2. The candidate, which sees its own file and the inputs, nothing else.
            cand_spec = common | {"candidate_file": str(dirs["candidate"] / "candidate.py"),
                                  "output_bytes": output_files}
            spec_path = dirs["spec"] / "spec.json"
            spec_path.write_text(json.dumps(cand_spec | {"result": str(dirs["candidate"] / "result.json")}))
            run, cand = self._candidate(dirs, spec_path, cand_bytes, wall, turns, details,
                                        disk_bytes=self.jail.disk_bytes + sum(output_files.values()))
            details["device_turns"] = _sum_turns(turns)
            details["candidate_stderr"] = run.stderr[-4000:]
            details["jail"] = {"limits": run.limits, "limit_events": run.limit_events, "output_bytes": run.output_bytes}
            failure = _candidate_failure(run, cand, s.candidate_timeout_s)
            if failure and (why := _host_out_of_memory(run, failure)):
                raise InfrastructureError(why)
            # A candidate killed for its own disk cap filled its own share; only a plain ENOSPC may be the host's.
            if failure and failure[0] in ("crashed", "runtime_error", "disk_limit") and \
                    "disk_limit" not in run.limit_events and (
                    short := _no_room_for_outputs(dirs["outputs"], sum(cand_spec["output_bytes"].values()))):
                raise InfrastructureError(f"the candidate failed ({failure[2][:200]}) while the host had no room for "
                                          f"its outputs: {short}; not the candidate's failure")
            if failure:
                verdict, stage, reason = failure
                if "retried_alone" in details:
                    reason += (" (retried alone after running out of memory beside other evaluations: it also "
                               "failed with the device to itself)")
                details.update({k: cand[k] for k in ("traceback", "line", "type") if k in (cand or {})})
                reason = reason.replace("candidate.py line", f"{candidate_path} line")
                return Outcome(**base | dict(verdict=verdict, stage=stage, reason=reason),
                               environment=environment, details=details)

            details["provenance"] = cand.get("provenance", {})
            details["stage_s"] = {"candidate": cand.get("stage_s")}
            if wall.get("prepare"):  # the evaluation that prepared the task's inputs (or is charged for it)
                details["stage_s"]["prepare"] = prepared.get("stage_s")
            fallback = _library_fallback(cand.get("provenance"), prepared["shapes"][0].get("ops", []))
            if fallback:
                return Outcome(**base | dict(verdict="library_fallback", stage="correctness", reason=fallback),
                               environment=environment, details=details)
            tampered = _outputs_tampered(dirs["outputs"], prepared["shapes"])
            if tampered:
                return Outcome(**base | dict(verdict="tampering", stage="correctness", reason=tampered),
                               environment=environment, details=details)

            # 3. The trusted comparison against a float64 reference, by the check process started above.
            checked = check.go()
        finally:
            check.cancel()  # nothing to do once it was told to go
        details["cases"] = checked["cases"]
        details["stage_s"]["check"] = checked.get("stage_s")
        details["device_turns"] = _sum_turns(turns)
        details["device_gate"] = self.gate.occupancy()  # the device's states so far (benchmarks read the change)
        bad = [c for c in checked["cases"] if c["kind"] != "pass"]
        if bad:
            return Outcome(**base | dict(verdict=bad[0]["kind"], stage="correctness", reason=bad[0]["reason"]),
                           environment=environment, details=details)

        ceilings = self._device_ceilings(job, environment, turns) if device == "cuda" else None
        usable = ceilings if ceilings and "measured" in ceilings else None  # not when measuring them failed
        timings = _timing_rows(task, shapes, prepared["timings"], cand["timings"], device, usable)
        main_row = next((t for t in timings if t["shape"] == "main" and t["implementation"] == "candidate"), {})
        details["evidence"] = {"launches_per_call": details["provenance"].get("own_launches"),
                               "roofline_fraction": main_row.get("roofline_fraction"),
                               "energy_j_per_call": main_row.get("energy_j_per_call"), "ceilings": ceilings}
        for row in (t for t in timings if t["implementation"] == "candidate"):
            where = f" at shape {row['shape']}"
            if why := evidence.timer_mismatch(row):
                return Outcome(**base | dict(verdict="timing_mismatch", stage="timing", reason=why + where),
                               timings=timings, environment=environment, details=details)
            if why := evidence.impossible(usable, row.get("flops"), row.get("bytes"), task.manifest.dtype,
                                          row["median_ms"]):
                return Outcome(**base | dict(verdict="impossible", stage="timing", reason=why + where),
                               timings=timings, environment=environment, details=details)
        main = {t["implementation"]: t for t in timings if t["shape"] == "main"}
        if s.profile and device == "cuda" and (self.profile_if is None or self.profile_if(_speedup(main, "eager"))):
            details["ncu"] = self._profile(dirs, spec_path, turns)
            details["device_turns"] = _sum_turns(turns)
        return Outcome(**base | dict(reason=_pass_reason(main, device)), timings=timings,
                       speedup_vs_eager=_speedup(main, "eager"), speedup_vs_compile=_speedup(main, "compile"),
                       environment=environment, details=details)

    def _candidate(self, dirs: dict[str, Path], spec_path: Path, nbytes: int, wall: dict, turns: list[dict],
                   details: dict, disk_bytes: int | None = None) -> tuple[JailResult, dict | None]:
        """The candidate process and its result record. Its folders may hold `disk_bytes`: the jail's disk cap
        beside the outputs it must write."""

        def once(resident_bytes: int | None) -> tuple[JailResult, dict | None]:
            run = self.jail.run([_python(), "-m", "sandbox.harness.candidate", str(spec_path)],
                                workdir=dirs["candidate"], ro=[dirs["inputs"], dirs["spec"]], rw=[dirs["outputs"]],
                                timeout_s=self.settings.candidate_timeout_s, gate=self.gate,
                                resident_bytes=resident_bytes, disk_bytes=disk_bytes)
            turns.append(run.turns or {})
            wall["candidate"] = round(wall.get("candidate", 0.0) + run.wall_s, 2)
            return run, read_result(dirs["candidate"] / "result.json")

        run, cand = once(nbytes)
        # Out of device memory beside other evaluations may be their doing, not the candidate's (the budget holds
        # estimates, and a neighbour may allocate more than its own): once more, alone (None: admitted only when
        # nothing else is resident); that run's verdict stands. Not when what it asked for would not fit beside its own
        # share even alone: a retry would wait for the device to empty for nothing.
        if (_out_of_memory(cand) and (run.turns or {}).get("neighbours") and self._could_fit_alone(cand, nbytes)
                and _emptied(dirs["outputs"])):
            details["retried_alone"] = str(cand.get("reason"))
            (dirs["candidate"] / "result.json").unlink(missing_ok=True)
            run, cand = once(None)
        return run, cand

    def _profile(self, dirs: dict[str, Path], spec_path: Path, turns: list[dict]) -> dict:
        """Nsight Compute over one call of the (already passed) candidate, in the same jail as its evaluation."""
        ncu = shutil.which("ncu") or next((p for p in NCU_PATHS if os.path.isfile(p)), None)
        if not ncu:
            return {"error": "Nsight Compute (ncu) is not installed on this host; install the CUDA toolkit's "
                             "nsight-compute package to get profiles"}
        log = dirs["candidate"] / "ncu.csv"
        run = self.jail.run([*evidence.ncu_command(ncu, str(log)), _python(), "-m", "sandbox.harness.candidate",
                             str(spec_path), "--profile"],
                            workdir=dirs["candidate"], ro=[dirs["inputs"], dirs["spec"]], timeout_s=300,
                            gate=self.gate,
                            exclusive=True, resident_bytes=self._whole_budget())
        turns.append(run.turns or {})
        text = _read_text(log, MAX_RESULT_BYTES)
        summary = evidence.ncu_summary(text) if text else {}
        if run.returncode != 0 or not text or "error" in summary:
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

    def _harness(self, args: list[str], spec: dict, *, workdir: Path, timeout: float, task: Task, wall: dict,
                 turns: list[dict], ro=(), rw=(), exclusive: bool = False, resident_bytes: int = 0) -> dict:
        """Run a trusted reference-harness command; a failure here is the task's fault or ours, never the candidate's."""
        result_path = workdir / f"{args[0]}-result.json"
        spec_path = workdir / f"{args[0]}-spec.json"
        spec_path.write_text(json.dumps(spec | {"result": str(result_path)}))

        def once(resident: int | None) -> tuple[JailResult, dict | None]:
            result_path.unlink(missing_ok=True)
            run = self.jail.run([_python(), "-m", "sandbox.harness.reference", *args, str(spec_path)],
                                workdir=workdir, ro=list(ro), rw=list(rw), timeout_s=timeout, gate=self.gate,
                                exclusive=exclusive, resident_bytes=resident)
            wall[args[0]] = round(wall.get(args[0], 0.0) + run.wall_s, 2)
            turns.append(run.turns or {})
            return run, read_result(result_path)

        run, result = once(resident_bytes)
        # Out of device memory beside other evaluations (their estimates are estimates): once more, alone, as a
        # candidate would be. A trusted process must not end the run for what its neighbours held.
        if result and result.get("status") == "out_of_memory" and (run.turns or {}).get("neighbours"):
            run, result = once(None)
        if result and result.get("status") == "out_of_memory":
            raise TaskError(str(task.path), f"the reference ({args[0]}) ran out of device memory with the device to "
                                            f"itself: {str(result.get('message'))[:600]}")
        if run.timed_out:
            raise TaskError(str(task.path), f"the reference ({args[0]}) did not finish within {timeout:.0f} s")
        for event, limit, setting in (("disk_limit", "disk_bytes", "APPLIANCE_JAIL_DISK_GIB"),
                                      ("oom_kill", "memory_bytes", "APPLIANCE_JAIL_MEMORY_GIB")):
            if run.limit_events.get(event):
                raise TaskError(str(task.path), f"the reference ({args[0]}) needs more than the jail's "
                                                f"{run.limits.get(limit, 0) / 2**30:.3g} GiB ({event}): raise "
                                                f"{setting} (or eval's --{'disk' if event == 'disk_limit' else 'memory'}"
                                                "-limit)")
        if result is None or run.returncode != 0:
            raise InfrastructureError(
                f"reference harness ({args[0]}) failed with exit code {run.returncode}: {run.stderr[-3000:]}")
        if result["status"] == "task_error":
            raise TaskError(str(task.path), result["reason"], result.get("line"))
        return result


@dataclass
class RemoteJail:
    """What the loop reads of a remote pipeline's jail (worker processes, Ray actors): the worker's GPU, or None."""

    gpu: int | None
    unsafe_no_jail: bool


def evaluate_sent(pipeline: Pipeline, tasks: RebuiltTasks, files: dict, source: str, display_path: str,
                  job_root: Path) -> Outcome:
    """An evaluation sent from another process or host (worker processes, Ray actors): the task and the candidate
    arrive as text and are written under `job_root`; the outcome and a TaskError name the sender's files."""
    job = Path(tempfile.mkdtemp(prefix="candidate-", dir=job_root))
    try:
        task = tasks.get(files)
        path = job / Path(display_path).name
        path.write_text(source)
        outcome = pipeline.evaluate(task, path)
    except TaskError as e:
        if e.path.startswith(str(tasks.root)):  # our copy of the task: name the sender's
            raise TaskError(files["path"], e.message, e.line) from None
        raise
    finally:
        remove_tree(job)
    outcome.reason = outcome.reason.replace(str(path), display_path)
    return outcome


class _EarlyCheck:
    """The check process of one evaluation, started before the candidate's outputs exist (sandbox.harness.reference
    `check` waits for `go_file` or `stop_file` in its workdir before it reads anything)."""

    def __init__(self, start: Callable[[], dict], folder: Path):
        self.go_file, self.stop_file = folder / "go", folder / "stop"
        self.result: dict | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(start,), daemon=True, name="check")
        self.thread.start()

    def _run(self, start: Callable[[], dict]) -> None:
        try:
            self.result = start()
        except BaseException as e:  # noqa: BLE001 - raised in the evaluating thread, by go()
            self.error = e

    def go(self) -> dict:
        self.go_file.touch()
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.result

    def cancel(self) -> None:
        if not self.go_file.exists():
            self.stop_file.touch()
            self.thread.join()  # its errors are moot: the evaluation ended before the check was needed


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
            "held_s_by_process": [t.get("held_s", 0.0) for t in turns]}


def _python() -> str:
    import sys

    return sys.executable


MAX_RESULT_BYTES = 4 << 20
# What the candidate harness may report. Anything else in its result file was written by the candidate.
HARNESS_FAILURES = {"load_error", "compile_error", "runtime_error", "wrong_output", "input_mutated", "tampering",
                    "sandbox_violation", "deferred_work"}


NCU_PATHS = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu")


def _read_text(path: Path, limit: int) -> str | None:
    """A file the candidate could have written to: never follow a link, never block on a FIFO, never read more
    than `limit` bytes. None if it is not a small regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return os.read(fd, limit).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _ceilings_key(environment: dict) -> str:
    """Cached ceilings hold for one GPU model and driver."""
    return f"{environment.get('gpu')}|{environment.get('driver')}"


def read_result(path: Path) -> dict | None:
    """A result file's JSON object, or None."""
    text = _read_text(path, MAX_RESULT_BYTES)
    try:
        data = json.loads(text) if text is not None else None
    except (ValueError, RecursionError):  # a candidate can write JSON nested deeper than the parser's stack
        return None
    return data if isinstance(data, dict) else None


def _malformed(result: dict) -> str | None:
    """Why a candidate result cannot have come from the harness, or None when it is well-formed."""
    status = result.get("status")
    if status == "running":
        return None if result.get("stage") in STAGES else "an unknown stage"
    if status == "failed":
        if result.get("verdict") not in HARNESS_FAILURES:
            return f"verdict {str(result.get('verdict'))[:40]!r}, which the harness never reports"
        if result.get("stage") not in STAGES[:-1] or not isinstance(result.get("reason"), str):
            return "a failure without a valid stage and reason"
        return None
    if status == "ok":
        timings = result.get("timings")
        if not isinstance(timings, dict) or not all(
                isinstance(t, dict) and isinstance(t.get("median_ms"), (int, float)) and t["median_ms"] > 0
                for t in timings.values()):
            return "timings that are not positive numbers"
        return None
    return f"status {str(status)[:40]!r}"


def _library_fallback(provenance: dict | None, reference_ops: list[str]) -> str | None:
    """A finding, not a speedup: no kernel of the candidate's own, or the reference's library ops called anyway."""
    from sandbox.harness.provenance import compute_ops

    if not isinstance(provenance, dict) or not isinstance(provenance.get("ops"), list):
        return "the candidate harness reported no record of what forward ran"
    used = compute_ops(provenance["ops"])
    if not provenance.get("own_launches"):
        library = f" (it only called library ops: {', '.join(sorted(used))})" if used else ""
        return f"forward launched no kernel of its own (Triton, load_inline or CuPy){library}"
    ref = compute_ops(reference_ops)
    if ref and ref <= used:
        return (f"forward calls the reference's own library ops ({', '.join(sorted(ref))}) beside its kernel: "
                "a library fallback, not a speedup")
    return None


def _outputs_tampered(outputs: Path, shapes: list[dict]) -> str | None:
    """The outputs directory may hold only regular files the harness writes (sandbox/harness/transfer.py: no links,
    FIFOs, devices), none much larger than the outputs it should hold: the trusted check must not be the one that
    runs out of memory."""
    expected = {s["name"]: _output_bytes(s) for s in shapes}
    for entry in os.scandir(outputs):
        stem, dot, suffix = entry.name.rpartition(".")  # "SHAPE-SEED" or "timed-SHAPE", then "bin" or "json"
        if not entry.is_file(follow_symlinks=False) or not dot or suffix not in ("bin", "json"):
            return f"the candidate left {entry.name!r} in its outputs, which is not a regular .bin or .json file"
        shape = stem.removeprefix("timed-") if stem.startswith("timed-") else stem.rsplit("-", 1)[0]
        limit = output_file_limit(expected.get(shape, 0)) if suffix == "bin" else RECORD_MAX_BYTES
        if entry.stat(follow_symlinks=False).st_size > limit:
            return f"the candidate's output file {entry.name!r} is larger than its outputs can be ({limit} bytes)"
    return None


def _expected_output_files(seeds: list, shapes: list[dict]) -> dict[str, int]:
    """The output files an honest candidate writes (sandbox/harness/transfer.py), and their sizes: it allocates
    them ahead of time."""
    files = {}
    for shape in shapes:
        size = _output_bytes(shape)
        files |= {output_name(shape["name"], seed): size for seed in seeds} | {output_name(shape["name"]): size}
    return files


def _output_bytes(shape: dict) -> int:
    """Bytes of one call's outputs at a prepared shape (prepare's record: dtype and shape of each)."""
    return sum(math.prod(o["shape"]) * DTYPE_BYTES.get(o["dtype"], 8) for o in shape["outputs"])


def resident_estimate(inputs_dir: Path, spec: dict, prepared_shapes: list[dict]) -> tuple[int, int]:
    """Device bytes that the candidate and the check process of one evaluation hold while resident (the gate's
    memory budget, sandbox/gate.py), from trusted data only: the input files `prepare` wrote (one per shape and
    seed) and the outputs it recorded, never anything the candidate says.

      candidate: every input set (uploaded once, kept until timed), every output it saves (per seed and the timed
        call's, kept until written after timing), and at its busiest moment beside them: one call's snapshot of its
        inputs and the comparison's temporaries, and two calls' outputs (a correctness call's and its clone, or
        the timing loop's call and the one before): the largest set and the largest outputs twice each;
        PROCESS_ALLOWANCE_BYTES;
      check: one case at a time (sandbox.harness.reference uploads a case when it checks it): the largest case's
        input set and outputs, their float64 copies (the reference is recomputed in float64), the comparison's
        float64 temporaries (CHECK_COMPARE_BYTES: it works in chunks), and PROCESS_ALLOWANCE_BYTES.

    An estimate: a candidate that allocates much more (workspaces) may run out of memory beside its neighbours,
    and is then run again alone (Pipeline._candidate)."""
    seeds = spec["seeds"]
    widen = 8 / DTYPE_BYTES.get(spec["dtype"] or "float32", 4)  # to float64
    strided = {s["name"] for s in spec["shapes"] if s.get("layout") == "strided"}  # twice as wide on the device
    inputs = outputs = largest_set = largest_out = largest_case = 0
    for shape in prepared_shapes:
        sets = [(inputs_dir / f"{shape['name']}-{seed}.pt").stat().st_size * (2 if shape["name"] in strided else 1)
                for seed in seeds]
        out = _output_bytes(shape)
        inputs += sum(sets)
        outputs += out * (len(seeds) + 1)
        largest_set, largest_out = max(largest_set, *sets), max(largest_out, out)
        out_f64 = sum(math.prod(o["shape"]) * 8 for o in shape["outputs"])
        largest_case = max(largest_case, max(sets) * (1 + widen) + out + out_f64)
    candidate = inputs + outputs + 2 * largest_set + 2 * largest_out + PROCESS_ALLOWANCE_BYTES
    check = int(largest_case) + CHECK_COMPARE_BYTES + PROCESS_ALLOWANCE_BYTES
    return candidate, check


def _emptied(folder: Path) -> bool:
    """Empty a folder the candidate wrote, in place (the waiting check has it mounted); False when something in it
    cannot be removed (a tree too deep for rmtree, a folder it made unreadable): then there is no retry."""
    try:
        for entry in folder.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    except (OSError, RecursionError):
        return False
    return True


def _out_of_memory(result: dict | None) -> bool:
    """The candidate harness reported an out-of-memory error (its type and message, see candidate._failure)."""
    return (isinstance(result, dict) and result.get("status") == "failed" and result.get("verdict") == "runtime_error"
            and (str(result.get("type", "")).endswith("OutOfMemoryError")
                 or "out of memory" in str(result.get("message", "")).lower()))


def _memory_budget(gpu: int | None) -> int | None:
    """What the evaluations in flight on `gpu` may hold at once: MEMORY_BUDGET_FRACTION of its memory (NVML).
    None (no bound) on the CPU, or where NVML cannot say."""
    if gpu is None:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(gpu)).total
    except Exception:  # noqa: BLE001 - no NVML here: evaluations are bounded by slots alone, as before
        return None
    return int(total * MEMORY_BUDGET_FRACTION)


def _evaluation_gpus() -> int:
    """This host's evaluation GPUs, each with a worker of its own sharing the host's memory: its GPUs (NVML) but
    the model server's (APPLIANCE_LLM_GPU, as `optimize` and `doctor` read it); 1 where NVML cannot say."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # noqa: BLE001 - no NVML: this device is taken to be the host's only one
        return 1
    serving = os.environ.get("APPLIANCE_LLM_GPU", "").strip()
    return max(1, count - (serving.isdigit() and int(serving) < count))


def _no_room_for_outputs(outputs: Path, need: int) -> str | None:
    """Why a crashed candidate may have crashed for want of room on the host (writing its outputs raises ENOSPC): the
    outputs' file system has less free than the outputs take. One that filled the disk with files of its own is
    still to blame (it wrote more than its outputs take)."""
    try:
        st = os.statvfs(outputs)
        entries = [e.stat(follow_symlinks=False).st_size for e in os.scandir(outputs)]
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if sum(entries) > need + RECORD_MAX_BYTES * len(entries) or free >= need:  # records (NAME.json) aside
        return None
    return f"{free >> 20} MiB free for {need >> 20} MiB of outputs in {outputs}"


def _candidate_failure(run: JailResult, result: dict | None, timeout: float) -> tuple[str, str, str] | None:
    why = _malformed(result) if result is not None else None
    if why:
        return "tampering", "correctness", f"the candidate's result record was not written by the harness: {why}"
    stage = result.get("stage", "load") if result else "load"
    events, limits = run.limit_events, run.limits
    # A limit that bit explains whatever came after it (a MemoryError, a failed fork, a killed process).
    if events.get("oom_kill"):
        return "memory_limit", stage, (f"the candidate exceeded its memory limit of "
                                       f"{limits.get('memory_bytes', 0) / 2**30:.3g} GiB and was killed")
    if events.get("pids_max") and (run.returncode != 0 or (result or {}).get("status") != "ok"):
        return "process_limit", stage, (f"the candidate hit its limit of {limits.get('pids_max')} processes/threads "
                                        f"({events['pids_max']} forks refused)")
    if "disk_limit" in events:
        return "disk_limit", stage, (f"the candidate's folders grew past their disk cap of "
                                     f"{limits.get('disk_bytes', 0) / 2**30:.3g} GiB "
                                     f"({events['disk_limit'] / 2**30:.3g} GiB seen) and it was killed")
    if run.timed_out:
        return "timeout", stage, f"the candidate did not finish within {timeout:.0f} s (wall clock); killed"
    if run.signal == signal.SIGSYS:
        return "sandbox_violation", stage, ("the candidate made a forbidden system call and was killed by the "
                                            "jail's seccomp filter (SIGSYS)")
    cpu_limit = limits.get("cpu_seconds")
    if run.signal == signal.SIGXCPU or (run.signal == signal.SIGKILL and cpu_limit and run.cpu_s is not None
                                        and run.cpu_s >= cpu_limit):
        return "cpu_limit", stage, (f"the candidate used up its CPU-time limit of {cpu_limit} s "
                                    f"({run.cpu_s or cpu_limit:.0f} s used) and was killed")
    if run.signal == signal.SIGXFSZ:
        return "disk_limit", stage, f"the candidate wrote a file larger than {limits.get('file_bytes', 0) >> 20} MiB"
    said = " ".join(str((result or {}).get(k, "")) for k in ("reason", "traceback")) + run.stderr[-4000:]
    failed = run.returncode != 0 or (result or {}).get("status") != "ok"
    # Without a pids controller, the process limit is RLIMIT_NPROC: the kernel counts nothing we can read, but the
    # candidate's own failure says it (believed only to fail it: a candidate can always fail itself).
    if failed and limits.get("processes") == "RLIMIT_NPROC" and _NPROC_WORDS.search(said):
        return "process_limit", stage, (f"the candidate hit its limit of {limits.get('pids_max')} processes/threads "
                                        "(RLIMIT_NPROC: a fork or thread was refused)")
    if failed and ("No space left on device" in said or "File too large" in said):
        return "disk_limit", stage, ("the candidate filled the space it may write (its folders, or the jail's "
                                     f"private /tmp of {limits.get('scratch_bytes', 0) >> 20 or 'capped'} MiB): "
                                     "No space left on device")
    if result is None or result.get("status") == "running" or run.returncode != 0:
        if run.signal:
            how = f"was killed by signal {_signal_name(run.signal)}"
        else:
            how = f"exited with code {run.returncode} before reporting a result"
        tail = run.stderr.strip().splitlines()[-1:] or [""]
        return "crashed", stage, f"the candidate process {how}; last stderr line: {tail[0][:300]}"
    if result["status"] == "failed":
        return result["verdict"], result["stage"], result["reason"]
    return None


_NPROC_WORDS = re.compile(r"BlockingIOError|Resource temporarily unavailable|can't start new thread|EAGAIN")


def _host_out_of_memory(run: JailResult, failure: tuple[str, str, str]) -> str | None:
    """Why a candidate's crash is the host's doing: killed by SIGKILL, which no limit of ours sent (a cgroup's
    OOM kill is `memory_limit`, a timeout `timeout`), while the kernel's OOM killer fired on a host whose jobs run
    without cgroups: the host ran short of memory (everything in flight allocates), and the candidate was its
    victim. Queued again, not blamed; a
    candidate that exhausts the host's memory itself fails again on its second try and is then recorded as an
    infrastructure failure, never a pass (where cgroups apply, its own limit stops it first)."""
    kills = run.limit_events.get("host_oom_kills")
    # Only where no cgroup bounded the jobs: the kernel's count includes cgroup OOM kills, so beside cgroups a
    # neighbour's `memory_limit` would excuse a candidate that killed itself.
    caged = not str(run.limits.get("cgroup", "unavailable")).startswith("unavailable")
    if failure[0] != "crashed" or run.signal != signal.SIGKILL or not kills or caged:
        return None
    return (f"the candidate was killed by SIGKILL at {failure[1]} while the host's OOM killer fired ({kills} kill(s) "
            "during its run): the host ran out of memory, which is not the candidate's failure")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


# Numbers the timing loop may report beside the median (GPU only): the device-wide cross-check and energy.
GPU_EVIDENCE = ("device_wide_ms", "sync_latency_ms", "energy_j_per_call", "avg_power_w")


def _timing_rows(task: Task, shapes: list[dict], baselines: dict, candidate: dict, device: str,
                 ceilings: dict | None) -> list[dict]:
    rows = []
    for sh in shapes:
        name = sh["name"]
        flops, nbytes = task.work(sh["sizes"])
        impls = {"candidate": candidate.get(name, {})} | baselines.get(name, {})
        for impl, t in impls.items():
            row = {"shape": name, "sizes": sh["sizes"], "implementation": impl, "device": device,
                   "median_ms": t.get("median_ms"), "iqr_ms": t.get("iqr_ms"), "min_ms": t.get("min_ms"),
                   "reps": t.get("reps"), "error": t.get("error"), "flops": flops, "bytes": nbytes}
            row |= {k: t[k] for k in GPU_EVIDENCE if isinstance(t.get(k), (int, float))}
            if t.get("median_ms") and flops:
                row["tflops"] = flops / t["median_ms"] / 1e9
            if t.get("median_ms") and nbytes:
                row["gbps"] = nbytes / t["median_ms"] / 1e6
            row |= evidence.roofline(ceilings, flops, nbytes, task.manifest.dtype, t.get("median_ms"))
            rows.append(row)
    return rows


def _speedup(main: dict, baseline: str) -> float | None:
    cand, base = main.get("candidate", {}).get("median_ms"), main.get(baseline, {}).get("median_ms")
    return base / cand if cand and base else None


def _pass_reason(main: dict, device: str) -> str:
    cand = main["candidate"]["median_ms"]
    label = "" if device == "cuda" else " (CPU timing)"
    parts = [f"correct on every shape and seed; main shape {cand:.4g} ms{label}"]
    for b in ("eager", "compile"):
        sp = _speedup(main, b)
        if sp:
            parts.append(f"{sp:.3g}x vs {b}")
    return ", ".join(parts)
