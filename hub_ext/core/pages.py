"""One page of a list: count what the caller may see, fetch a slice of it in a stable order.

The list endpoints (``GET /api/sessions``, ``/users``, ``/audit``, ``/vfolders``, ``/nodes``) answer
pages like the Hub's REST API does (``offset`` and ``limit``; service/base.py answers them).  The
logic modules build a ``Select`` whose WHERE already says who may see what and whose ORDER BY is
total (it ends with a unique column), and hand it to :func:`page_of`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

T = TypeVar("T")
U = TypeVar("U")

DEFAULT_LIMIT = 200
MAX_LIMIT = 1000


def contains_text(column: Any, needle: str) -> Any:
    """A condition: ``needle`` occurs in ``column``, case-insensitive, taken literally (``%`` and
    ``_`` are plain characters here, not LIKE's wildcards): the search box of a list."""
    escaped = needle.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return func.lower(column).like(f"%{escaped}%", escape="\\")


@dataclass(frozen=True)
class Page(Generic[T]):
    """``items``: at most ``limit`` rows from ``offset`` on; ``total``: every row the query matches."""

    items: list[T]
    total: int
    offset: int
    limit: int

    @property
    def next_offset(self) -> int | None:
        """Where the next page starts, or None when this one is the last."""
        nxt = self.offset + self.limit
        return nxt if nxt < self.total else None

    def map(self, fn: Callable[[T], U]) -> Page[U]:
        return Page([fn(x) for x in self.items], self.total, self.offset, self.limit)


def count_of(db: Session, q: Select) -> int:
    """How many rows ``q`` selects (its ORDER BY dropped; loader options play no part)."""
    return int(db.scalar(select(func.count()).select_from(q.order_by(None).subquery())) or 0)


def page_of(db: Session, q: Select, offset: int, limit: int, *, options: Sequence[Any] = ()) -> Page[Any]:
    """The page ``offset``..``offset + limit`` of the ORM entities ``q`` selects.

    ``q`` must order its rows totally (a unique column last), or pages may repeat or skip rows.
    ``options`` (eager loads: selectinload, joinedload) apply to the page's query only, not to
    the count.  The count is skipped when the page itself shows the total: a page that is not
    full, and not empty, ends the list."""
    items = list(db.scalars(q.options(*options).offset(offset).limit(limit)).unique())
    if 0 < len(items) < limit or (offset == 0 and len(items) < limit):
        total = offset + len(items)
    else:
        total = count_of(db, q)
    return Page(items, total, offset, limit)
