"""The rows an admission writes (the session, its allocations and folder mounts), and the ORM
object it hands back, on the hot path of :func:`labfleet.compute.sessions.admit`.

The statements are compiled once (:class:`labfleet.core.database.Prepared`), the rows are plain dicts,
and the session becomes an ORM object only at the end, already persistent: no unit of work, no
flush, no second read.  On PostgreSQL the ledger's charge and every insert go in one statement
(:func:`write_in_one`): each statement there is a round trip to the server.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Table, bindparam, func, insert, inspect, literal, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session, make_transient_to_detached

from labfleet.compute.tenants import Tenants
from labfleet.core import audit, usage_ledger
from labfleet.core.database import Prepared
from labfleet.core.models import Allocation, AuditEntry, ComputeSession, VFolderMount


def _table(model: type) -> Table:
    return model.__table__  # type: ignore[attr-defined,no-any-return]


_COLUMNS = tuple(c.key for c in _table(ComputeSession).columns)
_ALLOCATION_COLUMNS = ("session_id", "node_id", "device_id", "shares_centi", "cpu_milli", "mem")
_INSERT_SESSION = Prepared(insert(_table(ComputeSession)), _COLUMNS)
_INSERT_ALLOCATION = Prepared(insert(_table(Allocation)), _ALLOCATION_COLUMNS)
_INSERT_MOUNT = insert(_table(VFolderMount))
_MANAGER = inspect(ComputeSession).class_manager


def session_row(t: Tenants, req: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The new session's row (every column), with no status yet (:func:`set_first_status`)."""
    return {
        "id": req.get("id") or str(uuid.uuid4()),
        "name": req["name"],
        "user_id": t.user.id,
        "keypair_id": t.keypair.id,
        "project_id": t.project.id,
        "domain_id": t.user.domain_id,
        "resource_group_id": t.group.id,
        "type": req["type"],
        "image": req["image"],
        "requested_slots": dict(req["shape"].stored),
        "gpu_models": list(req["shape"].gpu_models),
        "status": None,
        "status_reason": "",
        "status_history": [],
        "node_id": None,
        "exit_code": None,
        "created_at": now,
        "status_changed_at": now,
        "runtime": None,
    }


def set_first_status(row: dict[str, Any], status: str, reason: str, now: datetime) -> None:
    """The status an admission gives (SCHEDULED or PENDING), with its history entry, as
    :func:`labfleet.compute.sessions.set_status` writes one (the ledger is charged by the caller)."""
    row["status"] = status
    row["status_reason"] = reason
    row["status_changed_at"] = now
    row["status_history"] = [{"status": status, "at": now.isoformat(), "reason": reason}]


def insert_rows(
    db: Session, row: Mapping[str, Any], allocations: list[dict[str, Any]], mounts: list[tuple[str, str]]
) -> None:
    """Write the session, its allocations and its folder mounts (plain INSERTs, in that order)."""
    conn = db.connection()
    _INSERT_SESSION.execute(conn, row)
    if len(allocations) == 1:
        _INSERT_ALLOCATION.execute(conn, allocations[0])  # the common case: not an executemany
    elif allocations:
        _INSERT_ALLOCATION.execute_many(conn, allocations)
    if mounts:
        conn.execute(
            _INSERT_MOUNT,
            [{"session_id": row["id"], "vfolder_id": vid, "permission": perm} for vid, perm in mounts],
        )


# ---------------------------------------------------------------- PostgreSQL: one statement

_ONE_STATEMENT: dict[tuple[bool, bool, bool], Prepared] = {}
_MOUNT_COLUMNS = ("session_id", "vfolder_id", "permission")


def one_statement(db: Session) -> bool:
    """Does this database write an admission in one statement (:func:`write_in_one`)?
    PostgreSQL does (data-modifying WITH); SQLite runs each INSERT in the process, no round trip."""
    return db.get_bind().dialect.name == "postgresql"


def _values_of(table: Table, prefix: str, columns: tuple[str, ...]) -> dict[str, Any]:
    return {c: bindparam(f"{prefix}{c}", type_=table.c[c].type) for c in columns}


