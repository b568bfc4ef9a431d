"""`appliance recheck`: evaluate every approved winner again on this host's current GPU, driver and libraries, and
flag regressions: the gate now fails, or the candidate got slower beyond the noise.

Each recheck evaluates exactly what was approved: the candidate's stored source against the task's stored source
and manifest (the files on disk may have changed since), through the same jailed pipeline as `appliance eval`. The
new evaluation is stored in a run of kind "recheck" holding a copy of the candidate (so the original run's
leaderboard is untouched), and a Recheck row links it to the approval with the comparison's result."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from appliance.db import Store, Timing
from appliance.db.models import Approval
from appliance.evaluation.pipeline import EvalSettings, Pipeline, resolve_device
from appliance.review import latest_decisions
from appliance.tasks import load_task
from sandbox.jail import Jail

# Slower beyond the noise: the new median exceeds the old by more than NOISE_IQRS times the noise and by more than
# MIN_SLOWDOWN (medians of short kernels can move a few percent with clocks and placement). The noise is the trusted
# servers' (eager, torch.compile) relative IQR at the shape, before and now, on the candidate's median: the
# candidate's own IQR is its server's to widen (an attacker's review: stalling a third of its timed batches left
# its median alone, put its IQR at 27.8 ms, and a 5 -> 8 ms regression passed as noise). Records without a trusted
# timing at the shape fall back on the candidate's IQRs.
NOISE_IQRS = 3.0
MIN_SLOWDOWN = 0.05
# ... but never more than this fraction of the approved median: a loaded host can time a kernel with an IQR near its
# median, and that must not hide a median twice (or a thousand times) the approved one.
MAX_NOISE = 1.0
TRUSTED_SERVERS = ("eager", "compile")


@dataclass
class RecheckResult:
    recheck_id: int
    approval_id: int
    run_id: int
    candidate_id: int
    task: str
    baseline_evaluation_id: int
    evaluation_id: int
    verdict: str
    regressed: bool
    reason: str
    speedup_vs_eager: float | None


def approved(store: Store, run_ids: list[int] | None = None) -> list[Approval]:
    """The approvals still standing (a candidate's latest decision is approve), oldest first."""
    latest = latest_decisions(store.approvals())
    return [a for a in latest.values() if a.decision == "approve" and (not run_ids or a.run_id in run_ids)]


def recheck(store: Store, jail: Jail, settings: EvalSettings, work_dir: Path, run_ids: list[int] | None = None,
            log: Callable[[str], None] = lambda _: None) -> list[RecheckResult]:
    results = []
    for approval in approved(store, run_ids):
        results.append(_recheck_one(store, jail, settings, work_dir / f"approval-{approval.id}", approval))
        r = results[-1]
        log(f"candidate {r.candidate_id} (run {r.run_id}, {r.task}): "
            f"{'REGRESSION' if r.regressed else 'ok'} - {r.reason}")
    return results


def _recheck_one(store: Store, jail: Jail, settings: EvalSettings, work_dir: Path,
                 approval: Approval) -> RecheckResult:
    candidate = store.get_candidate(approval.candidate_id)
    baseline = next(e for c, e in store.run_candidates(candidate.run_id) if c.id == candidate.id)
    _, old_timings = store.get_evaluation(baseline.id)
    task_row = store.get_task(candidate.task_id)
    # The task and candidate exactly as approved, written out for the pipeline.
    work_dir.mkdir(parents=True, exist_ok=True)
    task_file = work_dir / f"{task_row.name}.py"
    task_file.write_text(task_row.source)
    if task_row.manifest.strip():
        task_file.with_suffix(".toml").write_text(task_row.manifest)
    candidate_file = work_dir / f"candidate-{candidate.id}.py"
    candidate_file.write_text(candidate.source)

    same_device = resolve_device(settings.device) == baseline.device
    # Compare like with like: the approved evaluation's sizes when the device kind is the same.
    pipeline = Pipeline(jail, replace(settings, mode=baseline.mode if same_device else settings.mode))
    try:
        outcome = pipeline.evaluate(load_task(task_file), candidate_file)
    finally:
        pipeline.close()

    run = store.add_run(task_row.id, "recheck", {"approval_id": approval.id, "candidate_id": candidate.id,
                                                 "baseline_evaluation_id": baseline.id})
    copy = store.add_candidate(run.id, task_row.id, candidate.source, path=candidate.path, parent_id=candidate.id,
                               proposer=candidate.proposer, note=f"recheck of candidate {candidate.id}")
    evaluation = store.add_outcome(copy.id, run.id, outcome)
    store.finish_run(run.id)
    _, new_timings = store.get_evaluation(evaluation.id)

    if not outcome.passed:
        regressed, reason = True, f"fails the gate now: {outcome.verdict} at {outcome.stage}: {outcome.reason}"
    elif (outcome.device, outcome.mode) != (baseline.device, baseline.mode):
        regressed, reason = False, (f"passes; timings not compared: approved on {baseline.device} ({baseline.mode} "
                                    f"sizes), rechecked on {outcome.device} ({outcome.mode} sizes)")
    else:
        regressed, reason = compare_timings(old_timings, new_timings)
    old_gpu, new_gpu = baseline.environment.get("gpu"), outcome.environment.get("gpu")
    if old_gpu != new_gpu:
        reason += f" [GPU changed: {old_gpu or baseline.device} -> {new_gpu or outcome.device}]"
    row = store.add_recheck(approval.id, candidate.id, baseline.id, evaluation.id, regressed, reason)
    return RecheckResult(row.id, approval.id, approval.run_id, candidate.id, task_row.name, baseline.id,
                         evaluation.id, outcome.verdict, regressed, reason, outcome.speedup_vs_eager)


def compare_timings(old: list[Timing], new: list[Timing]) -> tuple[bool, str]:
    """(regressed, why) from the candidate's timings per shape, before and now."""
    before = {t.shape: t for t in old if t.implementation == "candidate" and t.median_ms}
    now = {t.shape: t for t in new if t.implementation == "candidate" and t.median_ms}
    trusted_spread: dict[str, float] = {}  # shape -> the trusted servers' largest IQR / median, before and now
    for t in (*old, *new):
        if t.implementation in TRUSTED_SERVERS and t.median_ms:
            trusted_spread[t.shape] = max(trusted_spread.get(t.shape, 0.0), (t.iqr_ms or 0.0) / t.median_ms)
    changes = []  # (relative change, shape, old, new, noise)
    for shape in before.keys() & now.keys():
        a, b = before[shape], now[shape]
        spread = (trusted_spread[shape] * a.median_ms if shape in trusted_spread
                  else max(a.iqr_ms or 0.0, b.iqr_ms or 0.0))
        noise = min(NOISE_IQRS * spread, MAX_NOISE * a.median_ms)
        changes.append((b.median_ms / a.median_ms - 1, shape, a.median_ms, b.median_ms, noise))
    if not changes:
        return False, "passes; no shape was timed both times"
    slower = [c for c in changes if c[3] > c[2] + c[4] and c[0] > MIN_SLOWDOWN]
    change, shape, a, b, noise = max(slower or changes)
    text = f"{shape}: {a:.4g} ms -> {b:.4g} ms ({change:+.1%})"
    if slower:
        return True, f"slower beyond the noise at {text}; the noise allowed is {noise:.2g} ms"
    return False, f"passes; within noise, largest change at {text}"
