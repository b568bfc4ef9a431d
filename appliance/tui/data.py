"""What the screens show, read from the Store in one go (in a worker thread) as plain dataclasses: the screens only
lay these out. Polling the database is what makes the TUI live: a run progressing in another process (the
controller, `appliance optimize`) writes its rows, the next poll shows them."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from rich.console import Group
from rich.table import Table
from rich.text import Text

from appliance.db import Candidate, Evaluation, Run, Store, Timing
from appliance.db.models import Approval
from appliance.export import unified_diff
from appliance.proposers.mix import Yield, run_yields
from appliance.review import Winner, convergence, latest_decisions, ranked, winner


@dataclass(frozen=True)
class RunLine:
    """One line of the runs screen."""

    id: int
    task: str
    kind: str
    status: str
    evaluated: int
    budget: int | None  # max candidates (optimize runs)
    best: float | None  # speedup vs eager of the best passing candidate
    gpu_hours: float
    energy_j: float | None  # None until the run records energy (GPU runs)
    review: str  # approved / rejected / -
    created_at: datetime


def runs_overview(store: Store, limit: int = 200) -> list[RunLine]:
    rows = store.list_runs(limit=limit)
    runs = {r.id: r for r in store.get_runs([r.id for r in rows])}
    decisions: dict[int, str] = {}
    for a in latest_decisions(store.approvals()).values():  # a run is approved if any of its candidates is
        if decisions.get(a.run_id) != "approved":
            decisions[a.run_id] = "approved" if a.decision == "approve" else "rejected"
    lines = []
    for r in rows:
        run = runs[r.id]
        state = run.state or {}
        lines.append(RunLine(r.id, r.task_name, r.kind, r.status, r.evaluations,
                             (run.config or {}).get("max_candidates") if r.kind == "optimize" else None,
                             r.best_speedup_vs_eager, state.get("gpu_seconds", 0.0) / 3600, state.get("energy_j"),
                             decisions.get(r.id, "-"), r.created_at))
    return lines


@dataclass(frozen=True)
class LeaderRow:
    candidate_id: int
    proposer: str
    status: str  # queued, evaluating, evaluated, proposal_failed
    verdict: str  # the evaluation's verdict, or the candidate's status while it has none
    ms: float | None  # candidate median at the main shape
    vs_eager: float | None
    vs_compile: float | None
    roofline: float | None
    generation: int | None
    note: str
    decision: str  # approve / reject / ""


@dataclass
class WorkerUse:
    """What one evaluation GPU of one host did for a run (the host is where the evaluation ran: a Ray node, a
    worker process's host, or the controller's own)."""

    host: str
    gpu: int
    evaluations: int = 0
    gpu_seconds: float = 0.0
    energy_j: float = 0.0


def worker_use(evaluations: list[Evaluation]) -> list[WorkerUse]:
    uses: dict[tuple[str, int], WorkerUse] = {}
    for e in evaluations:
        d = e.details or {}
        if d.get("gpu_index") is None:
            continue
        host = d.get("host") or (e.environment or {}).get("hostname") or "?"
        use = uses.setdefault((host, d["gpu_index"]), WorkerUse(host, d["gpu_index"]))
        turns = d.get("device_turns") or {}
        use.evaluations += 1
        use.gpu_seconds += turns.get("held_s") or 0.0
        use.energy_j += turns.get("joules") or 0.0
    return sorted(uses.values(), key=lambda u: (u.host, u.gpu))


@dataclass
class RunView:
    run: Run
    task: str
    leaderboard: list[LeaderRow]
    convergence: list[float]
    verdicts: dict[str, int]
    winner: Winner | None
    evaluated: int
    queued: int
    in_flight: list[int]  # candidates being evaluated now
    tokens: int
    gpu: str  # the GPU (or CPU) of the latest evaluation, with driver
    workers_used: list[WorkerUse] = field(default_factory=list)  # per host and GPU, so far
    proposer_yields: list[Yield] = field(default_factory=list)  # each proposer's record (proposers/mix.py)

    @property
    def budget(self) -> int | None:
        return (self.run.config or {}).get("max_candidates")

    @property
    def gpu_hours(self) -> float:
        return (self.run.state or {}).get("gpu_seconds", 0.0) / 3600

    @property
    def on_gpu(self) -> bool:
        return not self.gpu.startswith("cpu") and self.gpu != "-"

    @property
    def token_rate(self) -> float | None:
        elapsed = (self.run.state or {}).get("elapsed_s") or 0.0
        return self.tokens / elapsed if elapsed and self.tokens else None


def run_view(store: Store, run_id: int) -> RunView | None:
    run = store.get_run(run_id)
    if run is None:
        return None
    rows = store.run_candidates(run_id)
    main = {t.evaluation_id: t for t in store.run_timings(run_id)
            if t.shape == "main" and t.implementation == "candidate"}
    decisions = latest_decisions(store.approvals(run_id))
    board = [_leader_row(c, e, main.get(e.id) if e else None, decisions.get(c.id)) for c, e in ranked(rows)]
    evaluations = [e for _, e in rows if e is not None]
    latest = max(evaluations, key=lambda e: e.id, default=None)
    env = latest.environment if latest else {}
    gpu = (f"{env.get('gpu')} (driver {env.get('driver', '?')})" if env.get("gpu") else
           f"{latest.device} {env.get('cpu', '')}".strip() if latest else "-")
    return RunView(
        run=run, task=store.get_task(run.task_id).name, leaderboard=board, convergence=convergence(rows),
        verdicts=dict(Counter(e.verdict for e in evaluations).most_common()), winner=winner(store, run_id),
        evaluated=len(evaluations), queued=sum(1 for c, _ in rows if c.status == "queued"),
        in_flight=[c.id for c, _ in rows if c.status == "evaluating"],
        tokens=sum(c.tokens_in + c.tokens_out for c, _ in rows), gpu=gpu,
        workers_used=worker_use(evaluations),
        proposer_yields=run_yields(run.config, rows) if run.kind == "optimize" else [])


def _leader_row(c: Candidate, e: Evaluation | None, main: Timing | None, decision: Approval | None) -> LeaderRow:
    return LeaderRow(c.id, c.proposer, c.status, e.verdict if e else c.status, main.median_ms if main else None,
                     e.speedup_vs_eager if e else None, e.speedup_vs_compile if e else None,
                     main.roofline_fraction if main else None, c.generation, c.note or (c.failure or "")[:80],
                     decision.decision if decision else "")


@dataclass
class CandidateView:
    candidate: Candidate
    evaluation: Evaluation | None
    timings: list[Timing]
    task: str
    parent: Candidate | None
    diff: str  # against the parent (the task's reference for a seed or a hand submission)
    diff_base: str  # what the diff is against
    decisions: list[Approval]  # of this candidate, oldest first
    is_winner: bool

    @property
    def evidence(self) -> Group | str:
        """The gate's evidence as readable text: what ran, what each check saw, the limits it ran under."""
        e = self.evaluation
        if e is None:
            return "not evaluated yet" if self.candidate.status != "proposal_failed" else "no source to evaluate"
        d = e.details or {}
        gpu = f", GPU {d['gpu_index']}" if d.get("gpu_index") is not None else ""
        lines = [f"verdict   {e.verdict} (stage {e.stage})", f"reason    {e.reason}",
                 f"jailed    {e.jailed}", f"device    {e.device} ({e.mode} sizes){gpu}",
                 f"backends  {', '.join(d.get('backends') or []) or '-'}", ""]
        cases = d.get("cases") or []
        if cases:
            ok = sum(1 for c in cases if c.get("kind") == "pass")
            lines.append(f"correctness: {ok} of {len(cases)} checked calls within tolerance of the float64 reference")
            seeds: dict[str, list[str]] = {}
            for c in cases:
                if c.get("kind") == "pass":
                    seeds.setdefault(str(c.get("shape")), []).append(str(c.get("seed")))
                else:
                    lines.append(f"  {c.get('shape')} seed {c.get('seed')}: {c.get('kind')} {c.get('reason') or ''}")
            lines += [f"  {shape:<20} pass on seeds {', '.join(s)}" for shape, s in seeds.items()]
            lines.append("")
        tables = [_table(title, d[key]) for title, key in (
            ("evidence", "evidence"), ("provenance (ops and own kernel launches of forward)", "provenance"),
            ("Nsight Compute", "ncu"), ("jail", "jail"), ("wall seconds per process", "wall_s")) if d.get(key)]
        return Group(Text("\n".join(lines).rstrip() + "\n"), *tables)

    @property
    def log(self) -> str:
        """The compiler / runtime output kept for this candidate (what a proposer is shown too)."""
        d = (self.evaluation.details or {}) if self.evaluation else {}
        parts = [(title, text) for title, text in (
            ("proposal failure", self.candidate.failure), ("traceback", d.get("traceback")),
            ("candidate stderr (compiler and runtime output)", d.get("candidate_stderr"))) if text]
        return "\n\n".join(f"--- {title} ---\n{text.rstrip()}" for title, text in parts) or "(no output kept)"


