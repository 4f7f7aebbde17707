"""App services in every session: jupyter-server-proxy launchers and the ports the session's image declares.

Launchers (entry points ``jupyter_serverproxy_servers`` in pyproject.toml) start a program on demand behind
jupyter-server-proxy, at ``<base_url><name>/`` with the server's own authentication:

- ``tensorboard``: TensorBoard on a log dir the user chooses (below);
- ``vscode``: VS Code in the browser (``code-server``, its own auth off: jupyter-server-proxy authenticates);
- ``mlflow``: the MLflow tracking server and UI on the session's MLflow store.

A launcher appears only when its program is on the session's PATH: its entry point raises
:class:`AppUnavailable` otherwise, which jupyter-server-proxy turns into a warning and skips it.

The user's choices, read when the app first starts in the session (jupyter-server-proxy restarts a
crashed app with the same command line, so a change applies from the next session): an environment
variable first, then ``~/.labfleet/apps.json``, then the default::

    {"tensorboard": {"logdir": "runs"},                        # LABFLEET_TENSORBOARD_LOGDIR; default: ~
     "mlflow": {"backend_store_uri": "sqlite:///mlflow.db",    # LABFLEET_MLFLOW_BACKEND_STORE_URI;
                "artifacts_destination": "mlartifacts"}}       #   default: ~/mlflow.db, ~/mlartifacts

Relative paths are relative to the session's home. MLflow refuses changes (POST) from a browser origin
other than localhost: the Hub's public URL (``c.JupyterHub.public_url``, passed to the session) and
``MLFLOW_SERVER_CORS_ALLOWED_ORIGINS`` are allowed.

Image service ports: the spawner passes the image's ``service_ports`` as ``LABFLEET_SERVICE_PORTS`` (JSON);
:func:`image_servers` turns each into a jupyter-server-proxy server on an already served port (``http`` and
``preopen``: HTTP and websockets; ``tcp``: a websocket carrying the raw TCP stream). A name the user
configured in ``c.ServerProxy.servers`` stays the user's. A name of a launcher: **the image wins**, since an
image that declares ``tensorboard`` runs its own TensorBoard there; the launcher then stands aside. Names the
Jupyter server itself routes (``lab``, ``api``, ...) cannot be proxied and are skipped with a warning.

Pure functions, no Jupyter imports: the entry points load in every server start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labfleet.core.vocab import PORT_RANGE

SERVICE_PORTS_ENV = "LABFLEET_SERVICE_PORTS"
TENSORBOARD_LOGDIR_ENV = "LABFLEET_TENSORBOARD_LOGDIR"
MLFLOW_STORE_ENV = "LABFLEET_MLFLOW_BACKEND_STORE_URI"
SETTINGS_FILE = os.path.join(".labfleet", "apps.json")  # in the session's home
CODE_SERVER_DIR = os.path.join(".labfleet", "code-server")  # VS Code's state, in the session's home
# Seconds a program may take to answer its first request (MLflow migrates its DB on first start).
START_TIMEOUT = 90.0
SERVICE_PROTOCOLS = ("http", "tcp", "preopen")
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$", re.IGNORECASE)
# First path segments the Jupyter server (and the extensions of a labfleet session) route themselves:
# their handlers come before jupyter-server-proxy's, so a service port of that name would be unreachable.
RESERVED_NAMES = frozenset(
    {
        "api",
        "custom",
        "doc",
        "edit",
        "files",
        "hub",
        "kernelspecs",
        "lab",
        "labfleet",
        "login",
        "logout",
        "lsp",
        "metrics",
        "nbconvert",
        "nbextensions",
        "notebooks",
        "proxy",
        "server-proxy",
        "static",
        "terminals",
        "tree",
        "view",
        "voila",
    }
)


class AppUnavailable(RuntimeError):
    """This launcher cannot run in this session (its program is missing, or the image serves that name)."""


@dataclass(frozen=True)
class Launcher:
    name: str  # the URL segment and jupyter-server-proxy's server name
    title: str
    program: str  # looked up on the session's PATH


LAUNCHERS = (
    Launcher("tensorboard", "TensorBoard", "tensorboard"),
    Launcher("vscode", "VS Code", "code-server"),
    Launcher("mlflow", "MLflow", "mlflow"),
)


@dataclass(frozen=True)
class App:
    """One app of the session, as ``GET labfleet/apps`` lists it (its URL is relative to the base URL)."""

    name: str
    title: str
    source: str  # launcher | image
    protocol: str = "http"  # http | tcp | preopen

    def view(self, base_url: str) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "url": f"{base_url.rstrip('/')}/{self.name}/",
            "source": self.source,
            "protocol": self.protocol,
        }


# -- the session's environment -------------------------------------------------------------------------


def session_home(environ: Mapping[str, str]) -> str:
    return environ.get("HOME") or os.path.expanduser("~")


def find_program(program: str, environ: Mapping[str, str]) -> str | None:
    """The program's path on the session's PATH, or None."""
    return shutil.which(program, path=environ.get("PATH", os.defpath))


def load_settings(home: str, warn: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """``~/.labfleet/apps.json``; missing means no choices, and a broken file is ignored with a warning
    (the apps still start, on their defaults)."""
    path = os.path.join(home, SETTINGS_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        if warn is not None:
            warn(f"labfleet: ignoring {path}: {e}")
        return {}
    if not isinstance(data, dict):
        if warn is not None:
            warn(f"labfleet: ignoring {path}: not a JSON object")
        return {}
    return data


def _choice(
    environ: Mapping[str, str], env_name: str, settings: Mapping[str, Any], app: str, key: str
) -> str:
    value = environ.get(env_name, "").strip()
    if value:
        return value
    section = settings.get(app)
    if isinstance(section, Mapping):
        value = section.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def _in_home(path: str, home: str) -> str:
    """An absolute path; ``~`` and relative paths are the session's home (not this process's)."""
    if path == "~" or path.startswith("~/"):
        path = home + path[1:]
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(home, path))


def tensorboard_logdir(environ: Mapping[str, str], settings: Mapping[str, Any]) -> str:
    home = session_home(environ)
    chosen = _choice(environ, TENSORBOARD_LOGDIR_ENV, settings, "tensorboard", "logdir")
    return _in_home(chosen, home) if chosen else home


def mlflow_store(environ: Mapping[str, str], settings: Mapping[str, Any]) -> tuple[str, str]:
    """(backend store URI, artifacts destination) of the session's MLflow."""
    home = session_home(environ)
    uri = _choice(environ, MLFLOW_STORE_ENV, settings, "mlflow", "backend_store_uri")
    if not uri:
        uri = "sqlite:///" + os.path.join(home, "mlflow.db")
    elif uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        # sqlite:///relative.db is relative to the working directory: make it the home's.
        uri = "sqlite:///" + _in_home(uri[len("sqlite:///") :], home)
    elif "://" not in uri:
        uri = _in_home(uri, home)  # a plain folder: MLflow's file store
    artifacts = _choice(environ, "", settings, "mlflow", "artifacts_destination") or "mlartifacts"
    return uri, _in_home(artifacts, home)


