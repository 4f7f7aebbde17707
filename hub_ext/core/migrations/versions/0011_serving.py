"""model serving: endpoints, their routes (replicas) and tokens; a user policy's serving limits

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column(
        "user_resource_policies", sa.Column("max_endpoints", sa.Integer(), server_default="0", nullable=False)
    )
    op.add_column(
        "user_resource_policies",
        sa.Column("max_replicas_per_endpoint", sa.Integer(), server_default="0", nullable=False),
    )
    op.create_table(
        "serving_endpoints",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column(
            "project_id", sa.Integer(), sa.ForeignKey("projects.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("domain_id", sa.Integer(), sa.ForeignKey("domains.id", ondelete="CASCADE"), nullable=False),
        sa.Column(
            "vfolder_id", sa.String(36), sa.ForeignKey("vfolders.id", ondelete="SET NULL"), nullable=True
        ),
        sa.Column("folder_name", sa.String(64), nullable=False),
        sa.Column("image", sa.String(255), nullable=True),
        sa.Column("resource_group", sa.String(64), nullable=True),
        sa.Column("slots", sa.JSON(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("definition", sa.JSON(), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("open_to_public", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=False),
        sa.Column("failure_streak", sa.Integer(), nullable=False),
        sa.Column("next_start_at", _TS, nullable=True),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("latency_ms_total", sa.Float(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("modified_at", _TS, nullable=False),
        sa.Column("destroyed_at", _TS, nullable=True),
    )
    op.create_index("ix_serving_endpoints_name_status", "serving_endpoints", ["name", "status"])
    for col in ("user_id", "project_id", "domain_id", "vfolder_id"):
        op.create_index(f"ix_serving_endpoints_{col}", "serving_endpoints", [col])
    op.create_table(
        "serving_routes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "endpoint_id",
            sa.String(36),
            sa.ForeignKey("serving_endpoints.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("server", sa.String(255), nullable=False),
        sa.Column("session_id", sa.String(36), nullable=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("health", sa.String(16), nullable=False),
        sa.Column("traffic", sa.String(16), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("ready_at", _TS, nullable=True),
        sa.Column("checked_at", _TS, nullable=True),
        sa.Column("ended_at", _TS, nullable=True),
    )
    op.create_index("ix_serving_routes_endpoint_id", "serving_routes", ["endpoint_id"])
    op.create_table(
        "serving_tokens",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "endpoint_id",
            sa.String(36),
            sa.ForeignKey("serving_endpoints.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("token_hash", sa.String(255), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("rate_limit", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("expires_at", _TS, nullable=True),
        sa.Column("last_used", _TS, nullable=True),
        sa.Column("revoked_at", _TS, nullable=True),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("latency_ms_total", sa.Float(), nullable=False),
    )
    op.create_index("ix_serving_tokens_endpoint_id", "serving_tokens", ["endpoint_id"])


def downgrade() -> None:
    op.drop_index("ix_serving_tokens_endpoint_id", table_name="serving_tokens")
    op.drop_table("serving_tokens")
    op.drop_index("ix_serving_routes_endpoint_id", table_name="serving_routes")
    op.drop_table("serving_routes")
    for col in ("user_id", "project_id", "domain_id", "vfolder_id"):
        op.drop_index(f"ix_serving_endpoints_{col}", table_name="serving_endpoints")
    op.drop_index("ix_serving_endpoints_name_status", table_name="serving_endpoints")
    op.drop_table("serving_endpoints")
    with op.batch_alter_table("user_resource_policies", schema=None) as batch_op:
        batch_op.drop_column("max_replicas_per_endpoint")
        batch_op.drop_column("max_endpoints")
