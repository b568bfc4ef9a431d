"""The appliance's database: make_engine (SQLite tuned for several processes, or any SQLAlchemy URL, PostgreSQL
through psycopg 3 being the other one tested), migrate (Alembic to head) and Store, the one object the rest of the
appliance reads and writes through.

Store methods each run in their own short transaction and return plain model objects or small row dataclasses,
usable after the session is gone; nothing here keeps a session open between calls.

Concurrent writers: on SQLite a write transaction takes the database's write lock when it begins, so writers run one
after another. PostgreSQL runs them side by side (READ COMMITTED), so a write that reads a row before changing it
locks that row first (`with_for_update`, ignored by SQLite) and sees the latest committed version."""

from __future__ import annotations

import functools
import hashlib
import random
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, event, func, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import defer
from sqlalchemy.pool import StaticPool
from sqlmodel import Session, col, select

from appliance.db.models import Candidate, Evaluation, Run, Task, Timing, utc_now

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
RUN_STATUSES = ("created", "queued", "running", "paused", "stopped", "finished", "failed")
PASS = "pass"

# Execution option read by the SQLite "begin" hook: writers take the write lock when they begin.
_WRITE_LOCK = "appliance_write_lock"
# PostgreSQL advisory lock key serialising migrations (any fixed bigint; "appl" in ASCII).
_MIGRATION_LOCK = 0x6170706C
# How long a SQLite connection waits for another process's lock before "database is locked". SQLite's busy handler is
# not fair: on a loaded 2-core CI host a writer lost the lock to a busy neighbour for over 5 s (the old value), so
# workers finishing together must wait longer than that before an outcome is lost.
_SQLITE_BUSY_S = 30.0
# Row lock for read-then-write (PostgreSQL; SQLite ignores it): FOR NO KEY UPDATE, the lock an UPDATE takes anyway. It
# does not wait for transactions inserting rows that reference the locked one (evaluations of a run, say).
_ROW_LOCK = {"key_share": True}
_TIMING_FIELDS = frozenset(Timing.model_fields) - {"id", "evaluation_id"}


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def display_url(url: str) -> str:
    """A database URL fit for logs and reports: the password hidden."""
    return make_url(url).render_as_string(hide_password=True)


BUSY_RETRIES = 5  # after SQLite's own busy wait: tries again, backing off, before the error reaches the caller