# -- command lines (jupyter-server-proxy fills {port} and {base_url}) -----------------------------------


def _literal(value: str) -> str:
    """A value inside a command template: jupyter-server-proxy runs str.format on every argument."""
    return value.replace("{", "{{").replace("}", "}}")


def tensorboard_command(program: str, logdir: str) -> list[str]:
    return [
        _literal(program),
        "--logdir",
        _literal(logdir),
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        # TensorBoard serves below the proxied prefix itself (jupyter-server-proxy passes the full path).
        "--path_prefix",
        "{base_url}tensorboard",
    ]


def mlflow_origins(environ: Mapping[str, str]) -> list[str]:
    """Origins whose browser pages may change MLflow (POST from its UI): MLflow refuses any but localhost
    by itself, and only the Hub knows its public address (``c.JupyterHub.public_url``), plus what
    ``MLFLOW_SERVER_CORS_ALLOWED_ORIGINS`` lists."""
    out: list[str] = []
    for item in environ.get("MLFLOW_SERVER_CORS_ALLOWED_ORIGINS", "").split(","):
        if item.strip() and item.strip() not in out:
            out.append(item.strip())
    for name in ("JUPYTERHUB_PUBLIC_URL", "JUPYTERHUB_PUBLIC_HUB_URL"):
        m = re.match(r"^(https?://[^/?#]+)", environ.get(name, ""))
        if m and m.group(1) not in out:
            out.append(m.group(1))
    return out


