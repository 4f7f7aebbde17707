"""Why a queued session waits, and whether a request would: the service's side of
:mod:`labfleet.core.capacity`, read from the DB.

Every place that shows a session (the Fleet home, the Lab sidebar, the Hub's progress page, the
widgets) reads the same two fields of a PENDING session's view, written here: ``queue_position``
and ``waiting_for``, a sentence that names what is short now and how long it waits. A request
not yet sent gets :func:`preview`: refused (and why), would wait (and why), or starts now.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from labfleet.compute import nodes, sessions
from labfleet.core.authz import Actor
from labfleet.core.capacity import free_now, judge, waits_until
from labfleet.core.errors import LabfleetError
from labfleet.core.models import Node, ResourceGroup
from labfleet.core.vocab import PENDING


def group_node_views(db: Session, group: ResourceGroup) -> list[dict[str, Any]]:
    """``node_view`` of each node of ``group``, with what it has free now."""
    members = list(
        db.scalars(
            select(Node)
            .where(Node.resource_group_id == group.id)
            .options(selectinload(Node.devices))
            .order_by(Node.name)
        )
    )
    usage = nodes.nodes_usage(db, [n.id for n in members])
    return [nodes.node_view(db, n, usage[n.id]) for n in members]


def free_in(db: Session, groups: Iterable[ResourceGroup]) -> dict[str, dict[str, Any]]:
    """{group name: what one session could get there now} (:class:`labfleet.core.capacity.FreeNow`)."""
    return {g.name: free_now(group_node_views(db, g)).to_json() for g in groups}


def waiting_sentence(slots: dict[str, Any], node_views: list[dict[str, Any]], group: ResourceGroup) -> str:
    """Why a session asking ``slots`` waits in ``group`` now, and for how long it will."""
    verdict = judge(slots, node_views, group.placement)
    if verdict.fits:
        return f"{verdict.note}: the next pass of the queue places it"
    return f"{verdict.note}; {waits_until(group.pending_timeout)}"


def annotate(db: Session, views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``queue_position`` and ``waiting_for`` to the PENDING ones of ``views`` (session views),
    reading each of their groups once; the others get ``None`` for both."""
    for v in views:
        v.setdefault("queue_position", None)
        v["waiting_for"] = None
    pending = [v for v in views if v.get("status") == PENDING]
    by_group: dict[str, list[dict[str, Any]]] = {}
    for v in pending:
        by_group.setdefault(str(v.get("resource_group")), []).append(v)
    for name, rows in by_group.items():
        group = db.scalar(select(ResourceGroup).where(ResourceGroup.name == name))
        if group is None:
            continue
        node_views = group_node_views(db, group)
        positions = sessions.queue_positions(db, group)
        for v in rows:
            v["queue_position"] = positions.get(v["id"])
            v["waiting_for"] = waiting_sentence(dict(v.get("slots") or {}), node_views, group)
    return views


def preview(db: Session, actor: Actor, body: Any) -> dict[str, Any]:
    """What ``POST /api/sessions`` would do with ``body`` now, changing nothing (the caller rolls back).

    A request it would refuse (bad input, access, a quota, a name in use, a size no node could ever
    hold) raises as that request would, with the same status and message; else ``{"outcome":
    "waits"}`` with why and for how long where nothing has room now, or ``"starts"`` where a node has.
    """
    req = sessions.parse_request(body)  # bad input first, whoever asks
    sessions.prepare_launch(db, actor, body)
    group = db.scalar(select(ResourceGroup).where(ResourceGroup.name == req["resource_group"]))
    if group is None:  # admission found it a moment ago
        raise LabfleetError(f"resource group {req['resource_group']!r} is gone", 409)
    node_views = group_node_views(db, group)
    verdict = judge(req["slots"].to_json(), node_views, group.placement)
    ahead = len(sessions.queue_positions(db, group))
    if not verdict.fits:
        return {
            "outcome": "waits",
            "message": f"would wait: {verdict.note}; {waits_until(group.pending_timeout)}",
            "queue_ahead": ahead,
        }
    queue = f"; {ahead} session{'s' if ahead != 1 else ''} already wait in the queue" if ahead else ""
    return {"outcome": "starts", "message": f"starts now: {verdict.note}{queue}", "queue_ahead": ahead}
