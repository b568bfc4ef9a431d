"""The search's bookkeeping: run state, candidate status/island/generation/note/failure/tokens.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("state", sa.JSON(), nullable=False, server_default=sa.text("'{}'")))
    with op.batch_alter_table("candidate") as batch:
        batch.add_column(sa.Column("status", sa.String(), nullable=False, server_default="evaluated"))
        batch.add_column(sa.Column("island", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("generation", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("note", sa.Text(), nullable=False, server_default=""))
        batch.add_column(sa.Column("failure", sa.Text(), nullable=True))
        batch.add_column(sa.Column("tokens_in", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("tokens_out", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("candidate") as batch:
        for name in ("status", "island", "generation", "note", "failure", "tokens_in", "tokens_out"):
            batch.drop_column(name)
    with op.batch_alter_table("run") as batch:
        batch.drop_column("state")
