"""Initial schema: task, run, candidate, evaluation, timing.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Written by hand to match appliance/db/models.py; tests/db/test_migrations.py compares the two.
Types are plain SQLAlchemy ones so this file keeps meaning the same thing when models.py changes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _created_at() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True), nullable=False)


def upgrade() -> None:
    op.create_table(
        "task",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("path", sa.String(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("source_sha256", sa.String(), nullable=False),
        sa.Column("manifest", sa.Text(), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task")),
        sa.UniqueConstraint("path", "source_sha256", name=op.f("uq_task_path_source_sha256")),
    )
    op.create_index(op.f("ix_task_source_sha256"), "task", ["source_sha256"])

    op.create_table(
        "run",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        _created_at(),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["task_id"], ["task.id"], name=op.f("fk_run_task_id_task")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run")),
    )
    op.create_index(op.f("ix_run_task_id"), "run", ["task_id"])

    op.create_table(
        "candidate",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("source_sha256", sa.String(), nullable=False),
        sa.Column("path", sa.String(), nullable=True),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("proposer", sa.String(), nullable=False),
        _created_at(),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name=op.f("fk_candidate_run_id_run")),
        sa.ForeignKeyConstraint(["task_id"], ["task.id"], name=op.f("fk_candidate_task_id_task")),
        sa.ForeignKeyConstraint(["parent_id"], ["candidate.id"], name=op.f("fk_candidate_parent_id_candidate")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_candidate")),
    )
    op.create_index(op.f("ix_candidate_run_id"), "candidate", ["run_id"])
    op.create_index(op.f("ix_candidate_task_id"), "candidate", ["task_id"])
    op.create_index(op.f("ix_candidate_source_sha256"), "candidate", ["source_sha256"])

    op.create_table(
        "evaluation",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("candidate_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("verdict", sa.String(), nullable=False),
        sa.Column("stage", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("jailed", sa.Boolean(), nullable=False),
        sa.Column("device", sa.String(), nullable=False),
        sa.Column("mode", sa.String(), nullable=False),
        sa.Column("speedup_vs_eager", sa.Float(), nullable=True),
        sa.Column("speedup_vs_compile", sa.Float(), nullable=True),
        sa.Column("environment", sa.JSON(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        _created_at(),
        sa.ForeignKeyConstraint(
            ["candidate_id"], ["candidate.id"], name=op.f("fk_evaluation_candidate_id_candidate")
        ),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name=op.f("fk_evaluation_run_id_run")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evaluation")),
    )
    op.create_index(op.f("ix_evaluation_candidate_id"), "evaluation", ["candidate_id"])
    op.create_index(op.f("ix_evaluation_run_id"), "evaluation", ["run_id"])
    op.create_index(op.f("ix_evaluation_created_at"), "evaluation", ["created_at"])

    op.create_table(
        "timing",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("evaluation_id", sa.Integer(), nullable=False),
        sa.Column("shape", sa.String(), nullable=False),
        sa.Column("sizes", sa.JSON(), nullable=False),
        sa.Column("implementation", sa.String(), nullable=False),
        sa.Column("device", sa.String(), nullable=False),
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("iqr_ms", sa.Float(), nullable=True),
        sa.Column("min_ms", sa.Float(), nullable=True),
        sa.Column("reps", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["evaluation_id"], ["evaluation.id"], name=op.f("fk_timing_evaluation_id_evaluation")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_timing")),
    )
    op.create_index(op.f("ix_timing_evaluation_id"), "timing", ["evaluation_id"])


def downgrade() -> None:
    # Children first, so no foreign key points at a dropped table; indexes go with their tables.
    for table in ("timing", "evaluation", "candidate", "run", "task"):
        op.drop_table(table)
