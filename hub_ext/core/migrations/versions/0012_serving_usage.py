"""serving usage: requests, errors and latency per endpoint, token and 15-minute bucket

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEXES = {
    "ix_serving_usage_bucket": ["bucket_start"],
    "ix_serving_usage_endpoint_bucket": ["endpoint_id", "bucket_start"],
    "ix_serving_usage_user_bucket": ["user", "bucket_start"],
    "ix_serving_usage_domain_bucket": ["domain", "bucket_start"],
}


def upgrade() -> None:
    op.create_table(
        "serving_usage",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("endpoint_id", sa.String(36), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=True),
        sa.Column("bucket_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("project", sa.String(130), nullable=False),
        sa.Column("domain", sa.String(64), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("latency_ms_total", sa.Float(), nullable=False),
    )
    for name, cols in _INDEXES.items():
        op.create_index(name, "serving_usage", cols)


def downgrade() -> None:
    for name in _INDEXES:
        op.drop_index(name, table_name="serving_usage")
    op.drop_table("serving_usage")
