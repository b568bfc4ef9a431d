"""Evaluations record whether a memory limit bound the candidate (False only under the operator's opt-out,
APPLIANCE_UNSAFE_NO_MEMORY_LIMIT, like `jailed` for --unsafe-no-jail).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("evaluation") as batch:  # batch: SQLite cannot alter tables in place
        batch.add_column(sa.Column("memory_limited", sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table("evaluation") as batch:
        batch.drop_column("memory_limited")
