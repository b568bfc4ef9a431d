"""The `compile` seed proposer: a run's first candidate, from torch.compile's own Triton kernels for the task
(sandbox/harness/inductor_seed.py writes them out, jailed: it runs the task's code). Where a task has no bundled
baseline and no --from, `appliance optimize` starts here, with or without an LLM; the candidate is untrusted like
any other and goes through the gate. A task Inductor cannot write out (a graph break, a grid type not yet written,
a scan) gets a Proposal failure that says why, and the run starts from the reference instead."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from appliance.evaluation.job_folders import remove_tree
from appliance.evaluation.records import read_result, read_text
from appliance.proposers.base import Proposal
from appliance.tasks import Task
from sandbox.jail import Jail

CAPTURE_TIMEOUT_S = 600.0  # Inductor's code generation, once per shape the gate times (about 5 s each on a CPU)
MAX_SEED_BYTES = 4 << 20


def compile_seed(task: Task, jail: Jail, jobs_dir: Path, device: str, mode: str,
                 timeout_s: float = CAPTURE_TIMEOUT_S) -> Proposal:
    """torch.compile's kernels for every shape the gate times at `mode`, as one candidate source. A bare file's
    derived shapes are drawn anew for each evaluation (tasks.secret_draw): no graph captured ahead could match them,
    so none is; there the seed runs the task's Model (correct, and no fallback at a shape that is not timed)."""
    start = time.monotonic()
    jobs_dir = Path(jobs_dir)
    jobs_dir.mkdir(parents=True, exist_ok=True)
    job = Path(tempfile.mkdtemp(prefix="compile-seed-", dir=jobs_dir))
    try:
        specs, work = job / "specs", job / "work"
        specs.mkdir()
        work.mkdir()
        shutil.copy(task.path, specs / "task.py")
        spec = {"task_file": str(specs / "task.py"), "task_display": task.path.name, "device": device,
                "dtype": task.manifest.dtype, "shapes": [vars(s) for s in task.shapes(mode) if s.timed],
                "workdir": str(work), "result": str(work / "result.json")}
        (specs / "spec.json").write_text(json.dumps(spec))
        run = jail.run([sys.executable, "-m", "sandbox.harness.inductor_seed", str(specs / "spec.json")],
                       workdir=work, ro=[specs], timeout_s=timeout_s)
        result = read_result(work / "result.json") or {}
        latency = time.monotonic() - start
        if result.get("status") != "captured":
            ended = ("timed out" if run.timed_out else f"exit {run.returncode}")
            reason = result.get("reason") if isinstance(result.get("reason"), str) else None
            why = reason or f"the capture ended without a result ({ended}): {run.stderr[-300:]}"
            return Proposal(None, "compile", failure=f"compile seed: {why}"[:2000], mode="compile",
                            latency_s=latency)
        source = read_text(work / "candidate.py", MAX_SEED_BYTES)
        if not source:
            return Proposal(None, "compile", failure="compile seed: the capture wrote no candidate (or one over "
                                                     f"{MAX_SEED_BYTES >> 20} MiB)", mode="compile", latency_s=latency)
        # The result was written where the task's code ran: only well-formed fields make it into the note.
        shapes, library = _names(result.get("shapes")), _names(result.get("library_calls"))
        dropped = [d.split(" ", 1)[0] for d in _names(result.get("dropped_shapes"))]
        count = result.get("kernels") if type(result.get("kernels")) is int else "?"
        note = (f"torch.compile's own kernels ({count} Triton kernels, shapes {', '.join(shapes)}"
                + (f"; library calls kept: {', '.join(library)}" if library else "")
                + (f"; none at {', '.join(dropped)}, which the reference cannot run" if dropped else "") + ")")
        return Proposal(source, "compile", mode="compile", note=note[:500], latency_s=latency)
    finally:
        remove_tree(job)


def _names(value) -> list[str]:
    """A list of short names from the capture's result, or nothing: the task's code could have written anything."""
    if not isinstance(value, list):
        return []
    return [str(v)[:80] for v in value[:50] if isinstance(v, (str, int)) and not isinstance(v, bool)]
