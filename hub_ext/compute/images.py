"""Images (environments): the registry of what sessions may start.

Superadmins register images with their labels (display name, minimum resources, accelerators,
service ports) and, optionally, the projects or domains that may use them.  Where the backend
can, registering reads the labels from the image itself (:func:`docker_labels`), under the
``ai.labfleet.`` prefix::

    ai.labfleet.display-name   = "PyTorch 2.5 (CUDA 12)"
    ai.labfleet.min.cpu        = "1"
    ai.labfleet.min.mem        = "2g"
    ai.labfleet.accelerators   = "cuda"
    ai.labfleet.service-ports  = "tensorboard:http:6006,mlflow:http:5000"
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from labfleet.core import audit
from labfleet.core.authz import Actor
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from labfleet.core.models import Image, Project, User
from labfleet.core.validate import (
    check_bool,
    check_fields,
    check_slots,
    check_string_list,
    check_text,
    parse_project_ref,
)
from labfleet.core.vocab import PORT_RANGE, SLOT_NAMES

LABEL_PREFIX = "ai.labfleet."
IMAGE_FIELDS = (
    "display_name",
    "min_resource_slots",
    "accelerators",
    "service_ports",
    "projects",
    "domains",
    "labels",
    "is_active",
)
_REF = re.compile(r"^[a-z0-9][a-z0-9._/:@+-]{0,254}$", re.IGNORECASE)
_PORT = re.compile(r"^([a-z][a-z0-9_-]{0,31}):(http|tcp|preopen):(\d{1,5})$", re.IGNORECASE)
ACCELERATORS = ("cuda",)


def check_image_name(value: Any) -> str:
    if not isinstance(value, str) or not _REF.match(value) or ".." in value:
        raise InvalidInput(
            f"image name {str(value)[:80]!r} is not a valid image reference (like repo/name:tag)"
        )
    return value


def parse_service_ports(value: Any) -> list[dict[str, Any]]:
    """``name:protocol:port`` items (a list, or one comma-separated string)."""
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, list):
        raise InvalidInput("service_ports must be a list of name:protocol:port")
    out = []
    for item in value:
        if isinstance(item, Mapping):
            item = f"{item.get('name')}:{item.get('protocol')}:{item.get('port')}"
        m = _PORT.match(str(item).strip())
        if not m or not PORT_RANGE[0] <= int(m.group(3)) <= PORT_RANGE[1]:
            raise InvalidInput(
                f"service port {str(item)[:60]!r} is not name:protocol:port (protocol http, tcp or preopen)"
            )
        out.append({"name": m.group(1), "protocol": m.group(2).lower(), "port": int(m.group(3))})
    if len({p["name"] for p in out}) != len(out):
        raise InvalidInput("two service ports have the same name")
    return out


def fields_from_labels(labels: Mapping[str, str]) -> dict[str, Any]:
    """What an image declares about itself, as registration fields (unknown labels are kept only)."""
    out: dict[str, Any] = {}
    mins = {}
    for key, value in labels.items():
        if not key.startswith(LABEL_PREFIX):
            continue
        name = key[len(LABEL_PREFIX) :]
        if name == "display-name":
            out["display_name"] = value
        elif name.startswith("min."):
            mins[name[4:]] = value
        elif name == "accelerators":
            out["accelerators"] = [a.strip() for a in value.split(",") if a.strip()]
        elif name == "service-ports":
            out["service_ports"] = value
    if mins:
        out["min_resource_slots"] = mins
    return out


def docker_labels(name: str) -> dict[str, str]:
    """The image's labels from the local Docker engine; InvalidInput if it cannot be read."""
    try:
        import docker  # the `docker` extra; only this path needs it
    except ImportError:
        raise InvalidInput("cannot read the image's labels: the docker package is not installed") from None
    try:
        client = docker.from_env(timeout=10)
        try:
            image = client.images.get(name)
        finally:
            client.close()
    except docker.errors.ImageNotFound:
        raise InvalidInput(f"the Docker engine has no image {name!r} (build or load it first)") from None
    except docker.errors.DockerException as e:
        raise InvalidInput(f"cannot read the image's labels from Docker: {e}") from None
    return dict(image.labels or {})


