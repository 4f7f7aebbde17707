"""vfolders: storage hosts, folders, permissions, invitations, uploads, mounts

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-21
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("domains") as b:
        b.add_column(sa.Column("allowed_vfolder_hosts", sa.JSON(), nullable=False, server_default="{}"))
    with op.batch_alter_table("projects") as b:
        b.add_column(sa.Column("allowed_vfolder_hosts", sa.JSON(), nullable=False, server_default="{}"))
    for table in ("user_resource_policies", "project_resource_policies"):
        with op.batch_alter_table(table) as b:
            b.add_column(sa.Column("max_vfolder_size", sa.BigInteger(), nullable=False, server_default="0"))
    op.create_table(
        "storage_hosts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("capacity", sa.BigInteger(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("default_permissions", sa.JSON(), nullable=False),
        sa.Column("owner_uid", sa.Integer(), nullable=True),
        sa.Column("owner_gid", sa.Integer(), nullable=True),
        sa.Column("is_active", sa.Boolean(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
    )
    op.create_table(
        "vfolders",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column(
            "host_id", sa.Integer(), sa.ForeignKey("storage_hosts.id", ondelete="RESTRICT"), nullable=False
        ),
        sa.Column("domain_id", sa.Integer(), sa.ForeignKey("domains.id", ondelete="CASCADE"), nullable=False),
        sa.Column("owner_kind", sa.String(16), nullable=False),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=True),
        sa.Column(
            "project_id", sa.Integer(), sa.ForeignKey("projects.id", ondelete="CASCADE"), nullable=True
        ),
        sa.Column("creator", sa.String(255), nullable=False),
        sa.Column("usage_mode", sa.String(16), nullable=False),
        sa.Column("permission", sa.String(16), nullable=False),
        sa.Column("max_size", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("usage_bytes", sa.BigInteger(), nullable=False),
        sa.Column("usage_files", sa.Integer(), nullable=False),
        sa.Column("trash_bytes", sa.BigInteger(), nullable=False),
        sa.Column("usage_scanned_at", _TS, nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("modified_at", _TS, nullable=False),
        sa.Column("deleted_at", _TS, nullable=True),
        sa.UniqueConstraint("user_id", "name", name="uq_vfolders_user_name"),
        sa.UniqueConstraint("project_id", "name", name="uq_vfolders_project_name"),
    )
    for col in ("host_id", "domain_id", "user_id", "project_id"):
        op.create_index(f"ix_vfolders_{col}", "vfolders", [col])
    op.create_table(
        "vfolder_permissions",
        sa.Column(
            "vfolder_id", sa.String(36), sa.ForeignKey("vfolders.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("permission", sa.String(16), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
    )
    op.create_index("ix_vfolder_permissions_user_id", "vfolder_permissions", ["user_id"])
    op.create_table(
        "vfolder_invitations",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column(
            "vfolder_id", sa.String(36), sa.ForeignKey("vfolders.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("inviter_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("invitee_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("permission", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("modified_at", _TS, nullable=False),
    )
    op.create_index("ix_vfolder_invitations_vfolder_id", "vfolder_invitations", ["vfolder_id"])
    op.create_index("ix_vfolder_invitations_invitee_id", "vfolder_invitations", ["invitee_id"])
    op.create_table(
        "vfolder_uploads",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column(
            "vfolder_id", sa.String(36), sa.ForeignKey("vfolders.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
    )
    op.create_index("ix_vfolder_uploads_vfolder_id", "vfolder_uploads", ["vfolder_id"])
    op.create_table(
        "vfolder_mounts",
        sa.Column(
            "session_id", sa.String(36), sa.ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column(
            "vfolder_id", sa.String(36), sa.ForeignKey("vfolders.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("permission", sa.String(16), nullable=False),
    )
    op.create_index("ix_vfolder_mounts_vfolder_id", "vfolder_mounts", ["vfolder_id"])


def downgrade() -> None:
    for table in (
        "vfolder_mounts",
        "vfolder_uploads",
        "vfolder_invitations",
        "vfolder_permissions",
        "vfolders",
    ):
        op.drop_table(table)
    op.drop_table("storage_hosts")
    for table in ("user_resource_policies", "project_resource_policies"):
        with op.batch_alter_table(table) as b:
            b.drop_column("max_vfolder_size")
    with op.batch_alter_table("projects") as b:
        b.drop_column("allowed_vfolder_hosts")
    with op.batch_alter_table("domains") as b:
        b.drop_column("allowed_vfolder_hosts")
