"""node agents: node tokens, and per node whether it takes new sessions and which agent registered it

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "node_tokens",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("token_hash", sa.String(255), nullable=False),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("resource_group", sa.String(64), nullable=True),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("last_used", _TS, nullable=True),
        sa.Column("revoked_at", _TS, nullable=True),
    )
    # Plain ADD COLUMN, not batch mode: rebuilding `nodes` on SQLite would cascade into its devices.
    op.add_column("nodes", sa.Column("schedulable", sa.Boolean(), server_default=sa.true(), nullable=False))
    op.add_column("nodes", sa.Column("agent_token_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("agent_token_id")
        batch_op.drop_column("schedulable")
    op.drop_table("node_tokens")
