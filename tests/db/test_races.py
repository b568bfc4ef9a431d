"""Writers that race on one run, on both backends: several evaluation workers storing outcomes while the loop saves
its state and an operator changes the status; and the two read-then-write races that PostgreSQL's READ COMMITTED
would get wrong without row locks (a status write lost, a candidate queued again after its evaluation was stored).

Each writer has a Store (an engine, a connection pool) of its own, as separate processes would; threads are enough
to make them overlap since they wait on the database, not on the GIL."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest
import sqlalchemy as sa

from appliance.db import Store
from appliance.evaluation.pipeline import Outcome

WORKERS, PER_WORKER = 4, 6
T = TypeVar("T")


def outcome(i: int) -> Outcome:
    return Outcome(verdict="pass", stage="done", reason="", jailed=True, device="cpu", mode="small",
                   speedup_vs_eager=1.0 + i / 100, details={"i": i},
                   timings=[{"shape": "main", "implementation": impl, "device": "cpu", "median_ms": 1.0}
                            for impl in ("candidate", "eager")])


@pytest.fixture
def stores(db_url: str):
    stores = [Store.open(db_url) for _ in range(WORKERS + 2)]
    yield stores
    for store in stores:
        store.close()


def test_workers_finishing_together_lose_nothing(stores: list[Store], tmp_path: Path) -> None:
    first = stores[0]
    task = first.get_or_add_task("relu", tmp_path / "relu.py", "src", "")
    run = first.add_run(task.id, "optimize", {})
    first.update_run(run.id, status="running")
    candidates = [first.add_candidate(run.id, task.id, f"# {i}\n", status="queued").id
                  for i in range(WORKERS * PER_WORKER)]
    for c in candidates:
        first.set_candidate_status(c, "evaluating")
    stored: queue.Queue[int | None] = queue.Queue()

    def worker(w: int) -> None:  # one evaluation GPU: stores the outcomes of its share of the candidates
        for i in range(w, len(candidates), WORKERS):
            stores[w].add_outcome(candidates[i], run.id, outcome(i))
            stored.put(i)

    def loop() -> int:  # the search loop saving its state after each verdict, while the other workers store theirs
        saves = 0
        while stored.get(timeout=60) is not None:
            saves += 1
            stores[WORKERS].update_run(run.id, state={"generation": saves})
        return saves

    def operator() -> None:  # `appliance pause` / resume from the CLI or the TUI, ending paused
        for status in ("paused", "running", "paused", "running", "paused"):
            stores[WORKERS + 1].update_run(run.id, status=status)

    # The loop saves once per stored outcome, as the real loop does after each step: never a tight loop of writes,
    # which on SQLite (whose busy handler is not fair) could keep the write lock from the workers until their busy
    # timeout ran out on a loaded host. Its saves still overlap the workers' and the operator's writes.
    with ThreadPoolExecutor(WORKERS + 2) as pool:
        saver = pool.submit(loop)
        try:
            writers = [pool.submit(worker, w) for w in range(WORKERS)] + [pool.submit(operator)]
            for f in writers:
                f.result()
        finally:
            stored.put(None)  # a writer that failed must fail the test, not leave the loop waiting
        saves = saver.result()
    assert saves == len(candidates)

    rows = first.run_candidates(run.id)
    assert len(rows) == len(candidates)
    assert all(c.status == "evaluated" and e is not None and e.details == {"i": candidates.index(c.id)}
               for c, e in rows)
    final = first.get_run(run.id)
    assert (final.status, final.finished_at, final.state) == ("paused", None, {"generation": saves})
    [summary] = first.list_runs()
    assert (summary.candidates, summary.evaluations) == (len(candidates), len(candidates))
    assert summary.best_speedup_vs_eager == pytest.approx(1.0 + (len(candidates) - 1) / 100)
    with first.engine.connect() as c:
        assert c.execute(sa.text("SELECT count(*) FROM timing")).scalar() == 2 * len(candidates)


def hold_row_then(store: Store, sql: str, then: Callable[[], T]) -> T:
    """Change a row in a transaction left open while `then()` runs in a thread, commit, return its result: the other
    writer reads the row while our change is in flight, the window READ COMMITTED leaves open."""
    with ThreadPoolExecutor(1) as pool, store.engine.connect() as connection:
        connection = connection.execution_options(appliance_write_lock=True)  # SQLite: hold the write lock
        with connection.begin():
            connection.execute(sa.text(sql))
            pending = pool.submit(then)
            time.sleep(0.3)  # long enough for `then` to read and, unlocked, to write or block
        return pending.result(timeout=30)


def test_a_status_written_during_another_status_change_is_not_lost(stores: list[Store], tmp_path: Path) -> None:
    # The loop marks the run finished while an operator resumes it: both happen, in some order, and the stored status
    # is the one written last. Unlocked, the resume read "running", saw nothing to change and wrote nothing.
    first, other = stores[0], stores[1]
    task = first.get_or_add_task("relu", tmp_path / "relu.py", "src", "")
    run = first.add_run(task.id, "optimize", {})
    first.update_run(run.id, status="running")
    resumed = hold_row_then(first, f"UPDATE run SET status = 'finished' WHERE id = {run.id}",
                            lambda: other.update_run(run.id, status="running"))
    assert resumed.status == "running"
    assert first.get_run(run.id).status == "running"


def test_a_candidate_evaluated_during_a_requeue_stays_evaluated(stores: list[Store], tmp_path: Path) -> None:
    # A restarted loop requeues "evaluating" candidates while a worker stores one's evaluation. Unlocked, the requeue
    # overwrote "evaluated" with "queued" and the candidate would have been evaluated twice.
    first, other = stores[0], stores[1]
    task = first.get_or_add_task("relu", tmp_path / "relu.py", "src", "")
    run = first.add_run(task.id, "optimize", {})
    candidate = first.add_candidate(run.id, task.id, "# v\n", status="evaluating")
    requeued = hold_row_then(first, f"UPDATE candidate SET status = 'evaluated' WHERE id = {candidate.id}",
                             lambda: other.requeue_unfinished(run.id))
    assert requeued == 0
    assert first.get_candidate(candidate.id).status == "evaluated"


def test_a_write_that_finds_sqlite_locked_past_its_busy_wait_is_tried_again(tmp_path: Path, monkeypatch) -> None:
    """Another process holds SQLite's write lock longer than the busy wait (a loaded host): the Store backs off
    and writes once the lock is free, instead of failing the evaluation with `database is locked`."""
    import sqlite3
    import threading

    import appliance.db.store as store_module

    monkeypatch.setattr(store_module, "_SQLITE_BUSY_S", 0.1)  # SQLite's own wait runs out at once
    path = tmp_path / "appliance.db"
    store = Store.open(f"sqlite:///{path}")
    task = store.get_or_add_task("relu", tmp_path / "relu.py", "src", "")
    run = store.add_run(task.id, "optimize", {})
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, held for 0.6 s
    release = threading.Timer(0.6, holder.execute, args=("COMMIT",))
    release.start()
    try:
        store.update_run(run.id, status="running")  # waits out the holder by retrying
    finally:
        release.join()
        holder.close()
    assert store.get_run(run.id).status == "running"
    monkeypatch.setattr(store_module, "BUSY_RETRIES", 0)  # and without retries the same wait is an error
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sa.exc.OperationalError, match="locked"):
            store.update_run(run.id, status="paused")
    finally:
        holder.execute("COMMIT")
        holder.close()
        store.close()
