"""The seam between the search loop and whatever evaluates its candidates.

Implemented by `Pipeline` (jailed evaluations in this process), `WorkerPipeline` (a worker process per GPU,
appliance/worker.py), `RayPipeline` (a Ray actor per GPU, appliance/ray_executor.py) and `ReplayEvaluator`
(recorded outcomes, evaluation/replay.py: the loop's tests without a jail). The loop reads nothing else of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

from appliance.evaluation.pipeline import Outcome
from appliance.tasks import Task


class Evaluator(Protocol):
    gpu: int | None  # the evaluation GPU (nvidia-smi index on its host), None on the CPU
    slots: int  # evaluations it takes at once: `evaluate` is called from this many threads
    # Set by the loop (loop.ProfileNewBests): which passing candidates get an Nsight Compute profile, by speedup.
    profile_if: Callable[[float | None], bool] | None

    def prepare(self, task: Task) -> None:
        """Make the task's inputs and baselines ahead of the first candidate (TaskError, InfrastructureError)."""

    def evaluate(self, task: Task, candidate_path: str | Path) -> Outcome:
        """The verdict on one candidate file. A candidate's failure is an Outcome; InfrastructureError when the
        evaluator itself failed (the candidate goes back to the queue), TaskError when the task is broken."""

    def cancel_unmeasured(self) -> int:
        """Call off the evaluations in progress that have not begun measuring (the run's time is up): their
        `evaluate` calls raise EvaluationCancelled soon. Returns how many."""

    def close(self) -> None:
        """Release what it holds (workers, folders); called once when the run ends."""
