"""keypair policies nobody walks around: the keypairs a user may hold, and the keypair policies
a domain's admins may hand out

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("user_resource_policies") as b:
        b.add_column(sa.Column("max_keypairs", sa.Integer(), nullable=False, server_default="10"))
    with op.batch_alter_table("domains") as b:
        b.add_column(sa.Column("allowed_keypair_policies", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("domains") as b:
        b.drop_column("allowed_keypair_policies")
    with op.batch_alter_table("user_resource_policies") as b:
        b.drop_column("max_keypairs")
