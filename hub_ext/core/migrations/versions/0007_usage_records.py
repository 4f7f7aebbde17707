"""usage records: where a session runs, its accounting state, 15-minute buckets

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

_TS = sa.DateTime(timezone=True)

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAMES = (("user", 255), ("project", 130), ("domain", 64), ("resource_group", 64))


def _names() -> list[sa.Column]:
    return [sa.Column(name, sa.String(length), nullable=False) for name, length in _NAMES]


def _amounts(*names: str) -> list[sa.Column]:
    return [sa.Column(name, sa.Float(), nullable=False) for name in names]


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("runtime", sa.JSON(), nullable=True))
    op.create_table(
        "usage_session_state",
        sa.Column("session_id", sa.String(36), primary_key=True),
        *_names(),
        *_amounts("alloc_cpu", "alloc_mem", "alloc_gpu"),
        sa.Column("held_from", _TS, nullable=False),
        sa.Column("held_until", _TS, nullable=True),
        sa.Column("accrued_until", _TS, nullable=False),
        sa.Column("sampled_at", _TS, nullable=True),
        *(
            sa.Column(n, sa.Float(), nullable=True)
            for n in ("cpu_total", "cpu_now", "mem_now", "gpu_now", "gpu_mem_now")
        ),
        *_amounts("mem_peak", "gpu_mem_peak"),
        sa.Column("finished", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_usage_session_state_finished", "usage_session_state", ["finished"])
    for table in ("usage_buckets", "usage_days"):  # 15-minute buckets, and their sums per UTC day
        op.create_table(
            table,
            sa.Column("id", sa.Integer(), primary_key=True),
            sa.Column("session_id", sa.String(36), nullable=False),
            sa.Column("bucket_start", _TS, nullable=False),
            *_names(),
            *_amounts(
                "alloc_cpu",
                "alloc_mem",
                "alloc_gpu",
                "used_cpu",
                "used_mem",
                "used_gpu",
                "mem_peak",
                "gpu_mem_peak",
            ),
            sa.UniqueConstraint("session_id", "bucket_start", name=f"uq_{table}_session_bucket"),
        )
        op.create_index(f"ix_{table}_bucket", table, ["bucket_start"])
        op.create_index(f"ix_{table}_user_bucket", table, ["user", "bucket_start"])
        op.create_index(f"ix_{table}_domain_bucket", table, ["domain", "bucket_start"])


def downgrade() -> None:
    op.drop_table("usage_days")
    op.drop_table("usage_buckets")
    op.drop_table("usage_session_state")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("runtime")