def _apply(db: Session, image: Image, body: Mapping[str, Any]) -> None:
    if "display_name" in body:
        image.display_name = check_text(body["display_name"], "display_name", 255)
    if "min_resource_slots" in body:
        slots = check_slots(body["min_resource_slots"], "min_resource_slots")
        unknown = sorted(k for k in slots if k not in SLOT_NAMES)
        if unknown:
            raise InvalidInput(f"min_resource_slots takes {', '.join(SLOT_NAMES)}, not {', '.join(unknown)}")
        image.min_resource_slots = slots.to_db()
    if "accelerators" in body:
        accs = check_string_list(body["accelerators"], "accelerators")
        bad = sorted(set(accs) - set(ACCELERATORS))
        if bad:
            raise InvalidInput(f"unknown accelerator(s) {', '.join(bad)}; known: {', '.join(ACCELERATORS)}")
        image.accelerators = accs
    if "service_ports" in body:
        image.service_ports = parse_service_ports(body["service_ports"])
    if "projects" in body:
        names = []
        for ref in check_string_list(body["projects"], "projects"):
            dname, pname = parse_project_ref(ref)
            if (
                db.scalar(select(Project).where(Project.name == pname, Project.domain.has(name=dname)))
                is None
            ):
                raise NotFound(f"no project {dname}/{pname}")
            names.append(f"{dname}/{pname}")
        image.projects = names
    if "domains" in body:
        image.domains = check_string_list(body["domains"], "domains")
    if "labels" in body:
        labels = body["labels"]
        if not isinstance(labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise InvalidInput("labels must be an object of strings")
        image.labels = dict(labels)
    if "is_active" in body:
        image.is_active = check_bool(body["is_active"], "is_active")


def register(db: Session, actor: Actor, body: Any, labels: Mapping[str, str] | None = None) -> Image:
    """Register an image; ``labels`` (read from the image by the caller) fill what the body omits."""
    if not actor.is_superadmin:
        raise Forbidden("only a superadmin registers images")
    body = check_fields(body, required=["name"], optional=[*IMAGE_FIELDS, "inspect"])
    name = check_image_name(body["name"])
    if db.scalar(select(Image).where(Image.name == name)) is not None:
        raise Conflict(f"image {name} is already registered")
    merged: dict[str, Any] = {}
    if labels:
        merged.update(fields_from_labels(labels))
        merged["labels"] = dict(labels)
    merged.update({k: v for k, v in body.items() if k in IMAGE_FIELDS})
    image = Image(name=name, display_name=name, min_resource_slots={}, accelerators=[], service_ports=[])
    image.projects, image.domains, image.labels = [], [], {}
    _apply(db, image, merged)
    db.add(image)
    db.flush()
    audit.record(db, actor, "image.register", name, details={"projects": image.projects})
    return image


def get_image(db: Session, actor: Actor, name: str) -> Image:
    image = db.scalar(select(Image).where(Image.name == name)) if isinstance(name, str) else None
    if image is None or not can_see(db, actor, image):
        raise NotFound(f"no image {str(name)[:80]!r}")
    return image


def update(db: Session, actor: Actor, name: str, body: Any) -> Image:
    image = get_image(db, actor, name)
    if not actor.is_superadmin:
        raise Forbidden("only a superadmin changes images")
    body = check_fields(body, optional=IMAGE_FIELDS)
    _apply(db, image, body)
    audit.record(db, actor, "image.update", name, details={"fields": sorted(body)})
    return image


def remove(db: Session, actor: Actor, name: str) -> None:
    image = get_image(db, actor, name)
    if not actor.is_superadmin:
        raise Forbidden("only a superadmin removes images")
    db.delete(image)
    audit.record(db, actor, "image.remove", name)


def allowed_for(image: Image, project_full_name: str) -> bool:
    """May sessions of this project use the image?  No restriction listed means everyone."""
    if not image.is_active:
        return False
    if not image.projects and not image.domains:
        return True
    domain = project_full_name.split("/", 1)[0]
    return project_full_name in image.projects or domain in image.domains


def _visibility(db: Session, actor: Actor):
    """A test of "may the actor see this image?", with the actor's projects read once."""
    if actor.kind in ("hub", "cli") or actor.reads_everything:
        return lambda image: True
    admin_of = actor.domain if actor.domain and actor.is_domain_admin_of(actor.domain) else None
    user = db.scalar(select(User).where(User.username == actor.name))
    projects = [p.full_name for p in user.projects] if user is not None else []

    def visible(image: Image) -> bool:
        if admin_of and (not image.domains or admin_of in image.domains):
            return True
        return any(allowed_for(image, p) for p in projects)

    return visible


def can_see(db: Session, actor: Actor, image: Image) -> bool:
    return _visibility(db, actor)(image)


def list_images(db: Session, actor: Actor) -> list[Image]:
    visible = _visibility(db, actor)
    return [i for i in db.scalars(select(Image).order_by(Image.name)) if visible(i)]


def find(db: Session, name: str | None) -> Image | None:
    return None if name is None else db.scalar(select(Image).where(Image.name == name))


def image_view(image: Image) -> dict[str, Any]:
    return {
        "name": image.name,
        "display_name": image.display_name,
        "min_resource_slots": image.min_slots.to_json(),
        "accelerators": list(image.accelerators or []),
        "service_ports": list(image.service_ports or []),
        "projects": list(image.projects or []),
        "domains": list(image.domains or []),
        "labels": dict(image.labels or {}),
        "is_active": image.is_active,
        "created_at": image.created_at.isoformat() if image.created_at else None,
    }