def _unnest_insert(table: Table, name: str, columns: tuple[str, ...]) -> Any:
    """``INSERT INTO table (columns) SELECT * FROM unnest(:name_col, ...)``: any number of rows,
    one per index of the arrays, in one statement text."""
    arrays = [bindparam(f"{name}_{c}", type_=postgresql.ARRAY(table.c[c].type)) for c in columns]
    rows = func.unnest(*arrays).table_valued(*columns).render_derived(name=name)
    return insert(table).from_select(list(columns), select(*rows.c))


def _statement(returning: bool, allocations: bool, mounts: bool) -> Prepared:
    """``WITH charged AS (ledger upsert), new_session AS (INSERT ...), new_entry AS (INSERT ...),
    new_allocations AS (INSERT ...), new_mounts AS (INSERT ...) SELECT ... FROM charged``: one
    statement text per combination (the rows go in as arrays), so the driver prepares it and
    the server plans it once.  Every part runs, referenced or not; the foreign keys of the
    allocations and mounts are checked at the end of the statement, when their session is in."""
    key = (returning, allocations, mounts)
    got = _ONE_STATEMENT.get(key)
    if got is None:
        sessions, audit_log = _table(ComputeSession), _table(AuditEntry)
        charged = usage_ledger.unnest_statement(returning=returning).cte("charged")
        parts = [
            insert(sessions).values(_values_of(sessions, "s_", _COLUMNS)).cte("new_session"),
            insert(audit_log).values(_values_of(audit_log, "l_", audit.COLUMNS)).cte("new_entry"),
        ]
        if allocations:
            rows = _unnest_insert(_table(Allocation), "alloc", _ALLOCATION_COLUMNS)
            parts.append(rows.cte("new_allocations"))
        if mounts:
            parts.append(_unnest_insert(_table(VFolderMount), "mount", _MOUNT_COLUMNS).cte("new_mounts"))
        if returning:
            stmt = select(*charged.c).add_cte(*parts)
        else:
            stmt = select(literal(1)).add_cte(charged, *parts)
        got = _ONE_STATEMENT[key] = Prepared(stmt)
    return got


def write_in_one(
    db: Session,
    charge: list[tuple[str, int, str, int]],
    returning: bool,
    row: Mapping[str, Any],
    allocations: list[dict[str, Any]],
    mounts: list[tuple[str, str]],
    entry: Mapping[str, Any],
) -> usage_ledger.Rows:
    """The ledger's ``charge`` (:func:`labfleet.core.usage_ledger.charge_values`), the session, its
    allocations, its folder mounts and its audit ``entry`` in one statement (PostgreSQL: one round
    trip instead of four); the ledger's rows as they are now when ``returning``."""
    params: dict[str, Any] = usage_ledger.array_params(charge)
    params.update({f"s_{c}": row[c] for c in _COLUMNS})
    params.update({f"l_{c}": entry[c] for c in audit.COLUMNS})
    for c in _ALLOCATION_COLUMNS:
        params[f"alloc_{c}"] = [a[c] for a in allocations]
    params["mount_session_id"] = [row["id"]] * len(mounts)
    params["mount_vfolder_id"] = [vid for vid, _ in mounts]
    params["mount_permission"] = [perm for _, perm in mounts]
    stmt = _statement(returning, bool(allocations), bool(mounts))
    result = stmt.execute(db.connection(), params)
    return usage_ledger.rows_of(result) if returning else {}


def as_object(row: Mapping[str, Any]) -> ComputeSession:
    """A new (transient) ComputeSession with the row's values."""
    return ComputeSession(**{k: row[k] for k in _COLUMNS})


def attach(db: Session, row: Mapping[str, Any]) -> ComputeSession:
    """The session just inserted as an ORM object of ``db``: persistent as loaded, without a
    flush or a read; its relations load on first use.

    Made the way the ORM makes an object it has loaded (an instance without ``__init__``, its
    values set directly, no attribute events): there is nothing to track, the row is written."""
    session: ComputeSession = _MANAGER.new_instance()
    session.__dict__.update((k, row[k]) for k in _COLUMNS)
    make_transient_to_detached(session)  # the values as committed state; the relations unloaded
    db.add(session)
    return session
