"""Human review of a run's winner: who approved or rejected which candidate (appended decisions, the latest per
candidate counts), which candidate is the run's winner, and the numbers every review view shares (the leaderboard
order, the convergence of the best speedup). Used by the TUI, `appliance approve/reject`, export and recheck."""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass

from appliance.db import Candidate, Evaluation, Store
from appliance.db.models import Approval
from appliance.errors import ApplianceError

DECISIONS = ("approve", "reject")


def current_user() -> str:
    """The OS user running this process (over SSH: the login), recorded as who decided."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for this uid (containers)
        return f"uid {os.getuid()}"


def decide(store: Store, candidate_id: int, decision: str, comment: str, who: str | None = None) -> Approval:
    """Record a person's decision on a candidate. Only a candidate that passed the gate can be approved; a comment
    (why) is required either way, so the record answers who, when and why."""
    if decision not in DECISIONS:
        raise ApplianceError(f"a decision is approve or reject, not {decision!r}")
    if not comment.strip():
        raise ApplianceError(f"say why: a {decision} needs a comment")
    candidate = store.get_candidate(candidate_id)
    if candidate is None:
        raise ApplianceError(f"no candidate {candidate_id}")
    evaluation = _evaluation_of(store, candidate)
    if decision == "approve" and (evaluation is None or evaluation.verdict != "pass"):
        verdict = evaluation.verdict if evaluation else "not evaluated"
        raise ApplianceError(f"candidate {candidate_id} cannot be approved: {verdict} (only a passing candidate can)")
    return store.add_approval(candidate.run_id, candidate_id, decision, who or current_user(), comment.strip())


def latest_decisions(approvals: list[Approval]) -> dict[int, Approval]:
    """Candidate id -> its latest decision (approvals oldest first, as the store returns them)."""
    return {a.candidate_id: a for a in approvals}


@dataclass
class Winner:
    candidate: Candidate
    evaluation: Evaluation
    approval: Approval | None  # the decision that approved it; None: the best candidate, not (yet) approved

    @property
    def approved(self) -> bool:
        return self.approval is not None


def ranked(rows: list[tuple[Candidate, Evaluation | None]]) -> list[tuple[Candidate, Evaluation | None]]:
    """Leaderboard order: passing candidates by speedup vs eager (best first), then the rest newest first."""
    passed = [(c, e) for c, e in rows if e is not None and e.verdict == "pass"]
    others = [(c, e) for c, e in rows if not (e is not None and e.verdict == "pass")]
    passed.sort(key=lambda ce: -(ce[1].speedup_vs_eager or 0.0))
    return passed + others[::-1]


def winner(store: Store, run_id: int) -> Winner | None:
    """The run's approved winner (the most recently approved candidate still approved), else its best passing
    candidate; None when nothing passed."""
    rows = store.run_candidates(run_id)
    evaluations = {c.id: e for c, e in rows if e is not None}
    approved = [a for a in latest_decisions(store.approvals(run_id)).values() if a.decision == "approve"]
    if approved:
        last = max(approved, key=lambda a: a.id)
        candidate = next(c for c, _ in rows if c.id == last.candidate_id)
        return Winner(candidate, evaluations[candidate.id], last)
    best = ranked(rows)[:1]
    if not best or best[0][1] is None or best[0][1].verdict != "pass":
        return None
    return Winner(best[0][0], best[0][1], None)


def convergence(rows: list[tuple[Candidate, Evaluation | None]]) -> list[float]:
    """The best speedup vs eager after each evaluation, in the order the evaluations were stored (0 before the
    first pass)."""
    best, points = 0.0, []
    for e in sorted((e for _, e in rows if e is not None), key=lambda e: e.id):
        if e.verdict == "pass" and e.speedup_vs_eager:
            best = max(best, e.speedup_vs_eager)
        points.append(best)
    return points


def lineage(store: Store, candidate: Candidate) -> list[Candidate]:
    """The candidate's ancestors, the seed first, the candidate last."""
    chain = [candidate]
    while chain[-1].parent_id is not None and len(chain) < 1000:
        parent = store.get_candidate(chain[-1].parent_id)
        if parent is None:
            break
        chain.append(parent)
    return chain[::-1]


def _evaluation_of(store: Store, candidate: Candidate) -> Evaluation | None:
    return next((e for c, e in store.run_candidates(candidate.run_id) if c.id == candidate.id), None)
