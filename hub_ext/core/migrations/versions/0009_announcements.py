"""announcements: the banner on the Hub's pages and in the Fleet sidebar, with its history

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "announcements",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("published_by", sa.String(255), nullable=False),
        sa.Column("published_at", _TS, nullable=False),
        sa.Column("cleared_by", sa.String(255), nullable=True),
        sa.Column("cleared_at", _TS, nullable=True),
    )
    op.create_index("ix_announcements_cleared_at", "announcements", ["cleared_at"])


def downgrade() -> None:
    op.drop_index("ix_announcements_cleared_at", table_name="announcements")
    op.drop_table("announcements")
