"""The announcement: one banner for everyone, on the Hub's pages and in the Fleet sidebar.

Anyone who is logged in (and the Hub itself) reads the announcement in force; only a superadmin
(or the CLI) publishes or clears it, and both are audited. Each publication is a row of
``announcements``; the one in force is the newest not cleared, and publishing clears the one
before, so the table keeps the history (who said what, when, and who took it down).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from labfleet.core import audit
from labfleet.core.authz import Actor
from labfleet.core.errors import Forbidden, InvalidInput
from labfleet.core.models import ANNOUNCEMENT_LEVELS, Announcement, utcnow
from labfleet.core.validate import check_choice, check_fields, check_text

MAX_TEXT = 2000
DEFAULT_LEVEL = "info"
TARGET = "announcement"  # the audit entries' target


def can_read(actor: Actor) -> bool:
    """Everyone the service knows: people of every role, the Hub, the CLI (not a metrics scraper)."""
    return actor.kind in ("user", "hub", "cli")


def can_announce(actor: Actor) -> bool:
    """Publish or clear: a superadmin or the CLI; not the Hub's own token, not monitors."""
    return actor.is_superadmin and actor.kind in ("user", "cli")


def check_body(body: Any) -> tuple[str, str]:
    """``{"text": ..., "level": "info" | "warning"}`` -> (text, level); InvalidInput (400) for anything else.

    The text is kept as written (line breaks included) but may not be blank: clearing is DELETE."""
    body = check_fields(body, required=["text"], optional=["level"])
    text = check_text(body["text"], "text", MAX_TEXT)
    if not text.strip():
        raise InvalidInput("text must not be blank; to take the announcement down, DELETE it")
    level = check_choice(body.get("level", DEFAULT_LEVEL), "level", ANNOUNCEMENT_LEVELS)
    return text, level


def in_force(db: Session) -> Announcement | None:
    """The announcement shown now (the newest not cleared), or None."""
    return db.scalar(
        select(Announcement)
        .where(Announcement.cleared_at.is_(None))
        .order_by(Announcement.id.desc())
        .limit(1)
    )


def view(a: Announcement | None, actor: Actor) -> dict[str, Any] | None:
    """The announcement as the API answers it; who published it only for admins and monitors."""
    if a is None:
        return None
    out: dict[str, Any] = {
        "id": a.id,
        "text": a.text,
        "level": a.level,
        "published_at": a.published_at.isoformat() if a.published_at else None,
    }
    if actor.role != "user":
        out["published_by"] = a.published_by
    return out


def current(db: Session, actor: Actor) -> dict[str, Any]:
    """``{"announcement": {...} | null}`` for GET /api/announcement."""
    if not can_read(actor):
        raise Forbidden("only people with a labfleet account and the Hub read the announcement")
    return {"announcement": view(in_force(db), actor)}


def _clear_all(db: Session, actor: Actor) -> None:
    db.execute(
        update(Announcement)
        .where(Announcement.cleared_at.is_(None))
        .values(cleared_at=utcnow(), cleared_by=actor.name)
    )


def publish(db: Session, actor: Actor, body: Any) -> dict[str, Any]:
    """Replace the announcement in force with ``body``'s (superadmin only; audited)."""
    if not can_announce(actor):
        raise Forbidden("only a superadmin may publish an announcement")
    text, level = check_body(body)
    before = in_force(db)
    _clear_all(db, actor)
    a = Announcement(text=text, level=level, published_by=actor.name, published_at=utcnow())
    db.add(a)
    db.flush()
    audit.record(
        db,
        actor,
        "announcement.publish",
        TARGET,
        details={"id": a.id, "level": level, "text": text, "replaced": before.id if before else None},
    )
    return {"announcement": view(a, actor)}


def clear(db: Session, actor: Actor) -> dict[str, Any]:
    """Take the announcement down (superadmin only; audited). Clearing when there is none is fine:
    ``cleared`` says whether there was one."""
    if not can_announce(actor):
        raise Forbidden("only a superadmin may clear the announcement")
    before = in_force(db)
    _clear_all(db, actor)
    audit.record(
        db,
        actor,
        "announcement.clear",
        TARGET,
        details={"id": before.id if before else None, "text": before.text if before else None},
    )
    return {"announcement": None, "cleared": before is not None}
