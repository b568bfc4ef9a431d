"""An evaluator that replays outcomes instead of running candidates: the search loop's tests (who proposes what,
budgets, resumes, selection) run in seconds, with no jail and no kernel; what the jail and the gate do is tested
where they are (tests/evaluation, tests/sandbox).

Outcomes come from a run already stored (`from_run`: each candidate's recorded verdict, timings and evidence, found
again by its normalised source) or from a function of the candidate's source (`decide`), or both: recorded first.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from appliance.errors import TaskError
from appliance.evaluation.pipeline import Outcome
from appliance.proposers.edits import source_hash
from appliance.tasks import Task

TIMING_FIELDS = ("shape", "sizes", "implementation", "device", "median_ms", "iqr_ms", "min_ms", "reps", "error")


class ReplayEvaluator:
    def __init__(self, recorded: dict[str, Outcome] | None = None, decide: Callable[[str], Outcome] | None = None,
                 gpu: int | None = None, slots: int = 2):
        self.recorded, self.decide = dict(recorded or {}), decide
        self.gpu, self.slots = gpu, max(1, slots)
        self.profile_if: Callable[[float | None], bool] | None = None
        self.evaluated: list[str] = []  # source hashes, in the order asked

    @classmethod
    def from_run(cls, store, run_id: int, **kwargs) -> ReplayEvaluator:
        """The outcomes a stored run recorded, keyed by their candidates' normalised sources."""
        timings: dict[int, list] = {}
        for t in store.run_timings(run_id):
            timings.setdefault(t.evaluation_id, []).append({k: getattr(t, k) for k in TIMING_FIELDS})
        recorded = {}
        for c, e in store.run_candidates(run_id):
            if e is None or not c.source:
                continue
            recorded[source_hash(c.source)] = Outcome(
                verdict=e.verdict, stage=e.stage, reason=e.reason, jailed=e.jailed, device=e.device, mode=e.mode,
                memory_limited=e.memory_limited, timings=timings.get(e.id, []), speedup_vs_eager=e.speedup_vs_eager,
                speedup_vs_compile=e.speedup_vs_compile, environment=dict(e.environment or {}),
                details=dict(e.details or {}))
        return cls(recorded, **kwargs)

    def prepare(self, task: Task) -> None:
        pass

    def evaluate(self, task: Task, candidate_path: str | Path) -> Outcome:
        path = Path(candidate_path)
        if not path.is_file():
            raise TaskError(str(path), "no such candidate file")
        source = path.read_text(errors="replace")
        digest = source_hash(source)
        self.evaluated.append(digest)
        if digest in self.recorded:
            return dataclasses.replace(self.recorded[digest])
        if self.decide is None:
            raise KeyError(f"no recorded outcome for {path.name} and no decide function")
        return self.decide(source)

    def cancel_unmeasured(self) -> int:
        return 0  # (a replayed outcome is there at once: nothing waits)

    def close(self) -> None:
        pass