def _retry_when_busy(method):
    """A write that found SQLite's write lock held past its busy wait (a loaded host, a writer holding on) is run
    again, backing off with jitter: the transaction rolled back, so nothing was half written. Other errors, and the
    last attempt's, go to the caller."""

    @functools.wraps(method)
    def retried(self, *args, **kwargs):
        for attempt in range(BUSY_RETRIES + 1):
            try:
                return method(self, *args, **kwargs)
            except OperationalError as error:
                if attempt == BUSY_RETRIES or not _sqlite_busy(error):
                    raise
                time.sleep(min(2.0, 0.05 * 4 ** attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    return retried


def _sqlite_busy(error: OperationalError) -> bool:
    """SQLite's own busy/locked error, read from the driver's exception: not from the message SQLAlchemy builds,
    which holds the statement's parameters (a note saying "busy" must not make a write run twice), and never a
    PostgreSQL error (a connection lost at COMMIT leaves the outcome unknown: not safe to run again)."""
    orig = getattr(error, "orig", None)
    if not isinstance(orig, sqlite3.OperationalError):
        return False
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return str(orig).startswith(("database is locked", "database table is locked"))


def make_engine(url: str) -> Engine:
    """An engine for `url`. SQLite gets WAL, enforced foreign keys, a 30 s busy wait and real transactions;
    `sqlite://` (in memory) shares one connection, so every session sees the same database. Other URLs
    (postgresql+psycopg://...) get a plain pool at the server's isolation level, READ COMMITTED by default, which
    the Store's row locks are written for."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    database = parsed.database or ""
    if database in ("", ":memory:"):
        engine = create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Python's sqlite3 only BEGINs before DML, leaving DDL and read-then-write unprotected: we BEGIN ourselves.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # busy_timeout first: switching to WAL needs a lock another process may hold.
        cursor.execute(f"PRAGMA busy_timeout={int(_SQLITE_BUSY_S * 1000)}")
        _switch_to_wal(cursor)
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # IMMEDIATE waits (busy_timeout) for the write lock up front; a deferred transaction that reads and then
        # writes would instead fail with "database is locked" when another process wrote in between.
        immediate = connection.get_execution_options().get(_WRITE_LOCK, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _switch_to_wal(cursor: sqlite3.Cursor) -> None:
    # Two connections switching a new database to WAL at once both hold a shared lock and want an exclusive one.
    # SQLite fails one of them at once ("database is locked") instead of calling the busy handler, since waiting
    # could deadlock; so we retry here, within the busy timeout.
    deadline = time.monotonic() + _SQLITE_BUSY_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the database to `revision`, the newest schema by default (a no-op when it is there), in one
    transaction."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.execution_options(**{_WRITE_LOCK: True}).connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            # A batch migration rebuilds a table (copy, drop, rename): with foreign keys on, dropping a table other
            # rows point at fails. SQLite ignores this pragma inside a transaction, so it goes before our BEGIN.
            connection.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")
        try:
            with connection.begin():
                if connection.dialect.name == "postgresql":
                    # SQLite's write lock serialises processes migrating one new database; PostgreSQL needs a lock
                    # of its own, else two would both find no alembic_version table and both create it. Released at
                    # commit.
                    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
                config.attributes["connection"] = connection
                command.upgrade(config, revision)
                if sqlite and (broken := connection.exec_driver_sql("PRAGMA foreign_key_check").all()):
                    raise RuntimeError(f"migrating to {revision} broke foreign keys (rolled back): {broken[:5]}")
        finally:
            if sqlite:
                connection.connection.driver_connection.execute("PRAGMA foreign_keys=ON")


def schema_version(engine: Engine) -> str:
    """The database's Alembic revision ("0001", ...); "" if it was never migrated."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision() or ""


@dataclass(frozen=True, slots=True)
class EvaluationRow:
    """One line of `list_evaluations`: an evaluation with its task and candidate."""

    id: int
    created_at: datetime
    task_name: str
    candidate_path: str | None
    proposer: str
    verdict: str
    stage: str
    reason: str
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    device: str
    run_id: int


@dataclass(frozen=True, slots=True)
class RunRow:
    """One line of `list_runs`; best_speedup_vs_eager counts passing evaluations only."""

    id: int
    task_name: str
    kind: str
    status: str
    created_at: datetime
    finished_at: datetime | None
    candidates: int
    evaluations: int
    best_speedup_vs_eager: float | None


class Store:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._writer = engine.execution_options(**{_WRITE_LOCK: True})

    @classmethod
    def open(cls, url: str) -> Store:
        """Engine for `url`, migrated to the newest schema."""
        engine = make_engine(url)
        migrate(engine)
        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _write(self) -> Iterator[Session]:
        # expire_on_commit=False: returned objects keep their values after the session closes.
        with Session(self._writer, expire_on_commit=False) as session:
            yield session
            session.commit()

    def _read(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    # --- writes ---

    @_retry_when_busy
    def get_or_add_task(self, name: str, path: str | Path, source: str, manifest: str = "") -> Task:
        """The task stored for this file and content, added if new. `path` is stored resolved (absolute)."""
        resolved, digest = str(Path(path).resolve()), sha256(source)

        def get_or_add() -> Task:
            with self._write() as session:
                query = select(Task).where(Task.path == resolved, Task.source_sha256 == digest)
                task = session.exec(query).first()
                if task is None:
                    task = Task(name=name, path=resolved, source=source, source_sha256=digest, manifest=manifest)
                    session.add(task)
                    session.flush()  # a duplicate is refused here, inside the try below
                return task

        try:
            return get_or_add()
        except IntegrityError:
            # PostgreSQL: another writer added the same task between our SELECT and INSERT (SQLite's write lock rules
            # that out) and the unique (path, source_sha256) refused ours; now the SELECT finds theirs.
            return get_or_add()

    @_retry_when_busy
    def add_run(self, task_id: int, kind: str, config: dict[str, Any] | None = None) -> Run:
        with self._write() as session:
            run = Run(task_id=task_id, kind=kind, status="created", config=config or {})
            session.add(run)
            return run

    def start_run(self, run_id: int) -> Run:
        return self._set_run_status(run_id, "running")

    def finish_run(self, run_id: int, status: str = "finished") -> Run:
        if status not in ("finished", "failed"):
            raise ValueError(f"a run finishes as 'finished' or 'failed', not {status!r}")
        return self._set_run_status(run_id, status, finished_at=utc_now())

    @_retry_when_busy
    def _set_run_status(self, run_id: int, status: str, finished_at: datetime | None = None) -> Run:
        assert status in RUN_STATUSES, status
        with self._write() as session:
            run = session.get(Run, run_id, with_for_update=_ROW_LOCK)
            if run is None:
                raise KeyError(f"no run {run_id}")
            run.status, run.finished_at = status, finished_at
            return run

    @_retry_when_busy
    def add_candidate(
        self,
        run_id: int,
        task_id: int,
        source: str,
        path: str | None = None,
        parent_id: int | None = None,
        proposer: str = "manual",
        **search: Any,  # status, island, generation, note, failure, tokens_in, tokens_out
    ) -> Candidate:
        with self._write() as session:
            candidate = Candidate(
                run_id=run_id,
                task_id=task_id,
                source=source,
                source_sha256=sha256(source),
                path=path,
                parent_id=parent_id,
                proposer=proposer,
                **search,
            )
            session.add(candidate)
            return candidate

    def add_outcome(self, candidate_id: int, run_id: int, outcome: Any) -> Evaluation:
        """Store a pipeline Outcome (appliance/evaluation/pipeline.py): the verdict, its evidence and, of each timing
        row, the numbers the timing table has columns for."""
        o = outcome
        return self.add_evaluation(
            candidate_id, run_id, verdict=o.verdict, stage=o.stage, reason=o.reason, jailed=o.jailed,
            memory_limited=getattr(o, "memory_limited", True), device=o.device, mode=o.mode, speedup_vs_eager=o.speedup_vs_eager,
            speedup_vs_compile=o.speedup_vs_compile, environment=o.environment, details=o.details,
            timings=[{k: t.get(k) for k in _TIMING_FIELDS} for t in o.timings])

    @_retry_when_busy
    def set_candidate_status(self, candidate_id: int, status: str) -> None:
        with self._write() as session:
            candidate = session.get(Candidate, candidate_id, with_for_update=_ROW_LOCK)
            if candidate is None:
                raise KeyError(f"no candidate {candidate_id}")
            candidate.status = status

    @_retry_when_busy
    def close_queue(self, run_id: int, why: str) -> int:
        """A finished run's candidates still queued are marked `not_evaluated`, with why (a resume with a larger
        budget queues them again). Returns how many."""
        with self._write() as session:
            query = select(Candidate).where(Candidate.run_id == run_id, Candidate.status == "queued")
            rows = session.exec(query.with_for_update(**_ROW_LOCK)).all()
            for candidate in rows:
                candidate.status, candidate.failure = "not_evaluated", why
            return len(rows)

    @_retry_when_busy
    def requeue_unfinished(self, run_id: int) -> int:
        """After a crash: candidates left mid-evaluation go back to the queue (and, on a resume, those a finished
        session left unevaluated). Returns how many."""
        with self._write() as session:
            query = select(Candidate).where(Candidate.run_id == run_id,
                                            col(Candidate.status).in_(("evaluating", "not_evaluated")))
            # Locked: on PostgreSQL a candidate whose evaluation is being stored right now is re-checked once that
            # commits, and skipped as "evaluated" instead of being queued to run a second time.
            rows = session.exec(query.with_for_update(**_ROW_LOCK)).all()
            for candidate in rows:
                candidate.status, candidate.failure = "queued", None
            return len(rows)

    @_retry_when_busy
    def claim_run(self, run_id: int, expected: str = "queued", status: str = "running") -> bool:
        """Move a run from `expected` to `status` unless someone else already did (two controllers, one queue):
        True for the one caller whose change took effect."""
        with self._write() as session:
            run = session.get(Run, run_id, with_for_update=_ROW_LOCK)
            if run is None or run.status != expected:
                return False
            run.status, run.finished_at = status, None
            return True

    @_retry_when_busy
    def update_run(self, run_id: int, *, status: str | None = None, state: dict[str, Any] | None = None,
                   config: dict[str, Any] | None = None) -> Run:
        assert status is None or status in RUN_STATUSES, status
        with self._write() as session:
            run = session.get(Run, run_id, with_for_update=_ROW_LOCK)
            if run is None:
                raise KeyError(f"no run {run_id}")
            if status is not None:
                run.status = status
                run.finished_at = utc_now() if status in ("finished", "failed", "stopped") else None
            if state is not None:
                run.state = dict(state)
            if config is not None:
                run.config = dict(config)
            return run

    @_retry_when_busy
    def add_evaluation(
        self,
        candidate_id: int,
        run_id: int,
        *,
        verdict: str,
        stage: str,
        jailed: bool,
        device: str,
        mode: str,
        reason: str = "",
        memory_limited: bool = True,
        speedup_vs_eager: float | None = None,
        speedup_vs_compile: float | None = None,
        environment: dict[str, Any] | None = None,
        details: dict[str, Any] | None = None,
        timings: Iterable[dict[str, Any]] = (),
    ) -> Evaluation:
        """Store a verdict and its timings together: a crash leaves both or neither."""
        timings = list(timings)
        for timing in timings:
            if unknown := set(timing) - _TIMING_FIELDS:
                raise ValueError(f"unknown timing fields {sorted(unknown)}; expected {sorted(_TIMING_FIELDS)}")
        with self._write() as session:
            # The candidate first, locked: a requeue racing with this waits for it and then sees "evaluated".
            candidate = session.get(Candidate, candidate_id, with_for_update=_ROW_LOCK)
            if candidate is not None:
                candidate.status = "evaluated"  # in the same transaction: never evaluated twice after a crash
            evaluation = Evaluation(
                candidate_id=candidate_id,
                run_id=run_id,
                verdict=verdict,
                stage=stage,
                reason=reason,
                jailed=jailed,
                memory_limited=memory_limited,
                device=device,
                mode=mode,
                speedup_vs_eager=speedup_vs_eager,
                speedup_vs_compile=speedup_vs_compile,
                environment=environment or {},
                details=details or {},
            )
            session.add(evaluation)
            session.flush()  # assigns evaluation.id for the timings
            session.add_all(  # sizes None (a shape the client could not size) is stored as {} like the default
                Timing(**{**timing, "evaluation_id": evaluation.id, "sizes": timing.get("sizes") or {}})
                for timing in timings
            )
            return evaluation

    # --- reads ---

    def get_run(self, run_id: int) -> Run | None:
        with self._read() as session:
            return session.get(Run, run_id)

    def runs_with_status(self, status: str, kind: str = "optimize") -> list[Run]:
        """Oldest first: the controller works through queued runs in the order they were created."""
        with self._read() as session:
            query = select(Run).where(Run.status == status, Run.kind == kind).order_by(col(Run.id))
            return list(session.exec(query).all())

    def runs_of_task(self, task_id: int, kind: str = "optimize") -> list[Run]:
        """Every run of a task, oldest first."""
        with self._read() as session:
            query = select(Run).where(Run.task_id == task_id, Run.kind == kind).order_by(col(Run.id))
            return list(session.exec(query).all())

    def get_task(self, task_id: int) -> Task | None:
        with self._read() as session:
            return session.get(Task, task_id)

    def run_candidates(self, run_id: int) -> list[tuple[Candidate, Evaluation | None]]:
        """Every candidate of a run in creation order, with its evaluation (None while queued or failed to propose)."""
        with self._read() as session:
            query = (select(Candidate, Evaluation).outerjoin(Evaluation, col(Evaluation.candidate_id) == Candidate.id)
                     .where(Candidate.run_id == run_id).order_by(col(Candidate.id)))
            return [(c, e) for c, e in session.exec(query).all()]

    def runs_summaries(self, run_ids: list[int]) -> dict[int, tuple[dict, list[tuple[Candidate, Evaluation | None]]]]:
        """Each run's config and its candidates with their evaluations (as run_candidates), for many runs in two
        queries and without the candidates' sources: what a list of runs summarises (who proposed what, how it
        did) reads no code."""
        if not run_ids:
            return {}
        with self._read() as session:
            configs = session.exec(select(Run.id, Run.config).where(col(Run.id).in_(run_ids))).all()
            out = {run_id: (config or {}, []) for run_id, config in configs}
            query = (select(Candidate, Evaluation).outerjoin(Evaluation, col(Evaluation.candidate_id) == Candidate.id)
                     .where(col(Candidate.run_id).in_(run_ids)).options(defer(Candidate.source))
                     .order_by(col(Candidate.id)))
            for c, e in session.exec(query).all():
                out[c.run_id][1].append((c, e))
        return out

    def get_candidate(self, candidate_id: int) -> Candidate | None:
        with self._read() as session:
            return session.get(Candidate, candidate_id)

    def get_evaluation(self, evaluation_id: int) -> tuple[Evaluation, list[Timing]] | None:
        """The evaluation and its timings in insertion order; None if there is no such evaluation."""
        with self._read() as session:
            evaluation = session.get(Evaluation, evaluation_id)
            if evaluation is None:
                return None
            query = select(Timing).where(Timing.evaluation_id == evaluation_id).order_by(col(Timing.id))
            return evaluation, list(session.exec(query).all())

    def list_evaluations(self, limit: int = 50, task_name: str | None = None) -> list[EvaluationRow]:
        """The newest evaluations first, optionally of one task (by name)."""
        query = (
            select(
                col(Evaluation.id).label("id"),
                col(Evaluation.created_at).label("created_at"),
                col(Task.name).label("task_name"),
                col(Candidate.path).label("candidate_path"),
                col(Candidate.proposer).label("proposer"),
                col(Evaluation.verdict).label("verdict"),
                col(Evaluation.stage).label("stage"),
                col(Evaluation.reason).label("reason"),
                col(Evaluation.speedup_vs_eager).label("speedup_vs_eager"),
                col(Evaluation.speedup_vs_compile).label("speedup_vs_compile"),
                col(Evaluation.device).label("device"),
                col(Evaluation.run_id).label("run_id"),
            )
            .join(Candidate, col(Candidate.id) == Evaluation.candidate_id)
            .join(Task, col(Task.id) == Candidate.task_id)
            .order_by(col(Evaluation.created_at).desc(), col(Evaluation.id).desc())
            .limit(limit)
        )
        if task_name is not None:
            query = query.where(Task.name == task_name)
        with self._read() as session:
            return [EvaluationRow(**row._mapping) for row in session.exec(query)]

    def list_runs(self, limit: int = 50) -> list[RunRow]:
        """The newest runs first, with how many candidates and evaluations each has and its best passing speedup."""
        candidates = select(func.count(col(Candidate.id))).where(Candidate.run_id == Run.id).scalar_subquery()
        evaluations = select(func.count(col(Evaluation.id))).where(Evaluation.run_id == Run.id).scalar_subquery()
        best = (
            select(func.max(Evaluation.speedup_vs_eager))
            .where(Evaluation.run_id == Run.id, Evaluation.verdict == PASS)
            .scalar_subquery()
        )
        query = (
            select(
                col(Run.id).label("id"),
                col(Task.name).label("task_name"),
                col(Run.kind).label("kind"),
                col(Run.status).label("status"),
                col(Run.created_at).label("created_at"),
                col(Run.finished_at).label("finished_at"),
                candidates.label("candidates"),
                evaluations.label("evaluations"),
                best.label("best_speedup_vs_eager"),
            )
            .join(Task, col(Task.id) == Run.task_id)
            .order_by(col(Run.created_at).desc(), col(Run.id).desc())
            .limit(limit)
        )
        with self._read() as session:
            return [RunRow(**row._mapping) for row in session.exec(query)]

    # --- human review: approvals and rechecks (appliance/review.py) ---
    # Models imported here so this block stays separate from the imports at the top of the file.

    @_retry_when_busy
    def add_approval(self, run_id: int, candidate_id: int, decision: str, who: str, comment: str) -> Any:
        from appliance.db.models import Approval

        assert decision in ("approve", "reject"), decision
        with self._write() as session:
            approval = Approval(run_id=run_id, candidate_id=candidate_id, decision=decision, who=who,
                                comment=comment)
            session.add(approval)
            return approval

    def approvals(self, run_id: int | None = None) -> list[Any]:
        """Decisions oldest first, of one run or of all runs."""
        from appliance.db.models import Approval

        query = select(Approval).order_by(col(Approval.id))
        if run_id is not None:
            query = query.where(Approval.run_id == run_id)
        with self._read() as session:
            return list(session.exec(query).all())

    @_retry_when_busy
    def add_recheck(self, approval_id: int, candidate_id: int, baseline_evaluation_id: int, evaluation_id: int,
                    regressed: bool, reason: str) -> Any:
        from appliance.db.models import Recheck

        with self._write() as session:
            recheck = Recheck(approval_id=approval_id, candidate_id=candidate_id, regressed=regressed, reason=reason,
                              baseline_evaluation_id=baseline_evaluation_id, evaluation_id=evaluation_id)
            session.add(recheck)
            return recheck

    def rechecks(self, candidate_id: int | None = None) -> list[Any]:
        """Rechecks oldest first, of one approved candidate or of all."""
        from appliance.db.models import Recheck

        query = select(Recheck).order_by(col(Recheck.id))
        if candidate_id is not None:
            query = query.where(Recheck.candidate_id == candidate_id)
        with self._read() as session:
            return list(session.exec(query).all())

    def run_timings(self, run_id: int) -> list[Timing]:
        """Every timing row of a run's evaluations, in insertion order (one query for a whole leaderboard)."""
        query = (select(Timing).join(Evaluation, col(Evaluation.id) == Timing.evaluation_id)
                 .where(Evaluation.run_id == run_id).order_by(col(Timing.id)))
        with self._read() as session:
            return list(session.exec(query).all())

    def get_runs(self, run_ids: Iterable[int]) -> list[Run]:
        """Several runs at once (budgets and state for a list of runs)."""
        with self._read() as session:
            return list(session.exec(select(Run).where(col(Run.id).in_(list(run_ids)))).all())
