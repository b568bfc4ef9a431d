"""The Alembic migrations against real SQLite files: they build exactly the models' schema, and re-running is safe."""

from __future__ import annotations

import sqlite3
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

TABLES = {"task", "run", "candidate", "evaluation", "timing"}
HEAD = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()


def url(path: Path) -> str:
    return f"sqlite:///{path}"


def schema_diff(engine: sa.Engine, metadata: sa.MetaData) -> list:
    with engine.connect() as connection:
        return compare_metadata(MigrationContext.configure(connection), metadata)


@pytest.fixture
def engine(tmp_path: Path):
    engine = make_engine(url(tmp_path / "appliance.db"))
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


def test_migrating_again_is_a_no_op_that_keeps_rows(tmp_path: Path) -> None:
    store = Store.open(url(tmp_path / "appliance.db"))
    task = store.get_or_add_task("relu", tmp_path / "relu.py", "class Model: ...", "")
    store.close()

    reopened = Store.open(url(tmp_path / "appliance.db"))
    migrate(reopened.engine)
    assert schema_version(reopened.engine) == HEAD
    again = reopened.get_or_add_task("relu", tmp_path / "relu.py", "class Model: ...", "")
    assert again.id == task.id
    reopened.close()


def test_processes_starting_together_on_a_new_file_all_migrate(tmp_path: Path) -> None:
    # Controller, CLI and TUI may open a fresh database at once: the write lock serialises their migrations.
    def open_and_close(_: int) -> str:
        store = Store.open(url(tmp_path / "fresh.db"))
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
        assert pragma("busy_timeout") == 5000
    engine.dispose()


def test_in_memory_database_is_shared_between_sessions() -> None:
    store = Store.open("sqlite://")
    task = store.get_or_add_task("relu", "relu.py", "src", "")
    assert store.get_or_add_task("relu", "relu.py", "src", "").id == task.id
    assert schema_version(store.engine) == HEAD
    store.close()


def test_upgrading_an_old_database_keeps_its_rows(tmp_path: Path) -> None:
    engine = make_engine(url(tmp_path / "appliance.db"))
    migrate(engine, "0001")
    with sqlite3.connect(tmp_path / "appliance.db") as c:  # plain sqlite3: no foreign keys for this lone row
        c.execute("INSERT INTO timing (evaluation_id, shape, sizes, implementation, device, median_ms) "
                  "VALUES (1, 'main', '{}', 'candidate', 'cuda', 0.5)")
    migrate(engine)
    assert schema_version(engine) == HEAD
    with engine.connect() as c:
        row = c.execute(sa.text("SELECT median_ms, roofline_fraction FROM timing")).one()
    assert tuple(row) == (0.5, None)
    engine.dispose()