def mlflow_command(program: str, store_uri: str, artifacts: str, origins: Iterable[str] = ()) -> list[str]:
    origins = list(origins)
    return [
        _literal(program),
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        # One worker: a session's own UI, not a shared tracking server.
        "--workers",
        "1",
        "--backend-store-uri",
        _literal(store_uri),
        "--artifacts-destination",
        _literal(artifacts),
        "--static-prefix",
        "{base_url}mlflow",
        *(["--cors-allowed-origins", _literal(",".join(origins))] if origins else []),
    ]


def code_server_command(program: str, home: str, server_name: str) -> list[str]:
    """VS Code with its own authentication off: it listens on loopback only and is reached solely through
    jupyter-server-proxy, which checks the Jupyter server's authentication on every request. Its state
    (settings, window state) is per session (the Hub server name); extensions are shared by the user's
    sessions."""
    base = os.path.join(home, CODE_SERVER_DIR)
    data = os.path.join(base, "sessions", server_name or "default")
    return [
        _literal(program),
        "--auth",
        "none",
        "--bind-addr",
        "127.0.0.1:{port}",
        "--user-data-dir",
        _literal(data),
        "--extensions-dir",
        _literal(os.path.join(base, "extensions")),
        "--config",
        _literal(os.path.join(data, "config.yaml")),
        "--disable-telemetry",
        "--disable-update-check",
        _literal(home),
    ]


# -- launchers: what jupyter-server-proxy gets from the entry points --------------------------------------


def launcher(name: str) -> Launcher:
    for item in LAUNCHERS:
        if item.name == name:
            return item
    raise KeyError(name)


def unavailable_reason(item: Launcher, environ: Mapping[str, str]) -> str | None:
    """Why this launcher does not appear in the session, or None when it does."""
    ports, _ = parse_service_ports(environ.get(SERVICE_PORTS_ENV))
    if any(p["name"] == item.name for p in ports):
        return f"{item.title}: the session's image serves {item.name!r} itself (service port)"
    if find_program(item.program, environ) is None:
        return f"{item.title} is not installed in this session: {item.program!r} is not on PATH"
    return None


def icon_path(name: str) -> str:
    """The launcher's icon in JupyterLab's launcher (server_ext/icons/<name>.svg); empty: none."""
    path = Path(__file__).with_name("icons") / f"{name}.svg"
    return str(path) if path.is_file() else ""


def available_launchers(environ: Mapping[str, str]) -> list[Launcher]:
    return [item for item in LAUNCHERS if unavailable_reason(item, environ) is None]


