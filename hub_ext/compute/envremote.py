"""Save as environment for a session on another node: its node's agent commits the container.

The service's build queue (:mod:`labfleet.compute.envqueue`) commits a session's container on its own
node's Docker engine. A Swarm session on another node has its container on that node's engine, which
only the node's agent (``labfleet agent``) talks to. So:

* The queue hands the commit over (:func:`hand_over`): the environment stays BUILDING, its ``node``
  now the session's node, when that node has an agent; without one the build fails, saying so.
* Each heartbeat of that node's agent is answered with the commits handed to it (:func:`orders_for`):
  the environment, the session, the image's name and, with a fleet registry, where to push it.
* The agent reports on each commit it was handed in every heartbeat (its log so far, and, once done,
  the image or why it failed) until the answer no longer hands that commit over
  (:func:`take_reports`). The reports are untrusted, like anything a node says of a session: their
  shape is checked, the image's name is the service's own, the recorded recipe passes the recipes'
  checks again, and a report counts only for a commit handed to that node.
* A node that becomes LOST fails the commits handed to it (:func:`fail_handed`); a service that
  restarts hands them over again (they are BUILDING: :func:`environments.requeue_interrupted`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from labfleet.compute import environments
from labfleet.compute.environments import BUILDING, FAILED, READY, Built
from labfleet.compute.recipes import pip_packages_recipe
from labfleet.core.display import fmt_bytes
from labfleet.core.envmodels import Environment
from labfleet.core.errors import InvalidInput
from labfleet.core.models import ComputeSession, Node
from labfleet.core.validate import check_bool, check_fields, check_int, check_text
from labfleet.storage.vfolders import UUID_RE

# What one heartbeat may say of the commits (reports, lines of log per report, characters a line, a
# recorded requirements.txt or apt.txt, an error): together well under a request body's 1 MiB.
MAX_REPORTS = 4
MAX_LOG_LINES = 200
MAX_LINE = 500
MAX_TEXT = 32 << 10
MAX_ERROR = 2000
IMAGE_ID_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# The line of the build log after which the agent's lines follow.
HANDED_OVER = "labfleet: handed over to the agent of node"


@dataclass(frozen=True)
class CommitReport:
    """What an agent says of one commit it was handed."""

    environment: str
    log: tuple[str, ...]
    done: bool
    image_id: str | None = None
    size: int = 0  # bytes: the image's own layers (its base's not counted)
    recorded: dict[str, str] | None = None
    error: str = ""


@dataclass(frozen=True)
class Taken:
    """A report taken: the log lines to write (all of the agent's so far) and, once the commit is done,
    the log's last line (READY or FAILED, and why)."""

    environment: str
    log: tuple[str, ...]
    last: str | None = None


def session_node(db: Session, session_id: str) -> Node | None:
    s = db.get(ComputeSession, session_id)
    return db.get(Node, s.node_id) if s is not None and s.node_id is not None else None


def hand_over(db: Session, env_id: str, service_node: str) -> str | None:
    """The BUILDING environment ``env_id`` is to be committed by the agent of its session's node: that
    node's name, or None when no agent can (the session has no node, or it is this service's own)."""
    env = db.get(Environment, env_id)
    if env is None or env.status != BUILDING or env.source_session is None:
        return None
    node = session_node(db, env.source_session)
    if node is None or node.agent_token_id is None or node.name == service_node:
        return None
    env.node = node.name
    return node.name


def handed_to(db: Session, node: str) -> list[Environment]:
    q = select(Environment).where(
        Environment.status == BUILDING, Environment.source_session.is_not(None), Environment.node == node
    )
    return list(db.scalars(q.order_by(Environment.started_at, Environment.id)))


def target_image(env: Environment, registry: str | None) -> str:
    """The image's name: in the fleet's registry when there is one (every node pulls it from there)."""
    tag = environments.image_tag(env.recipe_hash)
    return f"{registry}/{tag}" if registry else tag


def orders_for(db: Session, node: str, registry: str | None) -> list[dict[str, Any]]:
    """The commits handed to ``node``'s agent, as its heartbeat's answer carries them."""
    return [
        {
            "environment": env.id,
            "session": env.source_session,
            "base": env.base,
            "tag": environments.image_tag(env.recipe_hash),
            "push": target_image(env, registry) if registry else None,
        }
        for env in handed_to(db, node)
    ]


def parse_commit_reports(raw: Any) -> list[CommitReport]:
    """A heartbeat's ``commit_reports`` (untrusted): checked whole, or InvalidInput."""
    if not isinstance(raw, list) or len(raw) > MAX_REPORTS:
        raise InvalidInput(f"commit_reports must be a list of at most {MAX_REPORTS} objects")
    out = []
    for i, item in enumerate(raw):
        what = f"commit_reports[{i}]"
        item = check_fields(
            item,
            required=["environment", "done"],
            optional=["log", "image_id", "size", "requirements", "apt", "error"],
            what=what,
        )
        env_id = item["environment"]
        if not isinstance(env_id, str) or not UUID_RE.match(env_id):
            raise InvalidInput(f"{what}.environment must be an environment id")
        log = item.get("log", [])
        if not isinstance(log, list) or len(log) > MAX_LOG_LINES:
            raise InvalidInput(f"{what}.log must be a list of at most {MAX_LOG_LINES} lines")
        lines = tuple(check_text(line, f"{what}.log[]", MAX_LINE).replace("\n", " ") for line in log)
        done = check_bool(item["done"], f"{what}.done")
        image_id = item.get("image_id")
        if image_id is not None and (not isinstance(image_id, str) or not IMAGE_ID_RE.match(image_id)):
            raise InvalidInput(f"{what}.image_id must be sha256:<64 hex digits>")
        size = check_int(item.get("size", 0), f"{what}.size", maximum=1 << 50)
        error = check_text(item.get("error", ""), f"{what}.error", MAX_ERROR)
        recorded = None
        if done and not error:
            if image_id is None:
                raise InvalidInput(f"{what}: a commit done without an error names its image_id")
            # What the session said it had installed: through the recipes' checks again.
            recorded = pip_packages_recipe(
                check_text(item.get("requirements", ""), f"{what}.requirements", MAX_TEXT),
                check_text(item.get("apt", ""), f"{what}.apt", MAX_TEXT),
            )
        out.append(CommitReport(env_id, lines, done, image_id, size, recorded, error))
    return out


def take_reports(
    db: Session, node: str, reports: Iterable[CommitReport], registry: str | None
) -> list[Taken]:
    """The reports of ``node``'s agent on commits handed to it (others are ignored): a commit done
    makes its environment READY with the service's name of the image (or FAILED, with the agent's
    reason); one still running only adds its log."""
    handed = {env.id: env for env in handed_to(db, node)}
    out = []
    for r in reports:
        env = handed.get(r.environment)
        if env is None:
            continue
        if r.done and r.error:
            environments.fail_build(db, env.id, f"the commit on node {node} failed: {r.error}")
        elif r.done and r.image_id is not None:
            image = target_image(env, registry)
            built = Built(image, r.image_id, r.size, reused=False, recorded=r.recorded or {})
            environments.finish_build(db, env.id, built)
        if env.status == READY:
            out.append(
                Taken(env.id, r.log, f"labfleet: READY: image {env.image} ({fmt_bytes(env.size_bytes)})")
            )
        elif env.status == FAILED:
            out.append(Taken(env.id, r.log, f"labfleet: FAILED: {env.status_reason}"))
        else:
            out.append(Taken(env.id, r.log))
    return out


def fail_handed(db: Session, node: str, reason: str) -> list[str]:
    """The commits handed to ``node`` fail (it is LOST): their ids."""
    found = handed_to(db, node)
    for env in found:
        environments.fail_build(db, env.id, f"{reason}: the commit handed to its agent is lost")
    return [env.id for env in found]
