"""My Environments: a user's or a project's own images, each a registered base image plus a recipe
(:mod:`labfleet.compute.recipes`), built by the service's build queue (:mod:`labfleet.compute.envqueue`).

Creating one checks everything in the request, and a refusal (4xx) creates nothing: the name (unique
per owner), the project (one of the caller's; none: a personal environment), the base (a registered
image the caller may use in that project, or in one of their projects for a personal one, as the spawn
form decides), the recipe (:func:`recipes.parse_recipe`), and the owner's limits
(``max_environments``, ``max_environment_bytes`` of the user's policy, or of the project's for a
project environment). A recipe some environment was already built from (the same base and files:
the same :func:`recipes.recipe_hash`) is READY at once with that image; any other waits, QUEUED,
for the queue to build it.

Who sees what: a personal environment is its owner's; a project environment its project's members';
a domain admin sees and deletes their domain's; a superadmin everything; a monitor reads everything.
A project environment is deleted by its creator (while a member) or an admin. The rest is hidden:
*not found*.

The build's bookkeeping (QUEUED -> BUILDING -> READY | FAILED) is here too, for the queue to call
from its thread; each build ends with an ``environment.build`` audit entry. Whatever ends a build
(READY, FAILED, deleted, interrupted by a restart) gives back the CPU and memory it held in its
creator's quota (:mod:`labfleet.compute.buildcharge`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from labfleet.compute import images
from labfleet.compute.recipes import (
    MAX_RECIPE_BYTES,
    RECIPE_FILES,
    Recipe,
    check_base_image,
    parse_recipe,
    recipe_hash,
)
from labfleet.core import audit, usage_ledger
from labfleet.core.authz import Actor
from labfleet.core.display import fmt_bytes
from labfleet.core.envmodels import Environment
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from labfleet.core.models import ComputeSession, Domain, Image, Project, ProjectMember, User
from labfleet.core.sessionlogs import log_file
from labfleet.core.validate import check_fields, check_name, parse_project_ref
from labfleet.core.vocab import (
    BUILD_PENDING_STATUSES,
    ENVIRONMENT_IMAGE_PREFIX,
    ENVIRONMENT_STATUSES,
    RUNNING,
)
from labfleet.storage.files import read_texts
from labfleet.storage.store import check_relpath
from labfleet.storage.vfolders import UUID_RE
from labfleet.tenancy.directory import actor_for

QUEUED, BUILDING, READY, FAILED = ENVIRONMENT_STATUSES
FIELDS = ("name", "base", "project", "files", "folder", "path", "session")
# An owner with no policy may have this many (a new policy's own default is the same).
DEFAULT_MAX_ENVIRONMENTS = 3
# Built images are tagged <repository>:<recipe hash>: environments with the same recipe share one.
IMAGE_REPOSITORY = "labfleet/env"
# A registered image labelled so has conda or mamba: only there may a recipe have environment.yml.
CONDA_LABEL = images.LABEL_PREFIX + "conda"
# Build logs: one file per environment id, in this folder of the sessions' log folder.
BUILD_LOG_FOLDER = "environments"


def image_tag(hash_: str) -> str:
    """The tag of the image built from the recipe whose :func:`recipes.recipe_hash` this is."""
    return f"{IMAGE_REPOSITORY}:{hash_}"


def build_log_file(session_log_dir: str | Path, env_id: str) -> Path:
    """Where environment ``env_id``'s build log is kept (beside the sessions' logs, as they are)."""
    return log_file(Path(session_log_dir) / BUILD_LOG_FOLDER, env_id)


# ---------------------------------------------------------------- who (pure)


@dataclass(frozen=True)
class Facts:
    """What access to an environment depends on, read from the DB once."""

    owner_kind: str  # user | project
    owner: str  # the owner's user name, or DOMAIN/PROJECT
    domain: str
    members: frozenset[str]  # a project environment's project members
    creator: str


def may_see(actor: Actor, f: Facts) -> bool:
    if actor.reads_everything or actor.is_domain_admin_of(f.domain):
        return True
    if actor.kind != "user":
        return False
    return actor.name == f.owner if f.owner_kind == "user" else actor.name in f.members


def may_delete(actor: Actor, f: Facts) -> bool:
    if actor.role == "monitor":
        return False
    if actor.is_superadmin or actor.is_domain_admin_of(f.domain):
        return True
    if actor.kind != "user":
        return False
    if f.owner_kind == "user":
        return actor.name == f.owner
    return actor.name == f.creator and actor.name in f.members


def owner_label(env: Environment) -> str:
    if env.owner_kind == "user":
        return f"user:{env.user.username}"  # type: ignore[union-attr]
    return f"project:{env.project.full_name}"  # type: ignore[union-attr]


def facts_of(env: Environment) -> Facts:
    if env.owner_kind == "user":
        return Facts("user", env.user.username, env.domain.name, frozenset(), env.creator)  # type: ignore[union-attr]
    members = frozenset(u.username for u in env.project.members)  # type: ignore[union-attr]
    return Facts("project", env.project.full_name, env.domain.name, members, env.creator)  # type: ignore[union-attr]


# ---------------------------------------------------------------- reading


def _visible_to(actor: Actor) -> Any:
    """The SQL condition of :func:`may_see` (None: every environment)."""
    if actor.reads_everything:
        return None
    mine: list[Any] = []
    if actor.kind == "user" and actor.user_id is not None:
        projects = select(ProjectMember.project_id).where(ProjectMember.user_id == actor.user_id)
        mine = [Environment.user_id == actor.user_id, Environment.project_id.in_(projects)]
    if actor.role == "admin" and actor.domain is not None:
        mine.append(Environment.domain_id.in_(select(Domain.id).where(Domain.name == actor.domain)))
    return or_(*mine) if mine else Environment.id.is_(None)


def list_environments(db: Session, actor: Actor) -> list[Environment]:
    """The environments ``actor`` sees, newest first."""
    q = select(Environment).order_by(Environment.created_at.desc(), Environment.id)
    visible = _visible_to(actor)
    if visible is not None:
        q = q.where(visible)
    return list(db.scalars(q))


def readable(db: Session, actor: Actor, env_id: Any) -> Environment:
    """The environment, if ``actor`` may see it; *not found* otherwise."""
    env = db.get(Environment, env_id) if isinstance(env_id, str) and UUID_RE.match(env_id) else None
    if env is None or not may_see(actor, facts_of(env)):
        raise NotFound(f"no environment {str(env_id)[:64]!r}")
    return env


def views(db: Session, envs: list[Environment]) -> list[dict[str, Any]]:
    """:func:`view` of each, with whether its image is registered (promoted) now."""
    built = {e.image for e in envs if e.image}
    registered = set(db.scalars(select(Image.name).where(Image.name.in_(built)))) if built else set()
    return [view(e, registered=e.image in registered) for e in envs]


def view(env: Environment, *, registered: bool = False) -> dict[str, Any]:
    def iso(t: datetime | None) -> str | None:
        return t.isoformat() if t else None

    return {
        "id": env.id,
        "name": env.name,
        "owner_kind": env.owner_kind,
        "owner": owner_label(env),
        "project": env.project.full_name if env.project is not None else None,
        "domain": env.domain.name,
        "creator": env.creator,
        "base": env.base,
        "files": dict(env.recipe or {}),
        "recipe_hash": env.recipe_hash,
        "image": env.image,
        "image_id": env.image_id,
        "size_bytes": env.size_bytes,
        "status": env.status,
        "status_reason": env.status_reason,
        "node": env.node,
        "source_session": env.source_session,
        "registered": registered,
        "created_at": iso(env.created_at),
        "started_at": iso(env.started_at),
        "finished_at": iso(env.finished_at),
    }


def session_image(db: Session, username: str, project_ref: Any, ref: str) -> tuple[str, str]:
    """(the base image admission checks, the image the session runs) of ``env:<id>``, a session's
    image request for an environment.

    A personal environment starts sessions of its owner (in any project that may use its base); a
    project environment, sessions of that project (its members). Anyone else's: *not found*, as if
    it did not exist. One that is not READY: a conflict that says its status."""
    env_id = ref[len(ENVIRONMENT_IMAGE_PREFIX) :]
    env = db.get(Environment, env_id) if UUID_RE.match(env_id) else None
    user = db.scalar(select(User).where(User.username == username))
    usable = False
    if env is not None and user is not None:
        if env.owner_kind == "user":
            usable = env.user_id == user.id
        else:
            dname, pname = parse_project_ref(project_ref, user.domain.name)
            usable = (
                env.project is not None
                and env.project.full_name == f"{dname}/{pname}"
                and user in env.project.members
            )
    if env is None or not usable:
        raise NotFound(f"no environment {env_id[:64]!r} of yours for this session's project")
    if env.status != READY or not env.image:
        raise Conflict(f"environment {env.name} is {env.status}: sessions start from it once it is READY")
    return env.base, env.image


# ---------------------------------------------------------------- creating


def _project_of(db: Session, user: User, ref: Any) -> Project | None:
    if ref is None:
        return None
    dname, pname = parse_project_ref(ref, user.domain.name)
    project = db.scalar(select(Project).join(Domain).where(Domain.name == dname, Project.name == pname))
    if project is None or user not in project.members:
        raise NotFound(f"no project {dname}/{pname} of yours")
    if not project.is_active:
        raise Conflict(f"project {project.full_name} is not active")
    return project


def _base_of(db: Session, user: User, project: Project | None, ref: Any) -> Image:
    """The registered image ``ref`` names, if the user may use it in ``project`` (none: in one of
    their active projects, where a personal environment's sessions will run)."""
    name = check_base_image(ref)
    image = images.find(db, name)
    where = [project.full_name] if project else [p.full_name for p in user.projects if p.is_active]
    if image is None or not any(images.allowed_for(image, p) for p in where):
        scope = f"in project {project.full_name}" if project else "in any of your projects"
        raise InvalidInput(
            f"base {name} is not a registered image you may use {scope} (GET /api/images lists them)"
        )
    return image


def _has_conda(image: Image) -> bool:
    return str((image.labels or {}).get(CONDA_LABEL, "")).strip().lower() in ("1", "true", "yes")


def _policy_limits(user: User, project: Project | None) -> tuple[int, int, str]:
    """(most environments, most bytes of their images, whose rule that is) for the owner; 0: no limit."""
    policy = project.resource_policy if project is not None else user.resource_policy
    if policy is None:
        return DEFAULT_MAX_ENVIRONMENTS, 0, "the default"
    return policy.max_environments, policy.max_environment_bytes, f"policy {policy.name}"


def _owned_by(user: User | None, project: Project | None) -> Any:
    if project is not None:
        return Environment.project_id == project.id
    return Environment.user_id == user.id  # type: ignore[union-attr]


def check_limits(db: Session, user: User, project: Project | None, adding: int = 0) -> None:
    """Conflict (409) when the owner may have no new environment (``adding`` bytes of image more)."""
    count, used = db.execute(
        select(func.count(), func.coalesce(func.sum(Environment.size_bytes), 0)).where(
            _owned_by(user, project)
        )
    ).one()
    most, most_bytes, rule = _policy_limits(user, project)
    who, has = (f"project {project.full_name}", "has") if project is not None else ("you", "have")
    if most and count >= most:
        raise Conflict(
            f"{who} already {has} {count} environment(s), the most {rule} allows (failed ones count "
            "too): delete one first"
        )
    if most_bytes and (used + adding > most_bytes or used >= most_bytes):
        whose = "your" if project is None else f"project {project.full_name}'s"
        this = f" and this one's {fmt_bytes(adding)}" if adding else ""
        raise Conflict(
            f"the images of {whose} environments take {fmt_bytes(used)}{this}, and {rule} allows "
            f"{fmt_bytes(most_bytes)} in all: delete one first"
        )


def _files_of_folder(db: Session, actor: Actor, body: Mapping[str, Any], max_bytes: int) -> dict[str, str]:
    """The recipe's files in a virtual folder the caller may download from (``folder``: its id;
    ``path``: a directory in it, default its top; an Import & Run of a repository lands there):
    whichever of :data:`recipes.RECIPE_FILES` it has, read now, as a request's ``files``."""
    if "files" in body:
        raise InvalidInput("give files or a folder, not both")
    folder = body["folder"]
    if not isinstance(folder, str):
        raise InvalidInput("folder is a vfolder's id")
    path = body.get("path", "")
    rel = check_relpath(path if isinstance(path, str) else "\0")
    found = read_texts(db, actor, folder, rel, RECIPE_FILES, max_bytes)
    if not found:
        where = f"{rel}/ of the folder" if rel else "the folder"
        raise InvalidInput(f"{where} has none of the recipe's files ({', '.join(RECIPE_FILES)})")
    return found


def _creator(db: Session, actor: Actor) -> User:
    if actor.role == "monitor":
        raise Forbidden("monitors read; they create no environments")
    user = db.get(User, actor.user_id) if actor.kind == "user" and actor.user_id is not None else None
    if user is None:
        raise Forbidden(
            "an environment is a user's or a project's own image: sign in as a user to create one"
        )
    return user


def _check_name_free(db: Session, user: User, project: Project | None, name: str) -> None:
    """Conflict when the owner has an environment named ``name``. The owner's row is locked first
    (PostgreSQL) until the request commits: two creates at once cannot both take the last place
    of :func:`check_limits` or the same name."""
    if project is not None:
        db.execute(select(Project.id).where(Project.id == project.id).with_for_update())
    else:
        db.execute(select(User.id).where(User.id == user.id).with_for_update())
    if db.scalar(select(Environment.id).where(_owned_by(user, project), Environment.name == name)):
        raise Conflict(
            f"{'project ' + project.full_name + ' already has' if project else 'you already have'} "
            f"an environment named {name}"
        )


def _new(
    user: User,
    project: Project | None,
    name: str,
    base: str,
    recipe: dict[str, str],
    hash_: str,
    source_session: str | None = None,
) -> Environment:
    """A new environment of ``project`` (None: of ``user``), QUEUED, created by ``user``."""
    return Environment(
        id=str(uuid.uuid4()),
        name=name,
        owner_kind="project" if project else "user",
        user=None if project else user,
        project=project,
        domain=project.domain if project else user.domain,
        creator=user.username,
        base=base,
        recipe=recipe,
        recipe_hash=hash_,
        status=QUEUED,
        status_reason="",
        size_bytes=0,
        source_session=source_session,
    )


def create(db: Session, actor: Actor, body: Any, *, max_recipe_bytes: int = MAX_RECIPE_BYTES) -> Environment:
    """Check a request for a new environment (untrusted) and record it: READY at once when an
    environment of the same recipe was built already (its image is shared), else QUEUED."""
    if isinstance(body, Mapping) and "session" in body:
        return create_from_session(db, actor, body)
    body = check_fields(body, required=["name", "base"], optional=FIELDS)
    user = _creator(db, actor)
    name = check_name(body["name"], "name")
    project = _project_of(db, user, body.get("project"))
    base = _base_of(db, user, project, body["base"])
    files = body.get("files")
    if body.get("folder") is not None:
        files = _files_of_folder(db, actor, body, max_recipe_bytes)
    elif "path" in body:
        raise InvalidInput("path is a folder's: give folder too")
    recipe = parse_recipe(
        base.name, {} if files is None else files, conda=_has_conda(base), max_bytes=max_recipe_bytes
    )
    _check_name_free(db, user, project, name)
    hash_ = recipe_hash(recipe)
    twin = db.scalar(
        select(Environment)
        .where(Environment.recipe_hash == hash_, Environment.status == READY, Environment.image.is_not(None))
        .order_by(Environment.finished_at.desc())
        .limit(1)
    )
    check_limits(db, user, project, twin.size_bytes if twin is not None else 0)
    env = _new(user, project, name, base.name, dict(recipe.files), hash_)
    if twin is not None:
        now = datetime.now(timezone.utc)
        env.status, env.started_at, env.finished_at = READY, now, now
        env.image, env.image_id, env.size_bytes, env.node = (
            twin.image,
            twin.image_id,
            twin.size_bytes,
            twin.node,
        )
        env.status_reason = (
            f"an environment of the same recipe was built before: its image {twin.image} is reused"
        )
    db.add(env)
    db.flush()
    details = {"id": env.id, "base": env.base, "files": sorted(env.recipe), "recipe_hash": hash_}
    target = f"{owner_label(env)}/{name}"
    audit.record(db, actor, "environment.create", target, target_domain=env.domain.name, details=details)
    if twin is not None:
        _audit_build(db, env, reused=True)
    return env


def create_from_session(db: Session, actor: Actor, body: Any) -> Environment:
    """Save as environment: ``{"name", "session", "project"?}``, a running session of the caller's
    made into an environment (QUEUED: the queue commits its container, records what was installed in
    it as the recipe, and takes its image). Its base is the session's registered image (or that
    image's base, for a session of an environment); the caller must be allowed it in ``project``."""
    body = check_fields(body, required=["name", "session"], optional=("name", "session", "project"))
    user = _creator(db, actor)
    name = check_name(body["name"], "name")
    project = _project_of(db, user, body.get("project"))
    sid = body["session"]
    session = db.get(ComputeSession, sid) if isinstance(sid, str) and UUID_RE.match(sid) else None
    if session is None or session.user_id != user.id:
        raise NotFound(f"no session {str(sid)[:64]!r} of yours")
    if session.status != RUNNING:
        raise Conflict(
            f"session {session.name or session.id} is {session.status}: only a running one is saved"
        )
    image = session.image or ""
    base_name = image if images.find(db, image) is not None else base_of_image(db, image)
    if base_name is None:
        raise Conflict(
            f"session {session.name or session.id} runs no registered image (its image: {image or 'none'})"
        )
    base = _base_of(db, user, project, base_name)
    _check_name_free(db, user, project, name)
    check_limits(db, user, project)
    # Its own hash: a commit is no build of a recipe, and no recipe build may take its image.
    hash_ = "commit-" + uuid.uuid4().hex
    env = _new(user, project, name, base.name, {}, hash_, source_session=session.id)
    db.add(env)
    db.flush()
    target = f"{owner_label(env)}/{name}"
    details = {"id": env.id, "base": env.base, "session": session.id}
    audit.record(db, actor, "environment.create", target, target_domain=env.domain.name, details=details)
    return env


# ---------------------------------------------------------------- deleting


@dataclass(frozen=True)
class Deleted:
    id: str
    name: str
    image: str | None  # its image's tag (READY), to remove from the engine when no other environment has it
    status: str


def delete(db: Session, actor: Actor, env_id: Any) -> Deleted:
    env = readable(db, actor, env_id)
    if not may_delete(actor, facts_of(env)):
        domain = env.domain.name
        if env.owner_kind == "project":
            raise Forbidden(
                f"only its creator ({env.creator}) or an admin of domain {domain} can delete environment {env.name}"
            )
        raise Forbidden(f"only its owner or an admin of domain {domain} can delete environment {env.name}")
    gone = Deleted(env.id, env.name, env.image, env.status)
    target, domain = f"{owner_label(env)}/{env.name}", env.domain.name
    usage_ledger.release_build(db, env)
    db.delete(env)
    audit.record(
        db,
        actor,
        "environment.delete",
        target,
        target_domain=domain,
        details={"id": gone.id, "status": gone.status},
    )
    return gone


def promote(db: Session, actor: Actor, env_id: Any, body: Any) -> Image:
    """A superadmin registers a READY environment's image for everyone (``{"display_name"?}``): a
    registered image like any other (the base's minimum resources, accelerators and apps; editable
    and removable on the images' page), which stays on the engine while it is registered."""
    body = check_fields({} if body is None else body, optional=("display_name",))
    if not actor.is_superadmin:
        raise Forbidden("only a superadmin promotes an environment to a registered image")
    env = readable(db, actor, env_id)
    if env.status != READY or not env.image:
        raise Conflict(f"environment {env.name} is {env.status}: only a READY one is promoted")
    base = images.find(db, env.base)
    fields: dict[str, Any] = {
        "name": env.image,
        "display_name": body.get("display_name") or f"{env.name} (from {owner_label(env)}, on {env.base})",
    }
    if base is not None:
        fields.update(
            min_resource_slots=base.min_slots.to_json(),
            accelerators=list(base.accelerators or []),
            service_ports=list(base.service_ports or []),
        )
    image = images.register(db, actor, fields)
    target = f"{owner_label(env)}/{env.name}"
    audit.record(
        db, actor, "environment.promote", target, target_domain=env.domain.name, details={"image": env.image}
    )
    return image


def base_of_image(db: Session, tag: str) -> str | None:
    """The registered base of the environment image ``tag`` (the base is part of the recipe hash, so
    one tag has one base); None when no environment has that image."""
    return db.scalar(select(Environment.base).where(Environment.image == tag).limit(1))


def image_in_use(db: Session, tag: str) -> bool:
    """Does an environment have the image ``tag`` (or wait for a build that will find it), or is it
    registered (promoted)?"""
    hash_ = tag.rsplit(":", 1)[-1]
    waiting = and_(Environment.recipe_hash == hash_, Environment.status.in_(BUILD_PENDING_STATUSES))
    if images.find(db, tag) is not None:
        return True  # promoted: a registered image now
    return (
        db.scalar(select(Environment.id).where(or_(Environment.image == tag, waiting)).limit(1)) is not None
    )


# ---------------------------------------------------------------- the build's bookkeeping (the queue)


@dataclass(frozen=True)
class BuildOrder:
    """What a build needs, read from the DB in its first transaction."""

    id: str
    name: str
    recipe: Recipe
    recipe_hash: str
    tag: str
    creator: str
    source_session: str | None = None  # Save as environment: commit this session's container
    # Its containers' cores and bytes (None: no limit), held in the creator's quota
    # (labfleet.compute.buildcharge); or why it may not run (too little left), holding nothing.
    cpu_limit: float | None = None
    mem_limit: int | None = None
    refusal: str | None = None


@dataclass(frozen=True)
class Built:
    image: str  # its tag
    image_id: str
    size: int
    reused: bool  # an image of the same recipe was on the engine already: nothing was built
    recorded: Mapping[str, str] | None = None  # a commit's recipe: what was installed in the session


def queued(db: Session) -> list[tuple[str, str]]:
    """(id, creator) of the environments waiting for a build, oldest first."""
    q = select(Environment.id, Environment.creator).where(Environment.status == QUEUED)
    return [(i, c) for i, c in db.execute(q.order_by(Environment.created_at, Environment.id))]


def requeue_interrupted(db: Session) -> list[str]:
    """At the service's start: the builds a stopped service left BUILDING wait again (QUEUED),
    holding nothing until they start again."""
    found = list(db.scalars(select(Environment).where(Environment.status == BUILDING)))
    for env in found:
        usage_ledger.release_build(db, env)
        env.status, env.status_reason, env.started_at = QUEUED, "the service restarted: built again", None
    return [env.id for env in found]


def start_build(db: Session, env_id: str, node: str) -> BuildOrder | None:
    """QUEUED -> BUILDING; None when it is not waiting any more (deleted meanwhile). The queue
    holds the build's slots (:func:`labfleet.compute.buildcharge.hold`) in the same transaction."""
    env = db.get(Environment, env_id)
    if env is None or env.status != QUEUED:
        return None
    env.status, env.status_reason, env.node = BUILDING, "", node
    env.started_at = datetime.now(timezone.utc)
    files: Mapping[str, str] = env.recipe or {}
    recipe = Recipe(base=env.base, files=dict(files))
    if env.source_session is not None:
        hash_ = env.recipe_hash
        return BuildOrder(env.id, env.name, recipe, hash_, image_tag(hash_), env.creator, env.source_session)
    hash_ = recipe_hash(recipe)  # what the image's label will say
    return BuildOrder(env.id, env.name, recipe, hash_, image_tag(hash_), env.creator)


def finish_build(db: Session, env_id: str, built: Built) -> str | None:
    """BUILDING -> READY, or FAILED when the image takes the owner past ``max_environment_bytes``;
    the status, or None when the environment is gone (deleted while it was built)."""
    env = db.get(Environment, env_id)
    if env is None:
        return None
    usage_ledger.release_build(db, env)
    env.finished_at = datetime.now(timezone.utc)
    over = _over_bytes(db, env, built.size)
    if over:
        env.status, env.status_reason = FAILED, f"the image is built, but {over}"
    else:
        env.status, env.image, env.image_id, env.size_bytes = READY, built.image, built.image_id, built.size
        if built.recorded is not None:
            env.recipe = dict(built.recorded)
        env.status_reason = (
            "an image of the same recipe was on the engine: reused, nothing built" if built.reused else ""
        )
    _audit_build(db, env, reused=built.reused)
    return env.status


def _over_bytes(db: Session, env: Environment, size: int) -> str | None:
    """Why the owner's other environments' images and this one's are over their byte limit, or None."""
    policy: Any = env.project.resource_policy if env.project is not None else env.user.resource_policy  # type: ignore[union-attr]
    most = policy.max_environment_bytes if policy is not None else 0
    if not most:
        return None
    owner = Environment.project_id == env.project_id if env.project_id else Environment.user_id == env.user_id
    used = (
        db.scalar(
            select(func.coalesce(func.sum(Environment.size_bytes), 0)).where(owner, Environment.id != env.id)
        )
        or 0
    )
    if used + size <= most:
        return None
    return (
        f"it takes {fmt_bytes(size)} and the owner's other environments {fmt_bytes(used)}: more than "
        f"the {fmt_bytes(most)} policy {policy.name} allows"
    )


def fail_build(db: Session, env_id: str, reason: str) -> bool:
    """BUILDING -> FAILED with ``reason``; False when the environment is gone."""
    env = db.get(Environment, env_id)
    if env is None:
        return False
    usage_ledger.release_build(db, env)
    env.status, env.status_reason = FAILED, reason[:2000]
    env.finished_at = datetime.now(timezone.utc)
    _audit_build(db, env, reused=False)
    return True


def _audit_build(db: Session, env: Environment, *, reused: bool) -> None:
    """``environment.build``, in the name of the environment's creator."""
    user = db.scalar(select(User).where(User.username == env.creator))
    actor = (
        actor_for(user) if user is not None else Actor(name=env.creator, role="user", domain=env.domain.name)
    )
    details: dict[str, Any] = {"id": env.id, "status": env.status, "reused": reused}
    if env.status == READY:
        details.update(image=env.image, size_bytes=env.size_bytes)
    else:
        details["reason"] = env.status_reason[:300]
    audit.record(
        db,
        actor,
        "environment.build",
        f"{owner_label(env)}/{env.name}",
        target_domain=env.domain.name,
        details=details,
        success=env.status == READY,
    )
