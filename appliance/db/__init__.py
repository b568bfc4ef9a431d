"""Persistence: SQLModel tables, Alembic migrations and the Store the rest of the appliance uses."""

from appliance.db.models import Candidate, Evaluation, Run, Task, Timing
from appliance.db.store import EvaluationRow, RunRow, Store, make_engine, migrate, schema_version

__all__ = [
    "Candidate",
    "Evaluation",
    "EvaluationRow",
    "Run",
    "RunRow",
    "Store",
    "Task",
    "Timing",
    "make_engine",
    "migrate",
    "schema_version",
]
