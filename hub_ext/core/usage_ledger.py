"""The usage ledger (its rows in the DB): what each scope's live sessions hold, kept as the sessions change.

One row per (scope, slot) in ``usage_ledger`` (see :class:`labfleet.core.models.UsageLedger` and
:mod:`labfleet.core.quanta`), for the scopes a quota names: the session's domain, project, user,
keypair and resource group.  Every change is an increment in SQL (``amount = amount + delta``),
written in the transaction that admits, places or ends the session, so concurrent changes never
lose one another; admission reads the rows it needs back from the same statement
(``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``), which on PostgreSQL also locks them until
commit: two admissions that share a scope are serialised on its rows, and rows are always taken
in one order (:data:`~labfleet.core.models.LEDGER_SCOPES`, then id), so they never deadlock.

A running environment build holds its CPU and memory here too (:mod:`labfleet.compute.buildcharge`),
on its creator's scopes, recorded on the environment (``build_charge``) so that exactly that is
given back (:func:`release_build`) and :func:`expected` counts it.

``recalculate`` rebuilds the ledger from the sessions and the builds (Backend.AI's "recalculate
usage"), with every writer kept out: the whole table is locked on PostgreSQL, the database on SQLite.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from itertools import chain
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Dialect,
    Integer,
    String,
    Table,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    tuple_,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from labfleet.core import quanta
from labfleet.core.database import Prepared
from labfleet.core.envmodels import Environment
from labfleet.core.models import LEDGER_SCOPES, ComputeSession, Domain, Keypair, Project, UsageLedger, User
from labfleet.core.slots import ResourceSlots
from labfleet.core.vocab import LIVE_STATUSES

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


_UPSERTS: dict[tuple[str, bool], Any] = {}
_UPSERTS_N: dict[tuple[str, int, bool], tuple[str, bool]] = {}
_UNNESTS: dict[bool, Prepared] = {}
# SQLite: up to this many rows a charge runs one statement compiled for exactly that many rows
# (an admission touches 10 to 30); beyond it, one statement executed with many parameter sets.
_PREBUILT_ROWS = 64
_COLUMNS = ("scope_kind", "scope_id", "slot", "amount")
_TABLE = cast(Table, UsageLedger.__table__)


def _on_conflict(ins: Any, *, returning: bool) -> Any:
    """``ins ON CONFLICT DO UPDATE SET amount = amount + excluded.amount`` (with
    ``RETURNING scope_kind, scope_id, slot, amount``)."""
    table = _TABLE
    stmt = ins.on_conflict_do_update(
        index_elements=["scope_kind", "scope_id", "slot"],
        set_={"amount": table.c.amount + ins.excluded.amount},
    )
    return stmt.returning(*(table.c[c] for c in _COLUMNS)) if returning else stmt


def _upsert(dialect: str, returning: bool) -> Any:
    """The upsert for many parameter sets, one statement per dialect: SQLAlchemy sends them as
    one multi-row INSERT ("insertmanyvalues")."""
    stmt = _UPSERTS.get((dialect, returning))
    if stmt is None:
        ins = (postgresql if dialect == "postgresql" else sqlite).insert(_TABLE)
        stmt = _UPSERTS[(dialect, returning)] = _on_conflict(ins, returning=returning)
    return stmt


def unnest_statement(*, returning: bool) -> Any:
    """PostgreSQL's upsert of any number of rows as one statement text: ``INSERT ... SELECT FROM
    unnest(:kinds, :ids, :slots, :amounts) ON CONFLICT ...``, the rows as four arrays
    (:func:`array_params`).  One text whatever the count, so the driver prepares it once and the
    server plans it once; rows are taken in the arrays' order, the ledger's lock order."""
    rows = (
        func.unnest(
            bindparam("kinds", type_=postgresql.ARRAY(String())),
            bindparam("ids", type_=postgresql.ARRAY(Integer())),
            bindparam("slots", type_=postgresql.ARRAY(String())),
            bindparam("amounts", type_=postgresql.ARRAY(BigInteger())),
        )
        .table_valued(*_COLUMNS)
        .render_derived(name="charge")
    )
    ins = postgresql.insert(_TABLE).from_select(list(_COLUMNS), select(*rows.c))
    return _on_conflict(ins, returning=returning)


def array_params(values: list[tuple[str, int, str, int]]) -> dict[str, list[Any]]:
    """:func:`charge_values` as the parameters of :func:`unnest_statement`."""
    return {name: [v[i] for v in values] for i, name in enumerate(("kinds", "ids", "slots", "amounts"))}


def charge_values(
    scopes: Iterable[Scope], delta: Mapping[str, int], reads: Mapping[Scope, Iterable[str]] | None = None
) -> list[tuple[str, int, str, int]]:
    """The rows :func:`charge` writes: (scope kind, scope id, slot, amount to add), in lock order."""
    values: list[tuple[str, int, str, int]] = []
    for scope in sorted(set(scopes), key=lambda s: (_RANK[s[0]], s[1])):
        extra = reads.get(scope) if reads else None
        keys = sorted(delta.keys() | set(extra)) if extra else sorted(delta)
        values.extend((scope[0], scope[1], slot, delta.get(slot, 0)) for slot in keys)
    return values


def rows_of(result: Iterable[Any]) -> Rows:
    """The rows a ``RETURNING scope_kind, scope_id, slot, amount`` gave back."""
    out: Rows = defaultdict(dict)
    for kind, ident, slot, amount in result:
        out[(kind, ident)][slot] = int(amount)
    return dict(out)


def _upsert_rows(dialect: Dialect, n: int, returning: bool) -> tuple[str, bool]:
    """SQLite's upsert of ``n`` rows of bound parameters (``k0, i0, s0, a0, k1, ...``), compiled
    once per n: its SQL, and whether its parameters are positional (in that order).

    SQLAlchemy does not cache the compilation of a multi-row VALUES, and building the
    insertmanyvalues batch on every call cost more than running it; this is executed as driver
    SQL (``exec_driver_sql``: the engine's events still see it)."""
    key = (dialect.name, n, returning)
    got = _UPSERTS_N.get(key)
    if got is None:
        values = [
            {
                "scope_kind": bindparam(f"k{i}", type_=String()),
                "scope_id": bindparam(f"i{i}", type_=Integer()),
                "slot": bindparam(f"s{i}", type_=String()),
                "amount": bindparam(f"a{i}", type_=BigInteger()),
            }
            for i in range(n)
        ]
        ins = sqlite.insert(_TABLE).values(values)
        compiled = _on_conflict(ins, returning=returning).compile(dialect=dialect)
        positional = bool(compiled.positional)
        if positional and tuple(compiled.positiontup or ()) != tuple(
            f"{c}{i}" for i in range(n) for c in "kisa"
        ):
            raise RuntimeError(f"unexpected parameter order in {compiled.string[:200]}")
        got = _UPSERTS_N[key] = (compiled.string, positional)
    return got


def charge(
    db: Session,
    scopes: Iterable[Scope],
    delta: Mapping[str, int],
    *,
    reads: Mapping[Scope, Iterable[str]] | None = None,
) -> Rows:
    """Add ``delta`` (slot -> quanta) to each scope's rows, creating missing rows, in one statement.

    ``reads``: rows to read back, per scope, besides those ``delta`` changes (they are touched
    with nothing added, and on PostgreSQL locked like the changed ones): given, the statement
    returns every row it touched as it is now (this transaction's change included); not given,
    nothing is read back (no ``RETURNING``: the common case of an admission with no cap to check,
    and every release).  Rows are taken in the ledger's lock order (scope, then slot), so two
    charges never deadlock."""
    values = charge_values(scopes, delta, reads)
    if not values:
        return {}
    returning = reads is not None
    conn = db.connection()
    if conn.dialect.name == "postgresql":
        stmt = _UNNESTS.get(returning)
        if stmt is None:
            stmt = _UNNESTS[returning] = Prepared(unnest_statement(returning=returning))
        result = stmt.execute(conn, array_params(values))
    elif len(values) <= _PREBUILT_ROWS:
        sql, positional = _upsert_rows(conn.dialect, len(values), returning)
        if not positional:
            raise RuntimeError(
                f"{conn.dialect.name}: the ledger's prebuilt upsert expects positional parameters"
            )
        result = conn.exec_driver_sql(sql, tuple(chain.from_iterable(values)))
    else:
        result = conn.execute(
            _upsert(conn.dialect.name, returning),
            [dict(zip(_COLUMNS, v, strict=True)) for v in values],
        )
    return rows_of(result) if returning else {}


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


# ---------------------------------------------------------------- environment builds


def _build_held(held: Mapping[str, Any]) -> tuple[list[Scope], dict[str, int]]:
    """The scopes and the quanta of an environment's ``build_charge``."""
    scopes = [(str(kind), int(ident)) for kind, ident in held["scopes"]]
    return scopes, quanta.slot_quanta(ResourceSlots.parse(held["slots"]))


def hold_build(db: Session, env: Environment, scopes: list[Scope], slots: ResourceSlots) -> None:
    """Charge ``slots`` (no session counts: a build is no session) to ``scopes`` while
    ``env``'s build runs, and record it on ``env`` for :func:`release_build`."""
    charge(db, scopes, quanta.slot_quanta(slots))
    env.build_charge = {"slots": slots.to_db(), "scopes": [list(s) for s in scopes]}


def release_build(db: Session, env: Environment) -> None:
    """Give back exactly what ``env``'s build holds, if anything: its build stopped holding."""
    if env.build_charge:
        scopes, delta = _build_held(env.build_charge)
        charge(db, scopes, {slot: -q for slot, q in delta.items()})
        env.build_charge = None


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
    """The ledger recomputed from the live sessions and the builds that hold slots."""
    rows = db.execute(_live_sessions())
    out = quanta.recompute(
        ((stored, status, dict(zip(LEDGER_SCOPES, ids, strict=True))) for stored, status, *ids in rows),
        LIVE_STATUSES,
    )
    for held in db.scalars(select(Environment.build_charge).where(Environment.build_charge.is_not(None))):
        scopes, delta = _build_held(held)
        for scope in scopes:
            row = out.setdefault(scope, {})
            for slot, q in delta.items():
                row[slot] = row.get(slot, 0) + q
    return out


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
    """Every (scope, slot) where the stored ledger differs from the sessions and builds (stored, true)."""
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
    """Rebuild the ledger from the sessions and builds; returns the drift it repaired (empty: none)."""
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


def release_deleted_scopes(session: Session, flush_context: Any, instances: Any) -> None:
    """before_flush (registered in labfleet.core.unitofwork): a deleted user, project, keypair or domain takes its sessions with it (the database's
    cascade): take what its live sessions held out of every scope they charged, release every
    build that holds slots in a deleted scope (the build goes on, holding nothing), and drop the
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
        if gone.keys() - {"session"}:
            for env in session.scalars(select(Environment).where(Environment.build_charge.is_not(None))):
                if any(int(ident) in gone.get(kind, ()) for kind, ident in env.build_charge["scopes"]):  # type: ignore[index]
                    release_build(session, env)
        for kind, gone_ids in gone.items():
            if kind != "session":
                session.execute(
                    delete(UsageLedger)
                    .where(UsageLedger.scope_kind == kind, UsageLedger.scope_id.in_(gone_ids))
                    .execution_options(synchronize_session=False)
                )
