"""usage ledger and state versions

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from labfleet.core import quanta

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = ("PENDING", "SCHEDULED", "PREPARING", "RUNNING", "TERMINATING")


def upgrade() -> None:
    ledger = op.create_table(
        "usage_ledger",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("scope_kind", sa.String(16), nullable=False),
        sa.Column("scope_id", sa.Integer(), nullable=False),
        sa.Column("slot", sa.String(96), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("scope_kind", "scope_id", "slot", name="uq_usage_ledger_scope_slot"),
    )
    versions = op.create_table(
        "state_versions",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("version", sa.BigInteger(), nullable=False),
    )
    # Pages of GET /api/sessions are ordered by (created_at, id).
    op.create_index("ix_sessions_created_id", "sessions", ["created_at", "id"])
    op.bulk_insert(versions, [{"name": "tenancy", "version": 0}, {"name": "folders", "version": 0}])
    # The ledger of the sessions already live.
    conn = op.get_bind()
    rows = conn.execute(
        sa.text(
            "SELECT requested_slots, status, domain_id, project_id, user_id, keypair_id, resource_group_id "
            "FROM sessions WHERE status IN :live"
        ).bindparams(sa.bindparam("live", expanding=True)),
        {"live": list(LIVE)},
    ).all()
    sessions = (
        (
            r[0] if isinstance(r[0], dict) else _json(r[0]),
            r[1],
            {"domain": r[2], "project": r[3], "user": r[4], "keypair": r[5], "resource_group": r[6]},
        )
        for r in rows
    )
    built = quanta.recompute(sessions, LIVE)
    op.bulk_insert(
        ledger,
        [
            {"scope_kind": kind, "scope_id": ident, "slot": slot, "amount": amount}
            for (kind, ident), row in sorted(built.items())
            for slot, amount in sorted(row.items())
        ],
    )


def _json(value):
    import json

    return json.loads(value) if value else {}


def downgrade() -> None:
    op.drop_index("ix_sessions_created_id", table_name="sessions")
    op.drop_table("state_versions")
    op.drop_table("usage_ledger")
