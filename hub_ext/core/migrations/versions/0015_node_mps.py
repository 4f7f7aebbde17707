"""per node, its MPS daemon as the node reports it: state (on | off | failed), why, and its pipe directory

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN, not batch mode: rebuilding `nodes` on SQLite would cascade into its devices.
    op.add_column("nodes", sa.Column("mps", sa.String(16), server_default="off", nullable=False))
    op.add_column("nodes", sa.Column("mps_reason", sa.Text(), nullable=True))
    op.add_column("nodes", sa.Column("mps_pipe_dir", sa.String(1024), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("mps_pipe_dir")
        batch_op.drop_column("mps_reason")
        batch_op.drop_column("mps")
