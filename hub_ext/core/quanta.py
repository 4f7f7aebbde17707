"""Slot amounts as the usage ledger keeps them: integers in each slot's quantum (pure).

A session charges its scopes (domain, project, user, keypair, resource group) its charged slots
(:func:`labfleet.core.slots.charged`: whole devices count as shares too).  The ledger stores, per
scope and slot, the sum over the scope's live sessions as an integer number of the slot's quantum
(milli-cores, bytes, devices, hundredths of a device), so adding and taking away is exact on every
database and can be done in SQL (``amount = amount + :delta``).

Besides the slots themselves a scope has:

- ``<base>:*`` for each base slot with per-model slots (``gpu:*`` = every ``gpu:<model>``): a cap
  that names the base counts every model (:func:`labfleet.compute.scheduler.admission.quota_view`),
  and admission reads only the rows of the slots it asks for;
- ``@sessions``: live sessions (admitted and not ended, queued ones included);
- ``@pending``: queued (PENDING) ones.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from labfleet.core.slots import ResourceSlots, base_slot, charged, quantum_of

SESSIONS = "@sessions"
PENDING = "@pending"
COUNTS = (SESSIONS, PENDING)
ALL_MODELS = ":*"  # suffix of the per-base sum of per-model slots
# A made-up model name that stands for "every model the request did not name" (see used_slots).
OTHER_MODELS = "_other_models"

Delta = dict[str, int]


def to_quanta(name: str, amount: Decimal) -> int:
    return int(amount / quantum_of(name))


def from_quanta(name: str, quanta: int) -> Decimal:
    """Back to an amount; a negative count (a drifted ledger, until recalculated) reads as 0."""
    return (quantum_of(name) * quanta).normalize() if quanta > 0 else Decimal(0)


def slot_quanta(slots: ResourceSlots) -> Delta:
    """A session's charged slots as ledger rows (``gpu:*`` sums included), in quanta."""
    out: dict[str, int] = defaultdict(int)
    for name, amount in charged(slots).items():
        q = to_quanta(name, amount)
        if not q:
            continue
        out[name] += q
        base = base_slot(name)
        if base != name:
            out[base + ALL_MODELS] += q
    return dict(out)


def request_keys(slots: ResourceSlots) -> list[str]:
    """The ledger rows admission reads for a request: its slots, each base's ``:*`` sum, the counts."""
    keys = set(COUNTS)
    for name in charged(slots):
        base = base_slot(name)
        keys.add(name)
        keys.add(base)
        keys.add(base + ALL_MODELS)
    return sorted(keys)


def session_delta(slots: ResourceSlots, *, live: int, pending: int, keys: Iterable[str] = ()) -> Delta:
    """The change to each scope of a session: ``live`` (+1 admitted, -1 ended) times its slots and
    ``@sessions``, ``pending`` (+1 queued, -1 left the queue) on ``@pending``.  ``keys``: rows
    to touch with 0 as well (admission reads them back)."""
    out: Delta = dict.fromkeys(keys, 0)
    if live:
        for name, q in slot_quanta(slots).items():
            out[name] = out.get(name, 0) + live * q
        out[SESSIONS] = out.get(SESSIONS, 0) + live
    if pending:
        out[PENDING] = out.get(PENDING, 0) + pending
    return out


def transition_delta(
    slots: ResourceSlots, old: str | None, new: str, live_statuses: Iterable[str]
) -> Delta | None:
    """The ledger change of a session going from status ``old`` (None: not admitted) to ``new``;
    None when nothing changes."""
    live = set(live_statuses)
    d_live = (new in live) - (old in live)
    d_pending = (new == "PENDING") - (old == "PENDING")
    if not d_live and not d_pending:
        return None
    return session_delta(slots, live=d_live, pending=d_pending)


def used_slots(row: Mapping[str, int], request: ResourceSlots) -> ResourceSlots:
    """What a scope's live sessions hold, from its ledger ``row`` (slot -> quanta), as admission's
    ``*_used`` needs it for ``request``: every base slot, and each model the request names.

    Per-model amounts of models the request does not name are folded into one made-up model
    (``gpu:_other_models``), which counts towards the base's cap just as the real ones would.
    """
    out: dict[str, Decimal] = {}
    named_models: dict[str, int] = defaultdict(int)
    for name in charged(request):
        base = base_slot(name)
        if name != base:
            named_models[base] += row.get(name, 0)
            if row.get(name):
                out[name] = from_quanta(name, row[name])
    for key, quanta in row.items():
        if key.startswith("@") or not quanta:
            continue
        if key.endswith(ALL_MODELS):
            base = key[: -len(ALL_MODELS)]
            rest = quanta - named_models.get(base, 0)
            if rest:
                out[f"{base}:{OTHER_MODELS}"] = from_quanta(base, rest)
        elif base_slot(key) == key:
            out[key] = from_quanta(key, quanta)
    return ResourceSlots(out)


def all_slots(row: Mapping[str, int]) -> ResourceSlots:
    """Every slot a scope's live sessions hold (per-model ones as they are), for views."""
    return ResourceSlots(
        {
            k: from_quanta(k, q)
            for k, q in row.items()
            if q and not k.startswith("@") and not k.endswith(ALL_MODELS)
        }
    )


def recompute(
    sessions: Iterable[tuple[Mapping[str, Any], str, Mapping[str, int]]], live_statuses: Iterable[str]
) -> dict[tuple[str, int], Delta]:
    """The ledger as it should be: ``sessions`` yields (stored slots, status, {scope kind: id})."""
    live = set(live_statuses)
    out: dict[tuple[str, int], Delta] = defaultdict(lambda: defaultdict(int))
    for stored, status, scopes in sessions:
        if status not in live:
            continue
        delta = session_delta(ResourceSlots.parse(stored), live=1, pending=int(status == "PENDING"))
        for kind, ident in scopes.items():
            row = out[(kind, ident)]
            for k, v in delta.items():
                row[k] += v
    return {scope: {k: v for k, v in row.items() if v} for scope, row in out.items()}
