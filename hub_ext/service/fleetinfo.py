"""What the admin console's Information and Configurations pages read: versions, health, and the
settings in force with where each came from (``GET /api/info`` and ``GET /api/configuration``).

Plain functions over the service's parts (its engine, its Hub client's address and token, its
job loop, the LabfleetService object itself), assembled by ``labfleet.service.handlers.console``.

Nothing here ever answers a secret: the service token and the metrics token are told as set or not,
the DB URL loses its password, and :func:`scrub` replaces any known secret that turns up anywhere
in an answer (an error message, a setting's value) with ``***`` before it leaves.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import os
import platform
import re
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session

from labfleet.compute import nodes
from labfleet.core import bootstrap, envtraits, http
from labfleet.core.authz import Actor
from labfleet.core.dburl import normalize_url
from labfleet.core.errors import Forbidden
from labfleet.storage import hosts

HIDDEN = "***"

# (what people call it, the distribution)
PACKAGES = (
    ("labfleet", "labfleet"),
    ("JupyterHub", "jupyterhub"),
    ("JupyterLab", "jupyterlab"),
    ("jupyter-server", "jupyter-server"),
    ("Voila", "voila"),
    ("ipywidgets", "ipywidgets"),
    ("SQLAlchemy", "sqlalchemy"),
    ("Alembic", "alembic"),
    ("tornado", "tornado"),
    ("traitlets", "traitlets"),
)

HUB_TIMEOUT = 5.0  # seconds the Hub's API has to answer the health check


def can_read(actor: Actor) -> bool:
    """Information and configurations: superadmins, domain admins and monitors (and the CLI)."""
    return actor.role in ("superadmin", "admin", "monitor") and actor.kind in ("user", "cli")


def need_reader(actor: Actor, what: str) -> None:
    if not can_read(actor):
        raise Forbidden(f"only admins and monitors read the fleet's {what}")


# ---------------------------------------------------------------- secrets


def secrets_of(app: Any, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Every secret the service knows, to be kept out of its answers: its Hub token, the metrics
    token, the DB password, the key that seals keypair secrets, and any ``*TOKEN*``/``*SECRET*``/
    ``*PASSWORD*`` variable of its environment."""
    found = [getattr(app, "service_token", ""), getattr(app, "metrics_token", "")]
    found.append(db_password(getattr(app, "db_url", "") or ""))
    for name, value in environ.items():
        upper = name.upper()
        if re.search(r"TOKEN|SECRET|PASSWORD|PASSWD", upper) and not upper.endswith(
            ("_FILE", "_PATH", "_DIR")
        ):
            found.append(value)
    return sorted({s for s in found if s and len(s) >= 4}, key=len, reverse=True)


def db_password(url: str) -> str:
    try:
        return make_url(normalize_url(url)).password or ""
    except (ArgumentError, ValueError):
        return ""


def safe_db_url(url: str) -> str:
    """The DB URL with its password replaced by ``***`` (SQLAlchemy's own rendering)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "(not a valid URL)"


def scrub(value: Any, secrets: Iterable[str]) -> Any:
    """``value`` (JSON: dicts, lists, strings, numbers) with every secret replaced by ``***``."""
    secrets = [s for s in secrets if s]
    if not secrets:
        return value
    if isinstance(value, str):
        for s in secrets:
            value = value.replace(s, HIDDEN)
        return value
    if isinstance(value, Mapping):
        return {scrub(k, secrets): scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v, secrets) for v in value]
    return value


def json_safe(value: Any) -> Any:
    """A setting's value as JSON (traitlets hands lists, dicts, numbers, strings)."""
    return json.loads(json.dumps(value, default=str))


# ---------------------------------------------------------------- versions


def package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_versions() -> dict[str, str | None]:
    """The versions of what the service runs with (None: not installed here)."""
    out = {label: package_version(dist) for label, dist in PACKAGES}
    out["Python"] = platform.python_version()
    return out


def db_server(engine: Engine) -> dict[str, Any]:
    """The DB: its kind, driver, server version, and the schema revision it is at and this code wants."""
    out: dict[str, Any] = {
        "dialect": engine.dialect.name,
        "driver": engine.dialect.driver,
        "server_version": None,
        "schema_revision": None,
        "schema_head": None,
    }
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                out["server_version"] = "SQLite " + str(
                    conn.execute(text("select sqlite_version()")).scalar()
                )
            elif engine.dialect.name == "postgresql":
                out["server_version"] = "PostgreSQL " + str(
                    conn.execute(text("show server_version")).scalar()
                )
            else:
                info = engine.dialect.server_version_info
                out["server_version"] = ".".join(map(str, info)) if info else None
        out["schema_revision"], out["schema_head"] = bootstrap.schema_revisions(engine)
    except SQLAlchemyError as e:
        out["error"] = _error_text(e)
    return out


