"""imports (labfleet.storage.imports): a user's stored token per host (import_credentials) and a
domain's hosts to allow or deny (domains.import_hosts)

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from labfleet.core.models import UTCDateTime

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "import_credentials",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("host", sa.String(253), nullable=False),
        sa.Column("username", sa.String(128), nullable=False),
        sa.Column("token_encrypted", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("user_id", "host", name="uq_import_credentials_user_host"),
    )
    op.create_index("ix_import_credentials_user_id", "import_credentials", ["user_id"])
    with op.batch_alter_table("domains") as b:
        b.add_column(sa.Column("import_hosts", sa.JSON(), nullable=False, server_default="{}"))


def downgrade() -> None:
    with op.batch_alter_table("domains") as b:
        b.drop_column("import_hosts")
    op.drop_index("ix_import_credentials_user_id", "import_credentials")
    op.drop_table("import_credentials")
