"""Wiring labfleet into a JupyterHub config: the service, its role, the authenticator.

``jupyterhub_config.py`` calls :func:`configure`; deployments can call it from their
own config and then override what they need (authenticator, spawner, DB URL).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from labfleet.core import hubmap, sessionlogs
from labfleet.core.dburl import DB_URL_ENV, DEFAULT_DB_FILE
from labfleet.core.hubmap import ADMIN_CONSOLE_ENV, ADMIN_SERVICE_NAME, SERVICE_NAME, console_wanted
from labfleet.core.rights import RIGHTS
from labfleet.core.secretbox import KEY_FILE_ENV, ensure_key_file

SERVICE_TOKEN_ENV = "LABFLEET_SERVICE_TOKEN"
# Every LABFLEET_* variable of the Hub's environment reaches the service (which describes this node
# with them, takes its clocks, the metrics token, the sampler's and the reclaimer's settings from
# them; see labfleet.service.app), and so do these:
NODE_ENV = ("DOCKER_HOST",)  # the engine whose containers the usage sampler reads


def service_environment(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """What of the Hub's environment the service gets: every ``LABFLEET_*`` variable and NODE_ENV."""
    return {k: v for k, v in environ.items() if k.startswith("LABFLEET_") or k in NODE_ENV}


SERVICE_PORT_ENV = "LABFLEET_SERVICE_PORT"
ADMIN_PORT_ENV = "LABFLEET_ADMIN_PORT"
BACKEND_ENV = "LABFLEET_BACKEND"
SESSION_ACCOUNT = "labfleet-session"  # local sessions' account (LabfleetLocalSpawner.session_user)
STORAGE_HOSTS_ENV = "LABFLEET_STORAGE_HOSTS"
# The local backend runs the Hub host's own Python environment: one image stands for it.
LOCAL_IMAGE = {"name": "local/host", "display_name": "JupyterLab on the Hub host (local sessions)"}
DOCKER_IMAGE_ENV = "LABFLEET_DOCKER_IMAGE"
DEFAULT_DOCKER_IMAGE = "labfleet/singleuser:test"
DEFAULT_SERVICE_PORT = 10101
# The swarm backend: the address of the Hub's manager node that the other nodes reach (the Hub's API
# listens there), and the labfleet service's URL as sessions on those nodes reach it.
HUB_ADDRESS_ENV = "LABFLEET_HUB_ADDRESS"
SESSION_SERVICE_URL_ENV = "LABFLEET_SESSION_SERVICE_URL"
SWARM_NETWORK_ENV = "LABFLEET_SWARM_NETWORK"  # labfleet.spawner.swarm.NETWORK_ENV
SWARM_SPAWNER = "labfleet.spawner.swarm.LabfleetSwarmSpawner"

# What the labfleet service may do on the Hub: keep users and groups in step, read servers.
SERVICE_SCOPES = [
    "admin:users",
    "admin:groups",
    "list:users",
    "read:users",
    "read:servers",
    "admin:servers",
    "access:servers",
]

# The server role's scopes, plus calling the labfleet service and managing the owner's own servers.
SESSION_TOKEN_SCOPES = [
    "users:activity!user",
    "access:servers!server",
    f"access:services!service={SERVICE_NAME}",
    "servers!user",
    "read:servers!user",
]


def service_token(state_dir: Path) -> str:
    """$LABFLEET_SERVICE_TOKEN, else a token kept in ``labfleet_service_token`` (0600)."""
    token = os.environ.get(SERVICE_TOKEN_ENV)
    if token:
        return token
    path = state_dir / "labfleet_service_token"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path.read_text().strip()


def service_args(settings: dict[str, Any]) -> list[str]:
    """``--LabfleetService.name=value`` arguments for the service's command line (pure).

    A list gives one argument per item (traitlets appends them); dicts and lists of dicts are JSON."""
    args = []
    for name, value in settings.items():
        for item in value if isinstance(value, list | tuple) else [value]:
            text = json.dumps(item) if isinstance(item, dict | list) else str(item)
            args.append(f"--LabfleetService.{name}={text}")
    return args


