"""The appliance's tables: what was asked (Task), how (Run), what was tried (Candidate) and what came of it
(Evaluation, Timing). Plain strings for kinds and verdicts, so a new proposer or failure kind needs no migration.

Changing a table here needs a migration in appliance/db/migrations/versions/ (tests/db/test_migrations.py checks)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Column, DateTime, Text, UniqueConstraint, true
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

# Named constraints: SQLite can only drop or alter a constraint in a batch migration if it has a name.
SQLModel.metadata.naming_convention = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on every backend: SQLite keeps no zone, so store UTC and mark it UTC on read."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            # A naive time is ambiguous (local or UTC?): refuse it rather than store a wrong instant.
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware one")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utc_now() -> datetime:
    return datetime.now(UTC)


def _created_at() -> Any:
    return Field(default_factory=utc_now, sa_type=UTCDateTime, nullable=False)


def _json() -> Any:
    return Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class Task(SQLModel, table=True):
    """A KernelBench-format problem file; one row per (path, content): an edited file is a new task."""

    __table_args__ = (UniqueConstraint("path", "source_sha256"),)

    id: int | None = Field(default=None, primary_key=True)
    name: str
    path: str
    source: str = Field(sa_type=Text)
    source_sha256: str = Field(index=True)
    manifest: str = Field(default="", sa_type=Text)
    created_at: datetime = _created_at()


class Run(SQLModel, table=True):
    """One piece of work on a task: "eval" (a one-off evaluation) or "optimize" (a search)."""

    id: int | None = Field(default=None, primary_key=True)
    task_id: int = Field(foreign_key="task.id", index=True)
    kind: str
    status: str = "created"  # created, running, paused, stopped, finished, failed
    config: dict[str, Any] = _json()  # optimize: proposer, budgets, seed, islands, device (appliance/search/loop.py)
    state: dict[str, Any] = _json()  # optimize: generation, island migrants, elapsed seconds (survives restarts)
    created_at: datetime = _created_at()
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class Candidate(SQLModel, table=True):
    """A kernel source proposed for a task; parent_id links a variant to the candidate it was derived from."""

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id", index=True)
    task_id: int = Field(foreign_key="task.id", index=True)
    source: str = Field(sa_type=Text)
    source_sha256: str = Field(index=True)
    path: str | None = None
    parent_id: int | None = Field(default=None, foreign_key="candidate.id")
    proposer: str = "manual"  # manual, llm, tune
    # The search's bookkeeping: queued -> evaluating -> evaluated; proposal_failed rows keep a proposer's failure
    # (garbage from the LLM, an edit that does not apply) with no source to evaluate; not_evaluated: still queued
    # when the run finished (failure says so; a resume queues it again).
    status: str = "evaluated"
    island: int | None = None
    generation: int | None = None
    note: str = Field(default="", sa_type=Text)
    failure: str | None = Field(default=None, sa_type=Text)
    tokens_in: int = 0
    tokens_out: int = 0
    created_at: datetime = _created_at()


class Evaluation(SQLModel, table=True):
    """The verdict on one candidate: "pass" or a failure kind, the stage it reached, and the evidence."""

    id: int | None = Field(default=None, primary_key=True)
    candidate_id: int = Field(foreign_key="candidate.id", index=True)
    run_id: int = Field(foreign_key="run.id", index=True)
    verdict: str  # "pass" or a failure kind such as "wrong_output"
    stage: str  # load, compile, correctness, timing, done
    reason: str = Field(default="", sa_type=Text)
    jailed: bool
    # False only under the operator's opt-out (APPLIANCE_UNSAFE_NO_MEMORY_LIMIT): no memory limit bound the candidate
    memory_limited: bool = Field(default=True, sa_column_kwargs={"server_default": true()})
    device: str  # cuda, cpu: CPU timings are labelled as such
    mode: str  # full, small
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    environment: dict[str, Any] = _json()  # gpu, driver, torch/triton/python versions, hostname
    details: dict[str, Any] = _json()  # anything else: per-case errors, logs
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime, nullable=False, index=True)


class Timing(SQLModel, table=True):
    """One implementation timed on one shape. When it could not be timed (e.g. torch.compile without a compiler)
    the numbers are None and error says why."""

    id: int | None = Field(default=None, primary_key=True)
    evaluation_id: int = Field(foreign_key="evaluation.id", index=True)
    shape: str
    sizes: dict[str, Any] = _json()
    implementation: str  # candidate, eager, compile
    device: str
    median_ms: float | None = None
    iqr_ms: float | None = None
    min_ms: float | None = None
    reps: int | None = None
    error: str | None = Field(default=None, sa_type=Text)
    # Evidence (GPU): achieved rates, roofline fraction against the measured ceilings, the device-wide cross-check
    # and NVML energy. None where not measured (CPU, no byte/FLOP counts, no NVML).
    gbps: float | None = None
    tflops: float | None = None
    roofline_fraction: float | None = None
    device_wide_ms: float | None = None
    energy_j_per_call: float | None = None


class Approval(SQLModel, table=True):
    """A person's decision on a candidate: "approve" (it may ship) or "reject", with who, when and why.
    Decisions are appended, never edited: a candidate's latest decision is the one that counts."""

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id", index=True)
    candidate_id: int = Field(foreign_key="candidate.id", index=True)
    decision: str  # approve, reject
    who: str  # the OS user who decided
    comment: str = Field(default="", sa_type=Text)
    created_at: datetime = _created_at()


class Recheck(SQLModel, table=True):
    """An approved winner evaluated again later (new GPU, driver or libraries) against its approved evaluation.
    The new evaluation belongs to a run of kind "recheck" holding a copy of the candidate."""

    id: int | None = Field(default=None, primary_key=True)
    approval_id: int = Field(foreign_key="approval.id", index=True)
    candidate_id: int = Field(foreign_key="candidate.id", index=True)  # the approved candidate
    baseline_evaluation_id: int = Field(foreign_key="evaluation.id")  # the evaluation that was approved
    evaluation_id: int = Field(foreign_key="evaluation.id")  # the new one
    regressed: bool
    reason: str = Field(default="", sa_type=Text)
    created_at: datetime = _created_at()
