"""Compile-only work on a host without a GPU: a candidate's Triton kernels are built for the evaluation GPUs'
architecture, jailed, before the candidate takes a GPU worker's slot (sandbox/harness/compile_check.py does the
building). A kernel the compiler refuses gets its verdict here (compile_error, stage compile); anything else, a
check that could not be made included, goes on to the GPU, whose evaluation is the real gate.

On a Ray cluster each CPU-only node runs one screen (appliance/ray_executor.py); an LLM run's loop screens its
queued candidates (the seed included), not the tuner's (settings of a kernel that built already: screening them would
only add to every evaluation's latency). `appliance submit` evaluates a person's candidate directly."""

from __future__ import annotations

import json
import platform
import shutil
import sys
import tempfile
from pathlib import Path

from appliance.evaluation.pipeline import Outcome, read_result, remove_tree
from appliance.tasks import Task
from sandbox.jail import Jail

SCREEN_TIMEOUT_S = 60.0  # per step (record, build): one forward at the small size under the interpreter, then the build


class CompileScreen:
    def __init__(self, jail: Jail, jobs_dir: Path, arch: int, slots: int = 2, timeout_s: float = SCREEN_TIMEOUT_S):
        self.jail, self.jobs_dir, self.arch, self.slots, self.timeout_s = jail, Path(jobs_dir), arch, slots, timeout_s
        self.host = platform.node()

    def screen(self, task: Task, candidate_path: str | Path, display_path: str | None = None) -> Outcome | None:
        """An Outcome when a kernel of the candidate does not build for sm_{arch}; None to evaluate it on the GPU."""
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        job = Path(tempfile.mkdtemp(prefix="screen-", dir=self.jobs_dir))
        try:
            shutil.copy(candidate_path, job / "candidate.py")
            shutil.copy(task.path, job / "task.py")
            spec = {"task_file": str(job / "task.py"), "candidate_file": str(job / "candidate.py"),
                    "sizes": task.shapes("small")[0].sizes, "dtype": task.manifest.dtype, "arch": self.arch,
                    "launches_file": str(job / "record-result.json")}
            recorded = self._step("record", spec, job, {"TRITON_INTERPRET": "1"})
            if recorded.get("status") != "recorded":
                return None
            built = self._step("build", spec, job, {})
            if built.get("status") != "compile_error":
                return None
            where = str(display_path or candidate_path)
            reason = (f"kernel {built.get('kernel')} of {where} does not build for sm_{self.arch} (Triton's compiler "
                      f"on {self.host}, before any GPU): {built.get('reason', '')}").replace(str(job / "candidate.py"),
                                                                                          where)
            return Outcome(verdict="compile_error", stage="compile", reason=reason,
                           jailed=not self.jail.unsafe_no_jail, device="cuda", mode="full",
                           details={"screen": {"host": self.host, "arch": self.arch,
                                               "launches": len(recorded.get("launches", []))}})
        finally:
            remove_tree(job)

    def _step(self, command: str, spec: dict, job: Path, env: dict[str, str]) -> dict:
        """One jailed step. Its result comes from the candidate's own process: trusted only to reject itself."""
        spec_path = job / f"{command}-spec.json"
        spec_path.write_text(json.dumps(spec | {"result": str(job / f"{command}-result.json")}))
        run = self.jail.run([sys.executable, "-m", "sandbox.harness.compile_check", command, str(spec_path)],
                            workdir=job, env=env, timeout_s=self.timeout_s)
        result = read_result(job / f"{command}-result.json")  # the candidate's process wrote it: size-bounded
        return result or {"status": "inconclusive", "reason": f"no result (exit {run.returncode})"}