def admin_service(service_port: int, repo_root: str, state_dir: str | Path | None = None) -> dict[str, Any]:
    """The admin console: Voila dashboards in a jupyter-server run by ``jupyterhub-singleuser`` as a
    Hub service (admin_dashboards/). People reach it through the Hub's OAuth with no confirmation
    page; the tokens the Hub issues to it for them also reach the labfleet service, which the
    dashboards' kernels call as the viewer. Its port: $LABFLEET_ADMIN_PORT, else the service's + 1.

    Its Jupyter runtime directory (the kernels' connection files and their unix sockets: the
    kernels talk ZeroMQ over ``ipc``, never TCP) is ``admin-runtime`` in the state directory
    (``state_dir``, else $LABFLEET_STATE_DIR, else the working directory, as for :func:`configure`),
    which the console keeps private (0700; admin_dashboards/__main__.py), not the Hub user's home."""
    port = int(os.environ.get(ADMIN_PORT_ENV) or service_port + 1)
    config = str(Path(__file__).parents[1] / "console" / "jupyter_server_config.py")
    state = Path(state_dir or os.environ.get("LABFLEET_STATE_DIR") or os.getcwd()).absolute()
    return {
        "name": ADMIN_SERVICE_NAME,
        "display": True,
        "url": f"http://127.0.0.1:{port}",
        # jupyterhub-singleuser, stopping with the Hub (admin_dashboards/__main__.py)
        "command": [sys.executable, "-m", "labfleet.console", f"--config={config}"],
        "oauth_no_confirm": True,
        "oauth_client_allowed_scopes": [f"access:services!service={SERVICE_NAME}"],
        "environment": {
            "LABFLEET_SERVICE_URL": f"http://127.0.0.1:{service_port}/services/{SERVICE_NAME}/api",
            "PYTHONPATH": os.pathsep.join(filter(None, [repo_root, os.environ.get("PYTHONPATH")])),
            "JUPYTER_RUNTIME_DIR": str(state / "admin-runtime"),
        },
    }


def interruptible_children() -> None:
    """Let the servers and services this Hub starts be interrupted.

    A Hub started in the background by a non-interactive shell (``nohup jupyterhub &``, a CI job)
    inherits SIGINT ignored, and so would every process it starts. JupyterHub stops its servers and
    managed services with SIGINT first and waits ``interrupt_timeout`` before SIGTERM: each stop
    would take that long (measured: 30 s for a Hub whose console ignored it). Python's default
    handler is reset to the default action on exec, so the children start interruptible.
    """
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    ):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def fleet_home_url(handler: Any) -> str:
    """The Fleet home (the labfleet service's page) under the Hub's base URL: where people land
    after logging in, and from the Hub's ``/`` (``c.JupyterHub.default_url``)."""
    base = handler.base_url if handler.base_url.endswith("/") else handler.base_url + "/"
    return f"{base}services/{SERVICE_NAME}/"


