"""The usage ledger (its rows in the DB): what each scope's live sessions hold, kept as the sessions change.

One row per (scope, slot) in ``usage_ledger`` (see :class:`hub_ext.core.models.UsageLedger` and
:mod:`hub_ext.core.quanta`), for the scopes a quota names: the session's domain, project, user,
keypair and resource group.  Every change is an increment in SQL (``amount = amount + delta``),
written in the transaction that admits, places or ends the session, so concurrent changes never
lose one another; admission reads the rows it needs back from the same statement
(``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``), which on PostgreSQL also locks them until
commit: two admissions that share a scope are serialised on its rows, and rows are always taken
in one order (:data:`~hub_ext.core.models.LEDGER_SCOPES`, then id), so they never deadlock.

``recalculate`` rebuilds the ledger from the sessions (Backend.AI's "recalculate usage"), with
every writer kept out: the whole table is locked on PostgreSQL, the database on SQLite.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import delete, event, insert, or_, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from hub_ext.core import quanta
from hub_ext.core.models import (
    HOLDING_STATUSES,
    LEDGER_SCOPES,
    ComputeSession,
    Domain,
    Keypair,
    Project,
    UsageLedger,
    User,
)
from hub_ext.core.slots import ResourceSlots

LIVE_STATUSES = (*HOLDING_STATUSES, "PENDING")
_RANK = {kind: i for i, kind in enumerate(LEDGER_SCOPES)}

Scope = tuple[str, int]
Rows = dict[Scope, dict[str, int]]


def scopes_of(s: ComputeSession) -> list[Scope]:
    """The scopes a session charges, in the ledger's lock order."""
    return [
        ("domain", s.domain_id),
        ("project", s.project_id),
        ("user", s.user_id),
        ("keypair", s.keypair_id),
        ("resource_group", s.resource_group_id),
    ]


_UPSERTS: dict[str, Any] = {}


def _upsert(dialect: str) -> Any:
    """``INSERT ... ON CONFLICT DO UPDATE SET amount = amount + excluded.amount RETURNING ...``,
    one statement per dialect, compiled once: executed with many rows, SQLAlchemy sends them as
    one multi-row INSERT ("insertmanyvalues")."""
    stmt = _UPSERTS.get(dialect)
    if stmt is None:
        table = UsageLedger.__table__
        ins = (postgresql if dialect == "postgresql" else sqlite).insert(table)
        stmt = _UPSERTS[dialect] = ins.on_conflict_do_update(
            index_elements=["scope_kind", "scope_id", "slot"],
            set_={"amount": table.c.amount + ins.excluded.amount},
        ).returning(table.c.scope_kind, table.c.scope_id, table.c.slot, table.c.amount)
    return stmt


def charge(db: Session, scopes: Iterable[Scope], delta: Mapping[str, int]) -> Rows:
    """Add ``delta`` (slot -> quanta) to each scope's rows, creating missing rows, in one statement;
    returns the rows touched as they are now (this transaction's change included)."""
    values = [
        {"scope_kind": kind, "scope_id": ident, "slot": slot, "amount": amount}
        for kind, ident in sorted(set(scopes), key=lambda s: (_RANK[s[0]], s[1]))
        for slot, amount in sorted(delta.items())
    ]
    if not values:
        return {}
    conn = db.connection()
    out: Rows = defaultdict(dict)
    for kind, ident, slot, amount in conn.execute(_upsert(conn.dialect.name), values):
        out[(kind, ident)][slot] = int(amount)
    return dict(out)


def read(db: Session, scopes: Iterable[Scope]) -> Rows:
    """Every row of these scopes (no lock: for views, and for decisions that hold the group lock
    of every session of the scope, as the queue does)."""
    wanted = sorted(set(scopes))
    out: Rows = {s: {} for s in wanted}
    if not wanted:
        return out
    rows = db.execute(
        select(UsageLedger.scope_kind, UsageLedger.scope_id, UsageLedger.slot, UsageLedger.amount).where(
            tuple_(UsageLedger.scope_kind, UsageLedger.scope_id).in_(wanted)
        )
    )
    for kind, ident, slot, amount in rows:
        out[(kind, ident)][slot] = int(amount)
    return out


def read_kinds(db: Session, kinds: Iterable[str]) -> Rows:
    """Every row of every scope of these kinds (``domain``, ``project``, ...) in one statement, no
    lock: for fleet-wide views (the metrics), where listing each scope's id would only cost more."""
    out: Rows = defaultdict(dict)
    rows = db.execute(
        select(UsageLedger.scope_kind, UsageLedger.scope_id, UsageLedger.slot, UsageLedger.amount).where(
            UsageLedger.scope_kind.in_(sorted(set(kinds)))
        )
    )
    for kind, ident, slot, amount in rows:
        out[(kind, ident)][slot] = int(amount)
    return dict(out)


def used(row: Mapping[str, int]) -> ResourceSlots:
    """A scope's slots in use, for views (``/api/me``, the spawn form)."""
    return quanta.all_slots(row)


