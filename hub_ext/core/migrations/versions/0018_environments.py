"""My Environments (labfleet.compute.environments): a user's or a project's own images built from
recipes (environments), and the user and project policies' limits on them (max_environments,
max_environment_bytes)

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from labfleet.core.models import UTCDateTime

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

POLICY_TABLES = ("user_resource_policies", "project_resource_policies")


def upgrade() -> None:
    op.create_table(
        "environments",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner_kind", sa.String(16), nullable=False),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=True),
        sa.Column(
            "project_id", sa.Integer(), sa.ForeignKey("projects.id", ondelete="CASCADE"), nullable=True
        ),
        sa.Column("domain_id", sa.Integer(), sa.ForeignKey("domains.id", ondelete="CASCADE"), nullable=False),
        sa.Column("creator", sa.String(255), nullable=False),
        sa.Column("base", sa.String(255), nullable=False),
        sa.Column("recipe", sa.JSON(), nullable=False),
        sa.Column("recipe_hash", sa.String(64), nullable=False),
        sa.Column("image", sa.String(255), nullable=True),
        sa.Column("image_id", sa.String(80), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=False),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.UniqueConstraint("user_id", "name", name="uq_environments_user_name"),
        sa.UniqueConstraint("project_id", "name", name="uq_environments_project_name"),
    )
    for column in ("user_id", "project_id", "domain_id", "recipe_hash"):
        op.create_index(f"ix_environments_{column}", "environments", [column])
    for table in POLICY_TABLES:
        with op.batch_alter_table(table) as b:
            b.add_column(sa.Column("max_environments", sa.Integer(), nullable=False, server_default="3"))
            b.add_column(
                sa.Column("max_environment_bytes", sa.BigInteger(), nullable=False, server_default="0")
            )


def downgrade() -> None:
    for table in POLICY_TABLES:
        with op.batch_alter_table(table) as b:
            b.drop_column("max_environment_bytes")
            b.drop_column("max_environments")
    for column in ("user_id", "project_id", "domain_id", "recipe_hash"):
        op.drop_index(f"ix_environments_{column}", "environments")
    op.drop_table("environments")
