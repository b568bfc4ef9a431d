"""Store round trips on a real database (SQLite file and PostgreSQL, see conftest.py): what goes in comes back,
linked, counted and ordered."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from appliance.db import Store
from appliance.db.models import Evaluation, Timing

REFERENCE = "class Model:\n    def forward(self, x):\n        return x.relu()\n"


@pytest.fixture
def store(db_url: str):
    store = Store.open(db_url)
    yield store
    store.close()


def timing(implementation: str, median_ms: float, **extra: Any) -> dict[str, Any]:
    return {
        "shape": "main",
        "sizes": {"batch": 16, "dim": 4096},
        "implementation": implementation,
        "device": "cpu",
        "median_ms": median_ms,
        "iqr_ms": 0.01,
        "min_ms": median_ms * 0.9,
        "reps": 100,
        **extra,
    }


def evaluate(
    store: Store,
    run_id: int,
    task_id: int,
    verdict: str,
    speedup: float | None,
    path: str | None = "cand.py",
    proposer: str = "manual",
) -> Evaluation:
    """A candidate and its evaluation, as the evaluation client will store them."""
    passed = verdict == "pass"
    candidate = store.add_candidate(run_id, task_id, f"# {verdict} {speedup}\n", path=path, proposer=proposer)
    return store.add_evaluation(
        candidate.id,
        run_id,
        verdict=verdict,
        stage="done" if passed else "correctness",
        reason="" if passed else "max abs error 3.2 at [0, 7]",
        jailed=True,
        device="cpu",
        mode="small",
        speedup_vs_eager=speedup,
    )


def test_a_task_is_identified_by_path_and_content(store: Store, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    task = store.get_or_add_task("relu", "relu.py", REFERENCE, "[tolerance]\natol = 1e-4\n")
    assert task.path == str(tmp_path / "relu.py")  # stored absolute
    assert task.manifest == "[tolerance]\natol = 1e-4\n"
    assert task.created_at.tzinfo == UTC

    assert store.get_or_add_task("relu", tmp_path / "relu.py", REFERENCE, "").id == task.id
    edited = store.get_or_add_task("relu", "relu.py", REFERENCE + "# edited\n", "")
    moved = store.get_or_add_task("relu", "other/relu.py", REFERENCE, "")
    assert len({task.id, edited.id, moved.id}) == 3
    assert edited.source_sha256 != task.source_sha256 == moved.source_sha256


def test_run_lifecycle(store: Store, tmp_path: Path) -> None:
    task = store.get_or_add_task("relu", tmp_path / "relu.py", REFERENCE, "")
    run = store.add_run(task.id, "eval", {"mode": "small", "seeds": [0, 1]})
    assert (run.status, run.config, run.finished_at) == ("created", {"mode": "small", "seeds": [0, 1]}, None)

    assert store.start_run(run.id).status == "running"
    finished = store.finish_run(run.id, "failed")
    assert finished.status == "failed" and finished.finished_at is not None
    assert finished.finished_at.tzinfo == UTC and finished.finished_at >= run.created_at

    with pytest.raises(ValueError):
        store.finish_run(run.id, "running")
    with pytest.raises(KeyError):
        store.finish_run(run.id + 100)


def test_evaluation_round_trip_with_timings(store: Store, tmp_path: Path) -> None:
    task = store.get_or_add_task("relu", tmp_path / "relu.py", REFERENCE, "")
    run = store.add_run(task.id, "eval", {})
    parent = store.add_candidate(run.id, task.id, "# v1\n", path="v1.py")
    child = store.add_candidate(run.id, task.id, "# v2\n", parent_id=parent.id, proposer="llm")
    assert (child.parent_id, child.proposer, child.path) == (parent.id, "llm", None)
    found = store.get_candidate(child.id)
    assert found is not None and found.source == "# v2\n"

    environment = {"gpu": None, "torch": "2.13.0", "python": "3.11.7", "hostname": "ci"}
    details = {"cases": [{"seed": 0, "max_abs_error": 0.0}]}
    evaluation = store.add_evaluation(
        child.id,
        run.id,
        verdict="pass",
        stage="done",
        reason="",
        jailed=True,
        device="cpu",
        mode="full",
        speedup_vs_eager=2.0,
        speedup_vs_compile=None,
        environment=environment,
        details=details,
        timings=[
            timing("candidate", 0.5),
            timing("eager", 1.0),
            {**timing("compile", 0.0), "median_ms": None, "iqr_ms": None, "min_ms": None, "reps": None,
             "error": "torch.compile unavailable on this host"},
        ],
    )

    found_evaluation = store.get_evaluation(evaluation.id)
    assert found_evaluation is not None
    stored, stored_timings = found_evaluation
    assert (stored.environment, stored.details) == (environment, details)
    assert (stored.verdict, stored.jailed, stored.speedup_vs_eager) == ("pass", True, 2.0)
    assert stored.created_at.tzinfo == UTC
    assert [t.implementation for t in stored_timings] == ["candidate", "eager", "compile"]
    assert stored_timings[0].sizes == {"batch": 16, "dim": 4096}
    assert (stored_timings[2].median_ms, stored_timings[2].error) == (None, "torch.compile unavailable on this host")
    assert all(t.evaluation_id == evaluation.id for t in stored_timings)
    assert store.get_evaluation(evaluation.id + 100) is None
    assert store.get_candidate(child.id + 100) is None


def test_an_evaluation_and_its_timings_are_stored_together_or_not_at_all(store: Store, tmp_path: Path) -> None:
    task = store.get_or_add_task("relu", tmp_path / "relu.py", REFERENCE, "")
    run = store.add_run(task.id, "eval", {})
    candidate = store.add_candidate(run.id, task.id, "# v1\n")
    fields = dict(verdict="pass", stage="done", jailed=True, device="cpu", mode="small")

    with pytest.raises(ValueError, match="median"):  # a typo in a field name is caught before writing
        store.add_evaluation(candidate.id, run.id, **fields, timings=[{**timing("eager", 1.0), "median": 1.0}])
    broken = timing("eager", 1.0)
    del broken["shape"]
    with pytest.raises(IntegrityError):  # the timing fails after the evaluation row was flushed
        store.add_evaluation(candidate.id, run.id, **fields, timings=[timing("candidate", 0.5), broken])

    with store.engine.connect() as connection:
        for table in (Evaluation.__tablename__, Timing.__tablename__):
            assert connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar() == 0


def test_foreign_keys_are_enforced(store: Store, tmp_path: Path) -> None:
    task = store.get_or_add_task("relu", tmp_path / "relu.py", REFERENCE, "")
    run = store.add_run(task.id, "eval", {})
    with pytest.raises(IntegrityError):
        store.add_evaluation(999, run.id, verdict="pass", stage="done", jailed=True, device="cpu", mode="small")
    with pytest.raises(IntegrityError):
        store.add_run(999, "eval", {})
    with pytest.raises(IntegrityError):
        store.add_candidate(run.id, task.id, "# v\n", parent_id=999)


def test_list_evaluations_newest_first_and_by_task(store: Store, tmp_path: Path) -> None:
    relu = store.get_or_add_task("relu", tmp_path / "relu.py", REFERENCE, "")
    gelu = store.get_or_add_task("gelu", tmp_path / "gelu.py", REFERENCE.replace("relu", "gelu"), "")
    relu_run, gelu_run = store.add_run(relu.id, "eval", {}), store.add_run(gelu.id, "eval", {})
    first = evaluate(store, relu_run.id, relu.id, "pass", 1.5, path="a.py")
    second = evaluate(store, gelu_run.id, gelu.id, "wrong_output", None, path=None, proposer="llm")
    third = evaluate(store, relu_run.id, relu.id, "pass", 2.5, path="b.py")

    rows = store.list_evaluations()
    assert [row.id for row in rows] == [third.id, second.id, first.id]
    newest, failed = rows[0], rows[1]
    assert (newest.task_name, newest.candidate_path, newest.proposer, newest.run_id) == (
        "relu", "b.py", "manual", relu_run.id
    )
    assert (newest.verdict, newest.stage, newest.speedup_vs_eager, newest.device) == ("pass", "done", 2.5, "cpu")
    assert newest.created_at.tzinfo == UTC and newest.created_at >= rows[-1].created_at
    assert (failed.verdict, failed.reason, failed.candidate_path, failed.proposer) == (
        "wrong_output", "max abs error 3.2 at [0, 7]", None, "llm"
    )

    assert [row.id for row in store.list_evaluations(task_name="relu")] == [third.id, first.id]
    assert [row.id for row in store.list_evaluations(limit=1, task_name="relu")] == [third.id]
    assert store.list_evaluations(task_name="softmax") == []


def test_list_runs_counts_and_best_passing_speedup(store: Store, tmp_path: Path) -> None:
    task = store.get_or_add_task("relu", tmp_path / "relu.py", REFERENCE, "")
    busy, empty = store.add_run(task.id, "optimize", {}), store.add_run(task.id, "eval", {})
    evaluate(store, busy.id, task.id, "pass", 1.5)
    evaluate(store, busy.id, task.id, "pass", 3.0)
    evaluate(store, busy.id, task.id, "wrong_output", 50.0)  # a fast wrong answer is no win
    store.add_candidate(busy.id, task.id, "# not evaluated yet\n")
    store.finish_run(busy.id)

    runs = store.list_runs()
    assert [run.id for run in runs] == [empty.id, busy.id]
    assert (runs[0].candidates, runs[0].evaluations, runs[0].best_speedup_vs_eager) == (0, 0, None)
    assert (runs[1].task_name, runs[1].kind, runs[1].status) == ("relu", "optimize", "finished")
    assert (runs[1].candidates, runs[1].evaluations, runs[1].best_speedup_vs_eager) == (4, 3, 3.0)
    assert [run.id for run in store.list_runs(limit=1)] == [empty.id]


def test_two_stores_on_one_file_see_each_others_writes(db_url: str, tmp_path: Path) -> None:
    writer, reader = Store.open(db_url), Store.open(db_url)
    task = writer.get_or_add_task("relu", tmp_path / "relu.py", REFERENCE, "")
    run = writer.add_run(task.id, "eval", {})
    assert reader.get_or_add_task("relu", tmp_path / "relu.py", REFERENCE, "").id == task.id
    evaluation = evaluate(reader, run.id, task.id, "pass", 2.0)
    assert [row.id for row in writer.list_evaluations()] == [evaluation.id]
    writer.close()
    reader.close()


def test_concurrent_writers_add_a_task_once(db_url: str, tmp_path: Path) -> None:
    stores = [Store.open(db_url) for _ in range(4)]

    def add(i: int) -> int:
        return stores[i % 4].get_or_add_task("relu", tmp_path / "relu.py", REFERENCE, "").id

    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(add, range(32)))
    assert len(ids) == 1
    for store in stores:
        store.close()


def test_a_list_of_runs_reads_their_candidates_in_a_fixed_few_queries_and_no_code(store: Store, tmp_path: Path) -> None:
    """`appliance runs` summarises every listed run's proposers: one query per run (and every candidate's source)
    made the list slow on a database of long runs."""
    from sqlalchemy import event

    task = store.get_or_add_task("relu", tmp_path / "relu.py", REFERENCE, "")
    runs = [store.add_run(task.id, "optimize", {"proposer": "tune"}) for _ in range(5)]
    for run in runs:
        evaluate(store, run.id, task.id, "pass", 1.5, proposer="tune")
        store.add_candidate(run.id, task.id, "# queued\n", proposer="tune")
    statements: list[str] = []

    def count(conn, cursor, statement, *args) -> None:
        statements.append(statement)

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        summaries = store.runs_summaries([r.id for r in runs])
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
    assert len([s for s in statements if s.lstrip().upper().startswith("SELECT")]) == 2, statements
    selected = [s.split("FROM")[0] for s in statements]
    assert not any(re.search(r"candidate\.source\b(?!_)", s) for s in selected), selected
    for run in runs:
        config, rows = summaries[run.id]
        assert config == {"proposer": "tune"} and len(rows) == 2
        assert [e is not None for _, e in rows] == [True, False]
    assert store.runs_summaries([]) == {}
