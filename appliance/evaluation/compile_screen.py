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
import threading
from contextlib import contextmanager
from pathlib import Path

from appliance.evaluation.job_folders import remove_tree
from appliance.evaluation.pipeline import Outcome
from appliance.evaluation.records import read_result
from appliance.tasks import Task
from sandbox.jail import Jail

SCREEN_TIMEOUT_S = 60.0  # per step (record, build): one forward at the small size under the interpreter, then the build


class CompileScreen:
    def __init__(self, jail: Jail, jobs_dir: Path, arch: int, slots: int = 2, timeout_s: float = SCREEN_TIMEOUT_S):
        self.jail, self.jobs_dir, self.arch, self.slots, self.timeout_s = jail, Path(jobs_dir), arch, slots, timeout_s
        self.host = platform.node()
        self.off: str | None = None  # why this host cannot check anything (its compiler failed a known-good kernel)
        self._canary_checked = threading.Lock()
        self._canary_done = False

    def screen(self, task: Task, candidate_path: str | Path, display_path: str | None = None) -> Outcome | None:
        """An Outcome when a kernel of the candidate does not build for sm_{arch}; None to evaluate it on the GPU."""
        if not self._works():
            return None
        where = str(display_path or candidate_path)
        with self._job() as (specs, work):
            shutil.copy(candidate_path, specs / "candidate.py")
            shutil.copy(task.path, specs / "task.py")
            spec = {"task_file": str(specs / "task.py"), "candidate_file": str(specs / "candidate.py"),
                    "sizes": task.shapes("small")[0].sizes, "dtype": task.manifest.dtype, "arch": self.arch,
                    "launches_file": str(work / "record-result.json")}
            # Every spec is written before any of the candidate's code runs, where the jail mounts it read-only.
            for command in ("record", "build"):
                result = {"result": str(work / f"{command}-result.json")}
                (specs / f"{command}.json").write_text(json.dumps(spec | result))
            recorded = self._step("record", specs, work, {"TRITON_INTERPRET": "1"})
            if recorded.get("status") != "recorded":
                return None
            built = self._step("build", specs, work, {})
            if built.get("status") != "compile_error":
                return None
            reason = (f"kernel {built.get('kernel')} of {where} does not build for sm_{self.arch} (Triton's compiler "
                      f"on {self.host}, launched as at the task's small size, before any GPU): "
                      f"{built.get('reason', '')}").replace(str(specs / "candidate.py"), where)
            return Outcome(verdict="compile_error", stage="compile", reason=reason,
                           jailed=not self.jail.unsafe_no_jail, device="cuda", mode="full",
                           details={"screen": {"host": self.host, "arch": self.arch,
                                               "launches": len(recorded.get("launches", []))}})

    def _works(self) -> bool:
        """Once per screen: a known-good kernel must build here, or nothing is checked (never rejected) here."""
        with self._canary_checked:
            if not self._canary_done:
                self._canary_done = True
                try:
                    with self._job() as (specs, work):
                        (specs / "canary.json").write_text(json.dumps({"arch": self.arch,
                                                                       "canary_file": str(work / "canary.py"),
                                                                       "result": str(work / "canary-result.json")}))
                        result = self._step("canary", specs, work, {})
                except Exception as e:  # noqa: BLE001 - no jail here, say: this host checks nothing
                    result = {"reason": f"{type(e).__name__}: {e}"}
                if result.get("status") != "built":
                    self.off = f"a known-good kernel did not build on {self.host}: {result.get('reason', '')}"[:500]
        return self.off is None

    @contextmanager
    def _job(self):
        """(specs, work): specs read-only in the jail, work its writable workdir; removed afterwards."""
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        job = Path(tempfile.mkdtemp(prefix="screen-", dir=self.jobs_dir))
        try:
            (job / "specs").mkdir()
            (job / "work").mkdir()
            yield job / "specs", job / "work"
        finally:
            remove_tree(job)

    def _step(self, command: str, specs: Path, work: Path, env: dict[str, str]) -> dict:
        """One jailed step. Its result comes from the candidate's own process: trusted only to reject itself."""
        self.jail.run([sys.executable, "-m", "sandbox.harness.compile_check", command, str(specs / f"{command}.json")],
                      workdir=work, ro=[specs], env=env, timeout_s=self.timeout_s)
        result = read_result(work / f"{command}-result.json")  # size-bounded, never through a link or a FIFO
        return result or {"status": "inconclusive", "reason": "no result"}
