"""The Alembic migrations against real databases (SQLite files and PostgreSQL, see conftest.py): they build exactly
the models' schema, re-running is safe, and an old database keeps its rows."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlmodel import SQLModel

from appliance.db import Store, make_engine, migrate, schema_version
from appliance.db.store import MIGRATIONS_DIR

TABLES = set(SQLModel.metadata.tables)  # every model's table (task, run, candidate, evaluation, timing, ...)
HEAD = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()


def url(path: Path) -> str:
    return f"sqlite:///{path}"


def schema_diff(engine: sa.Engine, metadata: sa.MetaData) -> list:
    with engine.connect() as connection:
        return compare_metadata(MigrationContext.configure(connection), metadata)


@pytest.fixture
def engine(db_url: str):
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


def test_migrate_creates_the_tables_at_head(engine: sa.Engine) -> None:
    assert schema_version(engine) == ""
    migrate(engine)
    assert set(sa.inspect(engine).get_table_names()) == TABLES | {"alembic_version"}
    assert schema_version(engine) == ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head() == HEAD


def test_migrated_schema_matches_the_models(engine: sa.Engine) -> None:
    # Fails when a model changes without a migration (or a migration without the model).
    migrate(engine)
    assert schema_diff(engine, SQLModel.metadata) == []


def test_schema_check_notices_a_model_change(engine: sa.Engine) -> None:
    # Guards the test above: the comparison does see columns, types, indexes and constraints.
    migrate(engine)
    changed = sa.MetaData(naming_convention=SQLModel.metadata.naming_convention)
    for table in SQLModel.metadata.tables.values():
        table.to_metadata(changed)
    changed.tables["timing"].append_column(sa.Column("energy_j", sa.Float()))
    changed.tables["run"].c.kind.type = sa.Text()
    changed.tables["evaluation"].c.reason.nullable = True
    sa.Index("ix_candidate_proposer", changed.tables["candidate"].c.proposer)
    task = changed.tables["task"]
    task.constraints.discard(next(c for c in task.constraints if isinstance(c, sa.UniqueConstraint)))

    kinds = {diff[0] if isinstance(diff, tuple) else diff[0][0] for diff in schema_diff(engine, changed)}
    assert {"add_column", "modify_type", "modify_nullable", "add_index", "remove_constraint"} <= kinds


def test_migrating_again_is_a_no_op_that_keeps_rows(db_url: str, tmp_path: Path) -> None:
    store = Store.open(db_url)
    task = store.get_or_add_task("relu", tmp_path / "relu.py", "class Model: ...", "")
    store.close()

    reopened = Store.open(db_url)
    migrate(reopened.engine)
    assert schema_version(reopened.engine) == HEAD
    again = reopened.get_or_add_task("relu", tmp_path / "relu.py", "class Model: ...", "")
    assert again.id == task.id
    reopened.close()


def test_processes_starting_together_on_a_new_database_all_migrate(db_url: str) -> None:
    # Controller, CLI and TUI may open a fresh database at once: a lock (SQLite's write lock, a PostgreSQL advisory
    # lock) serialises their migrations.
    def open_and_close(_: int) -> str:
        store = Store.open(db_url)
        version = schema_version(store.engine)
        store.close()
        return version

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(open_and_close, range(4))) == [HEAD] * 4


def test_file_database_uses_wal_foreign_keys_and_busy_timeout(tmp_path: Path) -> None:
    engine = make_engine(url(tmp_path / "new" / "dir" / "appliance.db"))  # parent directories are created
    with engine.connect() as connection:
        pragma = lambda name: connection.exec_driver_sql(f"PRAGMA {name}").scalar()  # noqa: E731
        assert pragma("journal_mode") == "wal"
        assert pragma("foreign_keys") == 1
        assert pragma("busy_timeout") == 30000
    engine.dispose()


def test_in_memory_database_is_shared_between_sessions() -> None:
    store = Store.open("sqlite://")
    task = store.get_or_add_task("relu", "relu.py", "src", "")
    assert store.get_or_add_task("relu", "relu.py", "src", "").id == task.id
    assert schema_version(store.engine) == HEAD
    store.close()


def test_upgrading_an_old_database_keeps_its_rows(engine: sa.Engine) -> None:
    migrate(engine, "0001")
    with engine.begin() as c:  # a row in each table, as the 0001 schema had them
        for insert in (
            "INSERT INTO task (id, name, path, source, source_sha256, manifest, created_at) "
            "VALUES (1, 'relu', '/t/relu.py', 'src', 'abc', '', CURRENT_TIMESTAMP)",
            "INSERT INTO run (id, task_id, kind, status, config, created_at) "
            "VALUES (1, 1, 'optimize', 'running', '{}', CURRENT_TIMESTAMP)",
            "INSERT INTO candidate (id, run_id, task_id, source, source_sha256, proposer, created_at) "
            "VALUES (1, 1, 1, 'src', 'abc', 'llm', CURRENT_TIMESTAMP)",
            "INSERT INTO evaluation (id, candidate_id, run_id, verdict, stage, reason, jailed, device, mode, "
            "environment, details, created_at) "
            "VALUES (1, 1, 1, 'pass', 'done', '', TRUE, 'cuda', 'full', '{}', '{}', CURRENT_TIMESTAMP)",
            "INSERT INTO timing (evaluation_id, shape, sizes, implementation, device, median_ms) "
            "VALUES (1, 'main', '{}', 'candidate', 'cuda', 0.5)",
        ):
            c.execute(sa.text(insert))
    migrate(engine)
    assert schema_version(engine) == HEAD
    with engine.connect() as c:
        assert tuple(c.execute(sa.text("SELECT median_ms, roofline_fraction FROM timing")).one()) == (0.5, None)
        # 0003's new columns got their server defaults on the old rows.
        assert tuple(c.execute(sa.text("SELECT status, tokens_in, note FROM candidate")).one()) == ("evaluated", 0, "")
        assert c.execute(sa.text("SELECT state FROM run")).scalar() in ({}, "{}")  # JSON parsed by psycopg only
