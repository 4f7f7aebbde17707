"""resource groups: alloc_version, the version of the group's allocation state

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # batch mode: SQLite cannot add a NOT NULL column in place; existing groups start at 0.
    with op.batch_alter_table("resource_groups", schema=None) as batch_op:
        batch_op.add_column(sa.Column("alloc_version", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("resource_groups", schema=None) as batch_op:
        batch_op.drop_column("alloc_version")