def configure(
    c,
    state_dir: str | Path | None = None,
    *,
    service_port: int | None = None,
    db_url: str | None = None,
    backend: str | None = None,
    storage_hosts: list[dict] | None = None,
    device_plugins: list[str] | None = None,
    mock_devices: list[dict] | None = None,
    service_config: dict[str, Any] | None = None,
    admin_console: bool | None = None,
) -> None:
    """Add the labfleet service, its role and the labfleet authenticator to config ``c``.

    Every setting is an argument; an argument left out falls back to its environment variable
    ($LABFLEET_SERVICE_PORT, $LABFLEET_DB_URL, $LABFLEET_BACKEND, $LABFLEET_STORAGE_HOSTS,
    $LABFLEET_ADMIN_CONSOLE), then to the default. ``admin_console`` (default on): the Voila admin
    console as the Hub-managed service ``labfleet-admin``; off, the Hub starts without it (a few
    seconds sooner) and its pages show no "Fleet admin" link. ``service_config`` sets any other ``LabfleetService`` option (see
    ``labfleet-service --help-all``), e.g. ``{"schedule_interval": 2}``. The service also reads
    ``labfleet_service_config.py`` in the state directory, where it runs.
    """
    interruptible_children()
    console = admin_console if admin_console is not None else console_wanted(os.environ)
    state = Path(state_dir or os.getcwd()).absolute()
    port = service_port or int(os.environ.get(SERVICE_PORT_ENV, DEFAULT_SERVICE_PORT))
    token = service_token(state)
    db_url = db_url or os.environ.get(DB_URL_ENV) or f"sqlite:///{state / DEFAULT_DB_FILE}"
    key_file = Path(os.environ.get(KEY_FILE_ENV) or state / "labfleet_secret.key")
    ensure_key_file(key_file)
    repo_root = str(Path(__file__).parents[2])
    log_dir = os.environ.get(sessionlogs.ENV) or str(state / "session-logs")
    backend = backend or os.environ.get(BACKEND_ENV, "local")
    default_images = configure_spawner(c, backend, state)
    if storage_hosts is None and os.environ.get(STORAGE_HOSTS_ENV):
        storage_hosts = json.loads(os.environ[STORAGE_HOSTS_ENV])
    if storage_hosts is None:
        storage_hosts = [
            {
                "name": "local",
                "path": str(state / "vfolders"),
                "default_permissions": list(RIGHTS),
                # What the API writes must be the sessions' to change: Docker sessions run as uid
                # 1000, local ones as the session account when the Hub is root.
                **session_owner(backend),
            }
        ]
    settings: dict[str, Any] = {
        "session_log_dir": log_dir,
        "storage_hosts": storage_hosts,
        "default_images": default_images,
    }
    if device_plugins is not None:
        settings["device_plugins"] = device_plugins
    if mock_devices is not None:
        settings["mock_devices"] = mock_devices
    if backend == "swarm":
        # The nodes' agents register them (with their Swarm node ids); the Hub host is not a node by itself.
        settings["register_local_node"] = False
    settings.update(service_config or {})
    # Queued sessions are pending spawns: the Hub's limit of those grows by what the fleet may queue
    if "concurrent_spawn_limit" not in c.JupyterHub:
        queued = int(settings.get("max_queued_sessions", hubmap.DEFAULT_MAX_QUEUED_SESSIONS))
        c.JupyterHub.concurrent_spawn_limit = hubmap.concurrent_spawn_limit(queued)

    c.JupyterHub.services = [
        s
        for s in (c.JupyterHub.services if "services" in c.JupyterHub else [])
        if s.get("name") not in (SERVICE_NAME, ADMIN_SERVICE_NAME)
    ] + [
        {
            "name": SERVICE_NAME,
            "display": True,
            "url": f"http://127.0.0.1:{port}",
            "command": [sys.executable, "-m", "labfleet.service", *service_args(settings)],
            "api_token": token,
            "oauth_no_confirm": True,
            "environment": {
                **service_environment(os.environ),  # first: what configure() was given wins
                # In the environment, not on the command line: a PostgreSQL URL may carry a password.
                DB_URL_ENV: db_url,
                KEY_FILE_ENV: str(key_file),
                # Whether the console runs, as decided here (the Fleet home links it only then).
                ADMIN_CONSOLE_ENV: "1" if console else "0",
                # So the service imports this checkout even when labfleet is not installed.
                "PYTHONPATH": os.pathsep.join(filter(None, [repo_root, os.environ.get("PYTHONPATH")])),
            },
        },
        *([admin_service(port, repo_root, state)] if console else []),
    ]
    # The pages' "Fleet admin" link (templates/page.html) only where the console runs; a callable
    # template_vars of the deployment's own is left as it is (the link then shows, as by default).
    if "template_vars" not in c.JupyterHub or isinstance(c.JupyterHub.template_vars, dict):
        template_vars = dict(c.JupyterHub.template_vars) if "template_vars" in c.JupyterHub else {}
        c.JupyterHub.template_vars = {**template_vars, "labfleet_console": console}
    roles = [
        r
        for r in (c.JupyterHub.load_roles if "load_roles" in c.JupyterHub else [])
        if r.get("name") not in ("labfleet-service", "user")
    ]
    c.JupyterHub.load_roles = roles + [
        {
            # Every Hub user may call the labfleet service (it decides what they see),
            # including users an admin created who have not logged in yet.
            "name": "user",
            "scopes": ["self", f"access:services!service={SERVICE_NAME}"],
        },
        {
            "name": "labfleet-service",
            "description": "the labfleet service keeps Hub users and groups in step with tenancy",
            "scopes": SERVICE_SCOPES,
            "services": [SERVICE_NAME],
        },
    ]
    c.JupyterHub.authenticator_class = "labfleet"
    # People land on the Fleet home after logging in (a deployment's own default_url is kept).
    if "default_url" not in c.JupyterHub:
        c.JupyterHub.default_url = fleet_home_url
    # The Hub's pages with a "Fleet admin" link (hub_ext/hub/templates), before any configured path
    templates = str(Path(__file__).parent / "templates")
    configured = list(c.JupyterHub.template_paths) if "template_paths" in c.JupyterHub else []
    c.JupyterHub.template_paths = [templates, *(p for p in configured if p != templates)]
    # The authenticator and the spawners alike.
    c.LabfleetServiceClient.service_url = f"http://127.0.0.1:{port}/services/{SERVICE_NAME}/api"
    c.LabfleetServiceClient.service_token = token
    c.LabfleetSpawnerMixin.session_log_dir = log_dir
    # A session's own token ($JUPYTERHUB_API_TOKEN) acts for its owner in the labfleet service and may
    # start and stop the owner's other servers: the server extension, the sidebar and the widgets use it.
    c.Spawner.server_token_scopes = SESSION_TOKEN_SCOPES


