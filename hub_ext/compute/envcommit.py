"""Save as environment on a Docker engine: a running session's container committed into an image of
the user's (:func:`labfleet.compute.environments.create_from_session` records the request; the build
queue, :mod:`labfleet.compute.envqueue`, calls :func:`commit_session` in its thread).

* The container is the one the spawner labelled with the session's id, on this node's engine.
* The image takes the base image's settings (environment, command, entry point, user, working
  folder, ports, labels), not the container's: the container's environment holds the session's
  token and other secrets of that session alone (:func:`image_settings`). Only its files are the
  session's.
* What was installed is recorded as a recipe (``requirements.txt``, ``apt.txt``), so that it can be
  rebuilt on a new base: the session's ``pip freeze`` and ``apt-mark showmanual`` less the base
  image's, through :func:`labfleet.compute.recipes.pip_packages_recipe`'s checks (the session's
  words are untrusted: what does not pass is dropped). They run as the session's user, never as
  root, in the session's container (its limits); the base's lists in a container with no network.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from labfleet.compute.envbuild import BuildFailed, low_level_api
from labfleet.compute.recipes import LABEL_BASE, pip_packages_recipe
from labfleet.core.hubmap import SESSION_ID_LABEL

# The image's settings a commit takes from the base image (Docker's container config keys).
BASE_SETTINGS = ("Env", "Cmd", "Entrypoint", "User", "WorkingDir", "ExposedPorts", "Labels", "StopSignal")
# Its label: the session it was saved from.
LABEL_SOURCE_SESSION = "ai.labfleet.source-session"
# A session's report of its packages is cut at this size.
MAX_REPORT_BYTES = 1 << 20
# Who lists the session's packages when its container runs as root (the spawner's session uid).
SESSION_USER = "1000:1000"
PIP_FREEZE = ["sh", "-c", "python3 -m pip freeze 2>/dev/null || pip freeze 2>/dev/null || true"]
APT_MANUAL = ["sh", "-c", "apt-mark showmanual 2>/dev/null || true"]


@dataclass(frozen=True)
class Committed:
    image_id: str
    size: int  # bytes, with its base
    recorded: dict[str, str]  # the recipe: what was installed in the session beyond its base


def _not_root(user: str) -> str:
    return SESSION_USER if user.split(":")[0] in ("", "0", "root") else user


def session_container(client: Any, session_id: str) -> dict[str, Any] | None:
    """The running container of session ``session_id`` on this engine, or None."""
    found = low_level_api(client).containers(filters={"label": f"{SESSION_ID_LABEL}={session_id}"})
    return found[0] if len(found) == 1 else None


def _exec_output(api: Any, container: str, argv: list[str], user: str) -> str:
    run = api.exec_create(container, argv, user=user, stdout=True, stderr=False)
    out = bytearray()
    for chunk in api.exec_start(run["Id"], stream=True):
        out += chunk
        if len(out) > MAX_REPORT_BYTES:
            break
    return bytes(out[:MAX_REPORT_BYTES]).decode(errors="replace")


def _base_lists(api: Any, base: str, user: str) -> tuple[str, str]:
    """The base image's ``pip freeze`` and ``apt-mark showmanual``, run with no network."""
    script = f"{PIP_FREEZE[2]}; echo '--- apt'; {APT_MANUAL[2]}"
    host_config = api.create_host_config(network_mode="none", auto_remove=False)
    created = api.create_container(base, ["sh", "-c", script], user=user, host_config=host_config)
    try:
        api.start(created["Id"])
        api.wait(created["Id"], timeout=120)
        text = api.logs(created["Id"], stdout=True, stderr=False)[:MAX_REPORT_BYTES].decode(errors="replace")
    finally:
        api.remove_container(created["Id"], force=True)
    pip, _, apt = text.partition("--- apt")
    return pip, apt


def _minus(session: str, base: str) -> str:
    had = {line.strip() for line in base.splitlines()}
    return "\n".join(line for line in session.splitlines() if line.strip() not in had)


def image_settings(
    base_config: Mapping[str, Any], container_config: Mapping[str, Any], session_id: str, base: str
) -> dict[str, Any]:
    """The settings of a session's image (pure): the base's. The engine merges what the commit does
    not set from the container (its environment variables and labels too, one by one), so each of
    the container's own variables and labels is set here, emptied: its value (the session's token)
    never reaches the image."""
    conf = {key: base_config.get(key) for key in BASE_SETTINGS if base_config.get(key) is not None}
    env = list(base_config.get("Env") or [])
    known = {e.partition("=")[0] for e in env}
    env += [f"{key}=" for e in container_config.get("Env") or [] if (key := e.partition("=")[0]) not in known]
    conf["Env"] = env
    labels = dict.fromkeys(container_config.get("Labels") or {}, "")
    conf["Labels"] = {
        **labels,
        **(base_config.get("Labels") or {}),
        LABEL_BASE: base,
        LABEL_SOURCE_SESSION: session_id,
    }
    return conf


def commit_session(
    client: Any, session_id: str, *, tag: str, base: str, log: Callable[[str], None]
) -> Committed:
    """Commit session ``session_id``'s container as ``tag`` (``repository:tag``) with ``base``'s
    settings; raises :class:`BuildFailed` when the session has no running container here."""
    api = low_level_api(client)
    found = session_container(client, session_id)
    if found is None:
        raise BuildFailed(
            f"session {session_id} has no running container on this node's Docker engine (Save as "
            "environment takes a running Docker or Swarm session)",
            None,
        )
    container = found["Id"]
    inspected = api.inspect_container(container)
    user = _not_root(str((inspected.get("Config") or {}).get("User") or ""))
    base_config: Mapping[str, Any] = api.inspect_image(base).get("Config") or {}
    log(f"labfleet: listing what was installed in the session (as user {user})")
    pip = _exec_output(api, container, PIP_FREEZE, user)
    apt = _exec_output(api, container, APT_MANUAL, user)
    base_pip, base_apt = _base_lists(api, base, _not_root(str(base_config.get("User") or "")))
    recorded = pip_packages_recipe(_minus(pip, base_pip), _minus(apt, base_apt))
    for name, text in recorded.items():
        log(f"labfleet: recorded {name}: {', '.join(text.split()) or 'nothing'}")
    conf = image_settings(base_config, inspected.get("Config") or {}, session_id, base)
    repository, _, name = tag.rpartition(":")
    log(f"labfleet: committing the session's container {container[:12]} as {tag}")
    image_id = api.commit(container, repository=repository, tag=name, conf=conf, pause=True)["Id"]
    size = int(api.inspect_image(image_id).get("Size") or 0)
    return Committed(image_id, size, recorded)