def on_transition(db: Session, s: ComputeSession, old: str | None, new: str) -> None:
    """Keep the ledger in step with a session's status change (``old`` None: newly admitted)."""
    delta = quanta.transition_delta(s.slots, old, new, LIVE_STATUSES)
    if delta:
        charge(db, scopes_of(s), delta)


# ---------------------------------------------------------------- recalculate


def _live_sessions():
    """Each live session's stored slots, status and scope ids (in LEDGER_SCOPES order)."""
    return select(
        ComputeSession.requested_slots,
        ComputeSession.status,
        ComputeSession.domain_id,
        ComputeSession.project_id,
        ComputeSession.user_id,
        ComputeSession.keypair_id,
        ComputeSession.resource_group_id,
    ).where(ComputeSession.status.in_(LIVE_STATUSES))


def expected(db: Session) -> Rows:
    """The ledger recomputed from the live sessions."""
    rows = db.execute(_live_sessions())
    return quanta.recompute(
        ((stored, status, dict(zip(LEDGER_SCOPES, ids, strict=True))) for stored, status, *ids in rows),
        LIVE_STATUSES,
    )


def stored(db: Session) -> Rows:
    out: Rows = defaultdict(dict)
    for kind, ident, slot, amount in db.execute(
        select(UsageLedger.scope_kind, UsageLedger.scope_id, UsageLedger.slot, UsageLedger.amount)
    ):
        out[(kind, ident)][slot] = int(amount)
    return dict(out)


def _lock_table(db: Session) -> None:
    # Waits for every transaction that changed the ledger and keeps new ones out until commit;
    # readers go on.  On SQLite the transaction already holds the database's write lock.
    if db.get_bind().dialect.name == "postgresql":
        db.connection().exec_driver_sql("LOCK TABLE usage_ledger IN EXCLUSIVE MODE")


def drift(db: Session) -> list[dict[str, Any]]:
    """Every (scope, slot) where the stored ledger differs from the sessions (stored, true)."""
    want, have = expected(db), stored(db)
    out = []
    for scope in sorted(set(want) | set(have), key=lambda s: (_RANK.get(s[0], 99), s[1])):
        w, h = want.get(scope, {}), have.get(scope, {})
        for slot in sorted(set(w) | set(h)):
            if w.get(slot, 0) != h.get(slot, 0):
                out.append(
                    {
                        "scope_kind": scope[0],
                        "scope_id": scope[1],
                        "slot": slot,
                        "stored": h.get(slot, 0),
                        "true": w.get(slot, 0),
                    }
                )
    return out


def recalculate(db: Session) -> list[dict[str, Any]]:
    """Rebuild the ledger from the sessions; returns the drift it repaired (empty: none)."""
    _lock_table(db)
    found = drift(db)
    if found:
        db.execute(delete(UsageLedger).execution_options(synchronize_session=False))
        rows = [
            {"scope_kind": kind, "scope_id": ident, "slot": slot, "amount": amount}
            for (kind, ident), row in sorted(expected(db).items())
            for slot, amount in sorted(row.items())
        ]
        if rows:
            db.execute(insert(UsageLedger), rows)
    return found


# ---------------------------------------------------------------- deletions behind the sessions' back


_PARENTS = ((Domain, "domain"), (Project, "project"), (User, "user"), (Keypair, "keypair"))


@event.listens_for(Session, "before_flush")
def _before_flush(session: Session, flush_context: Any, instances: Any) -> None:
    """A deleted user, project, keypair or domain takes its sessions with it (the database's
    cascade): take what its live sessions held out of every scope they charged, and drop the
    deleted scope's own rows."""
    gone: dict[str, set[int]] = defaultdict(set)
    for obj in session.deleted:
        for model, kind in _PARENTS:
            if isinstance(obj, model) and obj.id is not None:
                gone[kind].add(obj.id)
        if isinstance(obj, ComputeSession) and obj.status in LIVE_STATUSES:
            gone["session"].add(obj.id)  # type: ignore[arg-type]
    if not gone:
        return
    columns = {
        "domain": ComputeSession.domain_id,
        "project": ComputeSession.project_id,
        "user": ComputeSession.user_id,
        "keypair": ComputeSession.keypair_id,
        "session": ComputeSession.id,
    }
    with session.no_autoflush:
        live = session.execute(
            _live_sessions().where(or_(*(columns[k].in_(ids) for k, ids in gone.items())))
        ).all()
        for stored_slots, status, *scope_ids in live:
            delta = quanta.session_delta(
                ResourceSlots.parse(stored_slots), live=-1, pending=-int(status == "PENDING")
            )
            charge(session, list(zip(LEDGER_SCOPES, scope_ids, strict=True)), delta)
        for kind, gone_ids in gone.items():
            if kind != "session":
                session.execute(
                    delete(UsageLedger)
                    .where(UsageLedger.scope_kind == kind, UsageLedger.scope_id.in_(gone_ids))
                    .execution_options(synchronize_session=False)
                )