# ---------------------------------------------------------------- health


def _error_text(e: BaseException) -> str:
    """An error's type and the first line of its message (the driver's, when SQLAlchemy wraps one)."""
    err = getattr(e, "orig", None) or e
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def db_health(engine: Engine) -> dict[str, Any]:
    """One query's round trip (``SELECT 1`` on a connection from the pool), in milliseconds."""
    t = time.perf_counter()
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1")).scalar()
    except SQLAlchemyError as e:
        return {"status": "failed", "round_trip_ms": None, "message": _error_text(e)}
    ms = round((time.perf_counter() - t) * 1000, 2)
    return {"status": "ok", "round_trip_ms": ms, "message": f"a query answered in {ms} ms"}


async def hub_health(api_url: str, token: str, timeout: float = HUB_TIMEOUT) -> dict[str, Any]:
    """The Hub's REST API as this service reaches it: its version (``GET /hub/api/``) and whether it
    takes the service's token (``GET /hub/api/user``), side by side."""
    if not api_url:
        return {
            "status": "not configured",
            "round_trip_ms": None,
            "version": None,
            "message": "this service was started without the Hub's API URL (not by a Hub)",
        }
    base = api_url.rstrip("/")
    t = time.perf_counter()
    root, me = await asyncio.gather(
        http.request("GET", base + "/", timeout=timeout, upstream="the Hub"),
        http.request("GET", base + "/user", token=token or None, timeout=timeout, upstream="the Hub"),
    )
    ms = round((time.perf_counter() - t) * 1000, 2)
    version = root.data.get("version") if root.ok and isinstance(root.data, dict) else None
    if root.status == 0:
        return {"status": "failed", "round_trip_ms": None, "version": None, "message": root.message}
    if not root.ok:
        return {"status": "failed", "round_trip_ms": ms, "version": None, "message": root.message}
    if not me.ok:
        why = me.message if me.status else f"no answer: {me.message}"
        return {
            "status": "degraded",
            "round_trip_ms": ms,
            "version": version,
            "message": f"the Hub answers but refuses this service's token ({why}): groups, "
            "reconciliation and idle reclamation cannot reach it",
        }
    return {"status": "ok", "round_trip_ms": ms, "version": version, "message": f"answered in {ms} ms"}


