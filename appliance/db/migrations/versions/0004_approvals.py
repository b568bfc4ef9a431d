"""Human review: approvals (who approved or rejected which candidate, when, why) and rechecks of approved winners.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _created_at() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True), nullable=False)


def upgrade() -> None:
    op.create_table(
        "approval",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("candidate_id", sa.Integer(), nullable=False),
        sa.Column("decision", sa.String(), nullable=False),
        sa.Column("who", sa.String(), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        _created_at(),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name=op.f("fk_approval_run_id_run")),
        sa.ForeignKeyConstraint(["candidate_id"], ["candidate.id"], name=op.f("fk_approval_candidate_id_candidate")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_approval")),
    )
    op.create_index(op.f("ix_approval_run_id"), "approval", ["run_id"])
    op.create_index(op.f("ix_approval_candidate_id"), "approval", ["candidate_id"])

    op.create_table(
        "recheck",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("approval_id", sa.Integer(), nullable=False),
        sa.Column("candidate_id", sa.Integer(), nullable=False),
        sa.Column("baseline_evaluation_id", sa.Integer(), nullable=False),
        sa.Column("evaluation_id", sa.Integer(), nullable=False),
        sa.Column("regressed", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        _created_at(),
        sa.ForeignKeyConstraint(["approval_id"], ["approval.id"], name=op.f("fk_recheck_approval_id_approval")),
        sa.ForeignKeyConstraint(["candidate_id"], ["candidate.id"], name=op.f("fk_recheck_candidate_id_candidate")),
        sa.ForeignKeyConstraint(["baseline_evaluation_id"], ["evaluation.id"],
                                name=op.f("fk_recheck_baseline_evaluation_id_evaluation")),
        sa.ForeignKeyConstraint(["evaluation_id"], ["evaluation.id"], name=op.f("fk_recheck_evaluation_id_evaluation")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_recheck")),
    )
    op.create_index(op.f("ix_recheck_approval_id"), "recheck", ["approval_id"])
    op.create_index(op.f("ix_recheck_candidate_id"), "recheck", ["candidate_id"])


def downgrade() -> None:
    op.drop_table("recheck")
    op.drop_table("approval")