def candidate_view(store: Store, candidate_id: int) -> CandidateView | None:
    c = store.get_candidate(candidate_id)
    if c is None:
        return None
    evaluation = next((e for x, e in store.run_candidates(c.run_id) if x.id == c.id), None)
    timings = store.get_evaluation(evaluation.id)[1] if evaluation else []
    task = store.get_task(c.task_id)
    parent = store.get_candidate(c.parent_id) if c.parent_id else None
    base_name, base = (f"candidate {parent.id}", parent.source) if parent else (f"the task's reference {task.name}.py",
                                                                             task.source)
    won = winner(store, c.run_id)
    return CandidateView(c, evaluation, timings, task.name, parent,
                         unified_diff(base, c.source, base_name, f"candidate {c.id}") or "(identical)", base_name,
                         [a for a in store.approvals(c.run_id) if a.candidate_id == c.id],
                         won is not None and won.candidate.id == c.id)


def _table(title: str, data) -> Table:
    """A section of the evidence as rows of name and value: nested objects as dotted names, short lists inline."""
    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 2), expand=False)
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for name, value in _flat(data):
        table.add_row(name, value)
    return table


def _flat(value, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict) and value:
        return [row for k, v in value.items() for row in _flat(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value) and len(value) <= 20:
        return [row for i, v in enumerate(value) for row in _flat(v, f"{prefix}[{i}]")]
    if isinstance(value, float):
        return [(prefix or "-", f"{value:.4g}")]
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return [(prefix or "-", text if len(text) <= 400 else text[:400] + " ...")]