def node_health(node_views: Iterable[Mapping[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """Each node's status as the fleet records it (ALIVE, LOST, DISABLED) and when it was last heard
    from (registered or reported), with its devices (pure)."""
    out = []
    for n in node_views:
        seen = n.get("last_seen")
        ago = None
        if seen:
            t = datetime.fromisoformat(str(seen))
            t = t if t.tzinfo else t.replace(tzinfo=timezone.utc)
            ago = round(max((now - t).total_seconds(), 0.0), 1)
        out.append(
            {
                "name": n.get("name"),
                "resource_group": n.get("resource_group"),
                "status": n.get("status"),
                "plugin": n.get("plugin"),
                "devices": len(n.get("devices") or ()),
                "last_seen": seen,
                "seen_ago": ago,
            }
        )
    return out


def nodes_in_reach(db: Session, actor: Actor) -> list[dict[str, Any]]:
    """The nodes of the groups ``actor`` may see, as ``GET /api/nodes`` shows them."""
    found = nodes.list_nodes(db, actor)
    usage = nodes.nodes_usage(db, [n.id for n in found])
    return [nodes.node_view(db, n, usage[n.id]) for n in found]


def jobs_view(loop: Any) -> list[dict[str, Any]]:
    """The service's periodic jobs: how often each runs, how many runs and failures, the last error."""
    out = []
    for job in getattr(loop, "jobs", {}).values():
        out.append(
            {
                "name": job.name,
                "interval": job.interval,
                "runs": job.runs,
                "failures": job.failures,
                "running": job.running,
                "last_error": job.last_error or None,
            }
        )
    return sorted(out, key=lambda j: j["name"])


def service_process() -> dict[str, Any]:
    """This service's process: its pid, when it started and for how long it has run."""
    import psutil

    started = datetime.fromtimestamp(psutil.Process().create_time(), timezone.utc)
    return {
        "pid": os.getpid(),
        "started_at": started.isoformat(),
        "uptime": round((datetime.now(timezone.utc) - started).total_seconds()),
    }


def overall(parts: Mapping[str, Mapping[str, Any]], node_list: list[dict[str, Any]]) -> str:
    """``ok`` when the DB, the Hub and every node are fine; ``degraded`` otherwise; ``failed`` without
    a DB (pure)."""
    if parts["database"]["status"] != "ok":
        return "failed"
    if parts["hub"]["status"] not in ("ok", "not configured"):
        return "degraded"
    if any(n["status"] != "ALIVE" for n in node_list if n["status"] != "DISABLED"):
        return "degraded"
    return "ok"


# ---------------------------------------------------------------- configuration

# A default that reads a variable beyond the options' own (labfleet.core.envtraits): whether the
# Hub started the service.
EXTRA_ENV = {"exit_with_parent": ("JUPYTERHUB_SERVICE_NAME",)}
SECRET_SETTINGS = frozenset({"service_token", "metrics_token"})
SECTIONS = (
    ("scheduler", ("schedule_interval", "api_session_wait", "max_queued_sessions", "max_pending_per_user")),
    ("idle reclamation", ("idle_check_interval", "idle_timeout", "activity_interval")),
    ("usage", ("sample_interval", "usage_retention_days")),
    (
        "storage",
        (
            "storage_hosts",
            "vfolder_default_host",
            "vfolder_scan_interval",
            "vfolder_trash_retention",
            "vfolder_upload_expiry",
        ),
    ),
    (
        "node",
        (
            "node_name",
            "device_plugins",
            "mock_devices",
            "register_local_node",
            "mps",
            "mps_binary",
            "mps_pipe_dir",
            "mps_log_dir",
            "mps_check_interval",
        ),
    ),
    ("sessions", ("session_log_dir", "default_images")),
    (
        "environments",
        (
            "environment_index_url",
            "environment_build_timeout",
            "environment_builds_max",
            "environment_build_cpu",
            "environment_build_mem",
        ),
    ),
    (
        "the Hub",
        (
            "reconcile_interval",
            "reconcile_grace",
            "hub_api_url",
            "prefix",
            "service_url",
            "sync_groups_on_start",
            "token_cache_age",
            "exit_with_parent",
            "parent_check_interval",
        ),
    ),
    ("database", ("db_url", "upgrade_db")),
    ("security", ("service_token", "metrics_token")),
    ("service", ("config_file", "log_level")),
)
SECTION_OF = {name: section for section, names in SECTIONS for name in names}
SOURCES = ("command line", "config file", "environment", "default")

# What does change while the service runs: state kept in the DB, through the API. Settings do not.
RUN_TIME = (
    {
        "what": "storage hosts",
        "where": "/api/storage-hosts (superadmins)",
        "note": "the storage_hosts setting only adds the hosts that are missing, at start",
    },
    {
        "what": "environment images",
        "where": "/api/images (superadmins)",
        "note": "default_images adds missing ones at start",
    },
    {
        "what": "resource groups: scheduler, placement, session types, pending timeout, grants",
        "where": "/api/resource-groups (superadmins)",
        "note": "",
    },
    {
        "what": "resource policies: slots, concurrency, idle timeout, max session lifetime, storage",
        "where": "/api/policies (superadmins)",
        "note": "a keypair policy's negative idle_timeout means the idle_timeout setting",
    },
    {"what": "idle checkers and their bindings", "where": "/api/idle-checkers (admins)", "note": ""},
    {"what": "the announcement", "where": "/api/announcement (superadmins)", "note": ""},
)


def env_names(name: str, trait: Any) -> tuple[str, ...]:
    """The environment variables a setting's default reads, in the order it reads them."""
    return EXTRA_ENV.get(name, ()) + envtraits.env_names(trait)


def _configured(config: Any, classes: Iterable[str], name: str) -> bool:
    """Whether ``config`` sets ``name`` for one of ``classes`` (without making empty sections)."""
    return any(cls in config and name in config[cls] for cls in classes)


def setting_source(
    app: Any, name: str, trait: Any, environ: Mapping[str, str] = os.environ
) -> tuple[str, str | None]:
    """(where the value in force came from, the file or variable): the command line (which wins, and
    is where the Hub's ``configure()`` puts its settings), the config file, a variable of the
    service's environment that the default reads, or the default."""
    classes = [c.__name__ for c in type(app).mro() if hasattr(c, "class_traits")]
    if _configured(getattr(app, "cli_config", {}) or {}, classes, name):
        return "command line", None
    if _configured(app.config, classes, name):
        files = list(getattr(app, "_loaded_config_files", []) or [])
        return "config file", (files[-1] if files else None)
    for var in env_names(name, trait):
        if environ.get(var, "").strip():
            return "environment", var
    return "default", None


def setting_value(app: Any, name: str) -> Any:
    value = getattr(app, name)
    if name in SECRET_SETTINGS:
        return "(set, hidden)" if value else "(not set)"
    if name == "db_url":
        return safe_db_url(normalize_url(value)) if value else value
    if name == "log_level" and isinstance(value, int):
        return logging.getLevelName(value)
    return json_safe(value)


def first_sentence(help_text: str) -> str:
    flat = " ".join((help_text or "").split())
    m = re.match(r"(.+?\.)(\s|$)", flat)
    return (m.group(1) if m else flat)[:300]


def settings_in_force(app: Any, environ: Mapping[str, str] = os.environ) -> list[dict[str, Any]]:
    """Every labfleet setting of the service (and its log level): value, source, the variable its
    default reads, a line of help, its section; none changes while the service runs (a restart of
    the service, which the Hub does at its own restart, applies a change)."""
    traits = {name: t for name, t in app.traits(config=True).items() if name == "log_level" or _own(app, t)}
    out = []
    for name in sorted(traits, key=lambda n: (_section_rank(n), n)):
        trait = traits[name]
        source, where = setting_source(app, name, trait, environ)
        out.append(
            {
                "name": name,
                "section": SECTION_OF.get(name, "other"),
                "value": setting_value(app, name),
                "source": source,
                "source_detail": where,
                "environment": list(env_names(name, trait)),
                "help": first_sentence(trait.help),
                "secret": name in SECRET_SETTINGS,
                "changes_at_run_time": False,
            }
        )
    return out


def sections_of(settings: Iterable[Mapping[str, Any]]) -> list[str]:
    """The sections the settings fall in, in the page's order ("other" last, for settings that no
    section names yet)."""
    present = {s["section"] for s in settings}
    return [name for name, _ in SECTIONS if name in present] + (["other"] if "other" in present else [])


def _own(app: Any, trait: Any) -> bool:
    """A trait of labfleet's own classes (not traitlets' Application's)."""
    owner = getattr(trait, "this_class", None)
    return owner is not None and owner.__module__.startswith("labfleet")


def _section_rank(name: str) -> int:
    section = SECTION_OF.get(name)
    return next((i for i, (s, _) in enumerate(SECTIONS) if s == section), len(SECTIONS))


def storage_hosts_in_force(db: Session, actor: Actor) -> list[dict[str, Any]]:
    """The storage hosts the DB holds now (what the API changed included); paths for those who read
    everything, as ``GET /api/storage-hosts`` shows them."""
    return [hosts.host_view(db, h, admin=actor.reads_everything) for h in hosts.list_hosts(db)]


def config_file_view(app: Any) -> dict[str, Any]:
    files = list(getattr(app, "_loaded_config_files", []) or [])
    return {"name": getattr(app, "config_file", None), "loaded": files}


# ---------------------------------------------------------------- the answers


def info_answer(
    db: Session,
    actor: Actor,
    app: Any,
    *,
    database: Mapping[str, Any],
    hub: Mapping[str, Any],
    now: datetime,
) -> dict[str, Any]:
    """``GET /api/info``: versions and health, ``database`` and ``hub`` checked beforehand
    (:func:`db_health` with :func:`db_server`, :func:`hub_health`); secrets scrubbed."""
    need_reader(actor, "information")
    node_list = node_health(nodes_in_reach(db, actor), now)
    answer = {
        "checked_at": now.isoformat(),
        "status": overall({"database": database, "hub": hub}, node_list),
        "versions": package_versions(),
        "hub": dict(hub),
        "database": dict(database),
        "service": {
            "status": "ok",
            "node": getattr(app, "node_name", ""),
            **service_process(),
            "jobs": jobs_view(getattr(app, "jobs", None)),
        },
        "nodes": node_list,
    }
    return scrub(answer, secrets_of(app))


def configuration_answer(db: Session, actor: Actor, app: Any) -> dict[str, Any]:
    """``GET /api/configuration``: the settings in force and where each came from, the storage hosts
    in the DB, what changes at run time; secrets scrubbed."""
    need_reader(actor, "configuration")
    settings = settings_in_force(app)
    answer = {
        "settings": settings,
        "sections": sections_of(settings),
        "config_file": config_file_view(app),
        "storage_hosts": storage_hosts_in_force(db, actor),
        "run_time": list(RUN_TIME),
        "restart": "Settings take effect when the service starts: change the command line "
        "(configure() in jupyterhub_config.py), the config file or the environment, then "
        "restart the Hub, which restarts the service.",
    }
    return scrub(answer, secrets_of(app))
