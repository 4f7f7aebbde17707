"""Save as environment (labfleet.compute.environments): the session an environment was made of

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("environments") as b:
        b.add_column(sa.Column("source_session", sa.String(36), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("environments") as b:
        b.drop_column("source_session")
