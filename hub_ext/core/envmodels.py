"""The data model of "My Environments": a user's or a project's own image, built from a recipe.

Apart from :mod:`labfleet.core.models` (which stays under the house's 1,000 lines) and imported at
its bottom, so its table is in ``Base.metadata`` whichever of the two is imported first. The
logic is :mod:`labfleet.compute.environments`; the statuses are
:data:`labfleet.core.vocab.ENVIRONMENT_STATUSES`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from labfleet.core.models import Base, Domain, Project, User, UTCDateTime, utcnow
from labfleet.core.vocab import ENVIRONMENT_STATUSES


class Environment(Base):
    """A base image (a registered one) plus a recipe's files (``recipe``: file name -> text, as
    :func:`labfleet.compute.recipes.parse_recipe` checked them), owned by a user or by a project.

    ``image`` is the tag its build made (None until it is READY); environments with the same
    ``recipe_hash`` (the same base and files) share one image. ``node``: where it was built.
    Names are unique per owner: the project when there is one, else the user.
    """

    __tablename__ = "environments"
    __table_args__ = (
        UniqueConstraint("user_id", "name", name="uq_environments_user_name"),
        UniqueConstraint("project_id", "name", name="uq_environments_project_name"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)  # a UUID
    name: Mapped[str] = mapped_column(String(64))
    owner_kind: Mapped[str] = mapped_column(String(16))  # user | project
    # Exactly one of these is set, by owner_kind.
    user_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), nullable=True, index=True
    )
    project_id: Mapped[int | None] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), nullable=True, index=True
    )
    domain_id: Mapped[int] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"), index=True)
    creator: Mapped[str] = mapped_column(String(255))  # the user name of who created it
    base: Mapped[str] = mapped_column(String(255))  # the registered image it builds on
    recipe: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    recipe_hash: Mapped[str] = mapped_column(String(64), index=True)
    image: Mapped[str | None] = mapped_column(String(255), nullable=True)
    image_id: Mapped[str | None] = mapped_column(String(80), nullable=True)  # sha256:...
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    status: Mapped[str] = mapped_column(String(16), default=ENVIRONMENT_STATUSES[0])
    status_reason: Mapped[str] = mapped_column(Text, default="")
    node: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # Save as environment: the session whose container it is made of (None: built from its recipe,
    # which is then what was installed in the session, as recorded).
    source_session: Mapped[str | None] = mapped_column(String(36), nullable=True)
    # What its running build holds in the usage ledger (labfleet.compute.buildcharge), until it
    # stops: {"slots": {"cpu": "2", "mem": "4294967296"}, "scopes": [["domain", 1], ...]}; None is
    # SQL NULL (none_as_null), which the ledger's queries of the builds that hold slots look for.
    build_charge: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    user: Mapped[User | None] = relationship()
    project: Mapped[Project | None] = relationship()
    domain: Mapped[Domain] = relationship()
