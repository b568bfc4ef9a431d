"""The database tests run on both backends the appliance supports: a fresh SQLite file, and PostgreSQL when
APPLIANCE_TEST_PG_URL names a server (`scripts/postgres_test_server.sh start` prints one; scripts/test.sh sets it).
Each PostgreSQL test gets an empty schema of its own, first on the connection's search_path, dropped afterwards: as
fresh as a new database and ~100x cheaper to make."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

PG_URL_ENV = "APPLIANCE_TEST_PG_URL"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL for an empty database; test ids end in [sqlite] or [postgresql] (`-k postgresql` picks one)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'state' / 'appliance.db'}"
        return
    server = os.environ.get(PG_URL_ENV)
    if not server:
        pytest.skip(f"no PostgreSQL server: set {PG_URL_ENV} (scripts/postgres_test_server.sh start prints one)")
    schema = f"test_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
    # libpq's `options` reaches every connection the code under test opens, however many engines it makes.
    yield sa.make_url(server).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(False)
    with admin.connect() as connection:
        connection.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
    admin.dispose()
