"""an upload's reservation apart from its size: a resumable upload whose connection ended holds
only the bytes it received

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("vfolder_uploads") as b:
        b.add_column(sa.Column("reserved", sa.BigInteger(), nullable=False, server_default="0"))
    # Until now every upload held its whole size.
    op.execute("UPDATE vfolder_uploads SET reserved = size")


def downgrade() -> None:
    with op.batch_alter_table("vfolder_uploads") as b:
        b.drop_column("reserved")
