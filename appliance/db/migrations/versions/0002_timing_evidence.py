"""Timing evidence: achieved rates, roofline fraction, device-wide cross-check, energy per call.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

COLUMNS = ("gbps", "tflops", "roofline_fraction", "device_wide_ms", "energy_j_per_call")


def upgrade() -> None:
    with op.batch_alter_table("timing") as batch:  # batch: SQLite cannot alter tables in place
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("timing") as batch:
        for name in COLUMNS:
            batch.drop_column(name)
