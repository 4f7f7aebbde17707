"""idle reclamation: samples for the checkers' windows, checkers and bindings, session activity

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "usage_samples",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("session_id", sa.String(36), nullable=False),
        sa.Column("at", _TS, nullable=False),
        *(sa.Column(n, sa.Float(), nullable=True) for n in ("cpu_total", "mem", "gpu", "gpu_mem")),
    )
    op.create_index("ix_usage_samples_session_at", "usage_samples", ["session_id", "at"])
    op.create_index("ix_usage_samples_at", "usage_samples", ["at"])
    op.create_table(
        "idle_checkers",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("owner_domain", sa.String(64), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
    )
    op.create_table(
        "idle_checker_bindings",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "checker_id", sa.Integer(), sa.ForeignKey("idle_checkers.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("scope_kind", sa.String(16), nullable=False),
        sa.Column("scope_name", sa.String(130), nullable=False),
        sa.UniqueConstraint("checker_id", "scope_kind", "scope_name", name="uq_idle_checker_binding"),
    )
    op.create_index("ix_idle_checker_bindings_checker_id", "idle_checker_bindings", ["checker_id"])
    op.create_table(
        "session_activity",
        sa.Column(
            "session_id", sa.String(36), sa.ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("last_activity", _TS, nullable=True),
        sa.Column("busy_kernels", sa.Integer(), nullable=False),
        sa.Column("reported_at", _TS, nullable=True),
        sa.Column("still_here_at", _TS, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("session_activity")
    op.drop_table("idle_checker_bindings")
    op.drop_table("idle_checkers")
    op.drop_table("usage_samples")