def session_owner(backend: str, account: str = SESSION_ACCOUNT) -> dict[str, int]:
    """``owner_uid``/``owner_gid`` for the default storage host: the account sessions run as."""
    if backend in ("docker", "swarm"):
        return {"owner_uid": 1000, "owner_gid": 1000}
    if os.geteuid() != 0:
        return {}
    try:
        entry = pwd.getpwnam(account)
    except KeyError:
        return {}
    return {"owner_uid": entry.pw_uid, "owner_gid": entry.pw_gid}


def configure_spawner(c, backend: str, state: Path) -> list[dict]:
    """The labfleet spawner for ``backend`` (local | docker | swarm); returns the images to register."""
    c.Spawner.default_url = "/lab"
    # A user runs several sessions at once (named servers); labfleet's policies limit how many.
    c.JupyterHub.allow_named_servers = True
    if backend == "local":
        c.JupyterHub.spawner_class = "labfleet-local"
        c.LabfleetLocalSpawner.home_dir_template = str(state / "homes" / "{username}")
        c.LabfleetSpawnerMixin.default_image = LOCAL_IMAGE["name"]
        # Sessions see the system and the runtime read-only (the checkout, when labfleet runs from
        # one), never the state directory inside it (DBs, secrets, homes, folders, logs) nor the
        # tools folder (Docker engines' data), but the app launchers' programs in it.
        repo = Path(__file__).parents[2]
        c.LabfleetLocalSpawner.sandbox_hidden = [str(state), str(repo / ".labfleet-tools")]
        apps = repo / ".labfleet-tools" / "apps"
        if apps.is_dir():
            c.LabfleetLocalSpawner.sandbox_runtime = [str(apps)]
        return [LOCAL_IMAGE]
    if backend == "docker":
        image = os.environ.get(DOCKER_IMAGE_ENV, DEFAULT_DOCKER_IMAGE)
        c.JupyterHub.spawner_class = "labfleet-docker"
        c.LabfleetSpawnerMixin.default_image = image
        # Sessions join their own bridge network (LabfleetDockerSpawner.network_name, made when
        # missing, guarded by labfleet.spawner.sessionnet): they reach the Hub and the service only through
        # the Hub's public proxy; the Hub's API stays on 127.0.0.1 (see the README).
        c.JupyterHub.hub_connect_ip = "127.0.0.1"
        return [{"name": image, "inspect": True}]
    if backend == "swarm":
        return configure_swarm(c)
    raise ValueError(f"{BACKEND_ENV} must be local, docker or swarm, not {backend!r}")


def configure_swarm(c) -> list[dict]:
    """Sessions as Swarm services (spawner/swarm.py), the Hub on a manager node.

    On the sessions' Swarm network (the default; ``labfleet node network`` on every node) a session
    reaches the Hub's API and the labfleet service only through the Hub's public proxy, which must
    listen where the nodes reach it ($LABFLEET_SESSION_SERVICE_URL names it); the Hub's API stays on
    127.0.0.1. With $LABFLEET_SWARM_NETWORK=host each server listens on its node's ``address``
    label and sessions reach the Hub's API on $LABFLEET_HUB_ADDRESS (the manager's address, default
    127.0.0.1: a one-node swarm)."""
    image = os.environ.get(DOCKER_IMAGE_ENV, DEFAULT_DOCKER_IMAGE)
    address = os.environ.get(HUB_ADDRESS_ENV) or "127.0.0.1"
    session_service_url = os.environ.get(SESSION_SERVICE_URL_ENV, "")
    if not session_service_url and address not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(
            f"{BACKEND_ENV}=swarm with {HUB_ADDRESS_ENV}={address}: set {SESSION_SERVICE_URL_ENV} to the labfleet "
            f"service's URL as the nodes reach it, e.g. http://{address}:8000/services/labfleet/api (the Hub's proxy)"
        )
    c.JupyterHub.spawner_class = SWARM_SPAWNER
    c.LabfleetSpawnerMixin.default_image = image
    if os.environ.get(SWARM_NETWORK_ENV) == "host":
        c.JupyterHub.hub_ip = address
        c.JupyterHub.hub_connect_ip = address
    else:
        c.JupyterHub.hub_connect_ip = "127.0.0.1"
    if session_service_url:
        c.LabfleetSpawnerMixin.session_service_url = session_service_url
    return [{"name": image, "inspect": True}]
