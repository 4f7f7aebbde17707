"""a resource group's answer to a session over its share of a device's memory: gpu_overuse
(auto, warn, kill or stop; see labfleet.usage.overuse)

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("resource_groups") as b:
        b.add_column(sa.Column("gpu_overuse", sa.String(16), nullable=False, server_default="auto"))


def downgrade() -> None:
    with op.batch_alter_table("resource_groups") as b:
        b.drop_column("gpu_overuse")