def launcher_config(name: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """The jupyter-server-proxy server config of one launcher; AppUnavailable when it cannot run here."""
    item = launcher(name)
    reason = unavailable_reason(item, environ)
    if reason is not None:
        raise AppUnavailable(reason)
    program = find_program(item.program, environ)
    assert program is not None
    environ = dict(environ)  # the commands are built when the app starts, from this snapshot
    config: dict[str, Any] = {
        "timeout": START_TIMEOUT,
        "launcher_entry": {"title": item.title, "category": "Other", "icon_path": icon_path(item.name)},
        "new_browser_tab": True,
    }
    if name == "tensorboard":

        def tensorboard() -> list[str]:
            settings = load_settings(session_home(environ))
            return tensorboard_command(program, tensorboard_logdir(environ, settings))

        config.update(command=tensorboard, absolute_url=True)
    elif name == "mlflow":

        def mlflow() -> list[str]:
            home = session_home(environ)
            uri, artifacts = mlflow_store(environ, load_settings(home))
            os.makedirs(artifacts, exist_ok=True)
            return mlflow_command(program, uri, artifacts, mlflow_origins(environ))

        config.update(
            command=mlflow,
            absolute_url=True,
            # MLflow refuses a Host header it does not know (DNS rebinding guard); it is only reached
            # through the proxy on loopback, so the proxy names the loopback address it connects to.
            request_headers_override={"Host": "127.0.0.1:{port}"},
        )
    elif name == "vscode":

        def vscode() -> list[str]:
            return code_server_command(
                program, session_home(environ), environ.get("JUPYTERHUB_SERVER_NAME", "")
            )

        config.update(command=vscode, absolute_url=False)
    return config


# The entry points (pyproject.toml): called by jupyter-server-proxy when the server loads it.


def tensorboard() -> dict[str, Any]:
    return launcher_config("tensorboard", os.environ)


def vscode() -> dict[str, Any]:
    return launcher_config("vscode", os.environ)


def mlflow() -> dict[str, Any]:
    return launcher_config("mlflow", os.environ)


# -- image service ports -----------------------------------------------------------------------------------


def parse_service_ports(raw: str | None) -> tuple[list[dict[str, Any]], list[str]]:
    """``LABFLEET_SERVICE_PORTS`` (a JSON list of {"name", "protocol", "port"}) -> (valid ports, problems).

    A malformed entry is left out with a problem naming it; the others still count. Duplicate names keep
    the first."""
    if not raw or not raw.strip():
        return [], []
    try:
        items = json.loads(raw)
    except ValueError as e:
        return [], [f"{SERVICE_PORTS_ENV} is not JSON ({e}): no service ports"]
    if not isinstance(items, list):
        return [], [f"{SERVICE_PORTS_ENV} must be a JSON list: no service ports"]
    out: list[dict[str, Any]] = []
    problems: list[str] = []
    seen: set[str] = set()
    for item in items:
        shown = json.dumps(item)[:80]
        if not isinstance(item, Mapping):
            problems.append(f"service port {shown} is not an object: skipped")
            continue
        name, protocol, port = item.get("name"), item.get("protocol"), item.get("port")
        if not isinstance(name, str) or not _NAME.match(name):
            problems.append(f"service port {shown}: name must be a letter then letters, digits, - or _")
            continue
        if protocol not in SERVICE_PROTOCOLS:
            problems.append(f"service port {name}: protocol must be one of {', '.join(SERVICE_PROTOCOLS)}")
            continue
        if isinstance(port, bool) or not isinstance(port, int) or not PORT_RANGE[0] <= port <= PORT_RANGE[1]:
            problems.append(
                f"service port {name}: port must be a number from {PORT_RANGE[0]} to {PORT_RANGE[1]}"
            )
            continue
        if name in seen:
            problems.append(f"service port {name}: declared twice, the first one is kept")
            continue
        seen.add(name)
        out.append({"name": name, "protocol": protocol, "port": port})
    return out, problems


def image_servers(
    raw: str | None, configured: Iterable[str] = ()
) -> tuple[dict[str, dict[str, Any]], list[App], list[str]]:
    """The image's service ports as jupyter-server-proxy servers: (servers, their apps, problems).

    ``configured``: server names the user configured (``c.ServerProxy.servers``), which stay the user's."""
    ports, problems = parse_service_ports(raw)
    taken = set(configured)
    servers: dict[str, dict[str, Any]] = {}
    apps: list[App] = []
    for p in ports:
        name, protocol = p["name"], p["protocol"]
        if name.lower() in RESERVED_NAMES:
            problems.append(f"service port {name}: the Jupyter server uses /{name}/ itself: skipped")
            continue
        if name in taken:
            problems.append(f"service port {name}: c.ServerProxy.servers configures {name!r}: kept that one")
            continue
        server: dict[str, Any] = {
            # Already served by the image: nothing to start, only to proxy.
            "command": [],
            "port": p["port"],
            "absolute_url": False,
            "new_browser_tab": True,
            "launcher_entry": {"title": name, "category": "Other"},
        }
        if protocol == "tcp":
            # A browser cannot open raw TCP: a websocket carries the stream (e.g. for websockify clients).
            server["raw_socket_proxy"] = True
            server["launcher_entry"] = {"enabled": False, "title": name}
        servers[name] = server
        apps.append(App(name=name, title=name, source="image", protocol=protocol))
    return servers, apps, problems


def session_apps(environ: Mapping[str, str], configured: Iterable[str] = ()) -> tuple[list[App], dict, list]:
    """Everything this session offers: (apps, the image's jupyter-server-proxy servers, problems)."""
    servers, image_apps, problems = image_servers(environ.get(SERVICE_PORTS_ENV), configured)
    apps = [App(name=item.name, title=item.title, source="launcher") for item in available_launchers(environ)]
    return apps + image_apps, servers, problems
