"""An environment build's CPU and memory held in the usage ledger (labfleet.compute.buildcharge)

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("environments") as b:
        b.add_column(sa.Column("build_charge", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("environments") as b:
        b.drop_column("build_charge")
