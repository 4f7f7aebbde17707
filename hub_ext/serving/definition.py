"""Backend.AI's ``model-definition.yaml``, the subset labfleet serves, parsed and checked; and the
command line a replica runs. Pure: text in, values out.

The subset::

    models:
      - name: my-model                  # optional here
        model_path: /models             # optional; replicas run in the mounted model folder
        service:
          pre_start_actions:            # optional: mkdir, write_file, run_command, log
            - action: mkdir
              args: {path: cache}
          start_command: [python3, -m, http.server, "8000"]   # a list, or one shell string
          port: 8000                    # required
          health_check:                 # optional; Backend.AI's defaults below
            path: /health
            interval: 10.0
            max_retries: 10
            max_wait_time: 15.0
            expected_status_code: 200
            initial_delay: 60.0

A replica's command listens on its session's loopback, ``$HOST`` (127.0.0.1), at ``$PORT``, a port the
session's runner picks; the runner's authenticating front (:mod:`labfleet.session.front`) listens on the
replica's own port (where the router calls it) and passes on only the calls that carry the replica's
credential. A list ``start_command`` whose argument is exactly the definition's ``port`` gets ``$PORT``
there instead, so Backend.AI definitions that name their port run unchanged; ``{port}`` in a command
is replaced too.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

from labfleet.core.errors import InvalidInput
from labfleet.core.vocab import PORT_RANGE

DEFINITION_FILES = ("model-definition.yaml", "model-definition.yml")
MAX_DEFINITION_BYTES = 256 * 1024
MAX_COMMAND = 6000  # the session's command (8192) holds the exports and the pre-start actions too
PRE_START_ACTIONS = ("mkdir", "write_file", "run_command", "log")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


@dataclass(frozen=True)
class HealthCheck:
    """Backend.AI's health check: GET ``path`` every ``interval`` s once ``initial_delay`` s have passed,
    each waiting at most ``max_wait_time`` s for ``expected_status_code``; more than ``max_retries``
    failures in a row make the replica unhealthy."""

    path: str = "/"
    interval: float = 10.0
    max_retries: int = 10
    max_wait_time: float = 15.0
    expected_status_code: int = 200
    initial_delay: float = 60.0


@dataclass(frozen=True)
class ModelService:
    name: str
    start_command: tuple[str, ...] | str
    port: int
    model_path: str = ""
    health_check: HealthCheck | None = None
    pre_start_actions: tuple[dict[str, Any], ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["start_command"] = (
            list(self.start_command) if isinstance(self.start_command, tuple) else self.start_command
        )
        out["pre_start_actions"] = [dict(a) for a in self.pre_start_actions]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelService:
        cmd = data["start_command"]
        hc = data.get("health_check")
        return cls(
            name=data.get("name", ""),
            start_command=tuple(cmd) if isinstance(cmd, list) else cmd,
            port=int(data["port"]),
            model_path=data.get("model_path", ""),
            health_check=HealthCheck(**hc) if hc else None,
            pre_start_actions=tuple(data.get("pre_start_actions") or ()),
        )


def _bad(message: str) -> InvalidInput:
    return InvalidInput(f"model-definition.yaml: {message}")


def _number(value: Any, where: str, *, minimum: float, maximum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"{where} must be a number of seconds")
    if not minimum <= value <= maximum:
        raise _bad(f"{where} must be from {minimum:g} to {maximum:g} (got {value})")
    return float(value)


def _whole(value: Any, where: str, *, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{where} must be a whole number")
    if not minimum <= value <= maximum:
        raise _bad(f"{where} must be from {minimum} to {maximum} (got {value})")
    return value


def _health_check(raw: Any) -> HealthCheck | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise _bad("health_check must be a mapping (path, interval, max_retries, ...)")
    known = {"path", "interval", "max_retries", "max_wait_time", "expected_status_code", "initial_delay"}
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        raise _bad(f"unknown health_check field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    d = HealthCheck()
    path = raw.get("path", d.path)
    if (
        not isinstance(path, str)
        or not path.startswith("/")
        or len(path) > 1000
        or any(c in path for c in "\r\n\x00 ")
    ):
        raise _bad(f"health_check.path must be a URL path starting with '/' (got {str(path)[:60]!r})")
    return HealthCheck(
        path=path,
        interval=_number(raw.get("interval", d.interval), "health_check.interval", minimum=0.1, maximum=3600),
        max_retries=_whole(
            raw.get("max_retries", d.max_retries), "health_check.max_retries", minimum=0, maximum=1000
        ),
        max_wait_time=_number(
            raw.get("max_wait_time", d.max_wait_time), "health_check.max_wait_time", minimum=0.1, maximum=600
        ),
        expected_status_code=_whole(
            raw.get("expected_status_code", d.expected_status_code),
            "health_check.expected_status_code",
            minimum=100,
            maximum=599,
        ),
        initial_delay=_number(
            raw.get("initial_delay", d.initial_delay), "health_check.initial_delay", minimum=0, maximum=86400
        ),
    )


def _text(value: Any, where: str, max_len: int = 10_000) -> str:
    if not isinstance(value, str):
        raise _bad(f"{where} must be a string")
    if "\x00" in value or len(value) > max_len:
        raise _bad(f"{where} must be at most {max_len} characters, without NUL")
    return value


def _action(raw: Any, i: int) -> dict[str, Any]:
    where = f"pre_start_actions[{i}]"
    if not isinstance(raw, Mapping) or not isinstance(raw.get("action"), str):
        raise _bad(f"{where} must be a mapping with an action ({', '.join(PRE_START_ACTIONS)})")
    action = raw["action"]
    if action not in PRE_START_ACTIONS:
        raise _bad(
            f"{where}: action {action[:40]!r} is not one labfleet runs ({', '.join(PRE_START_ACTIONS)})"
        )
    args = raw.get("args") or {}
    if not isinstance(args, Mapping):
        raise _bad(f"{where}.args must be a mapping")
    if action == "mkdir":
        return {"action": action, "args": {"path": _text(args.get("path"), f"{where}.args.path", 1000)}}
    if action == "write_file":
        mode = args.get("mode", "644")
        if not isinstance(mode, (str, int)) or not re.fullmatch(r"[0-7]{3,4}", str(mode)):
            raise _bad(f"{where}.args.mode must be an octal mode like 644")
        return {
            "action": action,
            "args": {
                "filename": _text(args.get("filename"), f"{where}.args.filename", 1000),
                "body": _text(args.get("body", ""), f"{where}.args.body"),
                "mode": str(mode),
                "append": bool(args.get("append", False)),
            },
        }
    if action == "run_command":
        cmd = args.get("command")
        if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) for c in cmd):
            raise _bad(f"{where}.args.command must be a list of strings")
        return {"action": action, "args": {"command": [_text(c, f"{where}.args.command") for c in cmd]}}
    return {"action": action, "args": {"message": _text(args.get("message", ""), f"{where}.args.message")}}


def parse_definition(text: str | bytes) -> ModelService:
    """The first model of a ``model-definition.yaml``; InvalidInput (400) saying what is wrong."""
    if isinstance(text, bytes):
        if len(text) > MAX_DEFINITION_BYTES:
            raise _bad(f"larger than {MAX_DEFINITION_BYTES} bytes")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad("not UTF-8 text") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "it does not parse"
        raise _bad(f"not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise _bad("nested too deeply") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("models"), list) or not doc["models"]:
        raise _bad("needs a list `models` with at least one model")
    model = doc["models"][0]
    if not isinstance(model, Mapping):
        raise _bad("models[0] must be a mapping (name, model_path, service)")
    name = model.get("name", "")
    name = _text(name if name is not None else "", "models[0].name", 255)
    model_path = model.get("model_path", "") or ""
    model_path = _text(model_path, "models[0].model_path", 1000)
    service = model.get("service")
    if not isinstance(service, Mapping):
        raise _bad("models[0].service is missing: it holds start_command and port")
    cmd = service.get("start_command")
    start: tuple[str, ...] | str
    if isinstance(cmd, str) and cmd.strip():
        start = _text(cmd.strip(), "start_command", MAX_COMMAND)
    elif (
        isinstance(cmd, list)
        and cmd
        and all(isinstance(c, (str, int, float)) and not isinstance(c, bool) for c in cmd)
    ):
        start = tuple(_text(str(c), "start_command", MAX_COMMAND) for c in cmd)
        if not start[0].strip():
            raise _bad("start_command's first item (the program) is empty")
    else:
        raise _bad("models[0].service.start_command is missing: give the command as a list or a string")
    if "port" not in service or service["port"] is None:
        raise _bad("models[0].service.port is missing: the port the start command listens on")
    port = service["port"]
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    port = _whole(port, "models[0].service.port", minimum=PORT_RANGE[0], maximum=PORT_RANGE[1])
    actions = service.get("pre_start_actions") or []
    if not isinstance(actions, list):
        raise _bad("pre_start_actions must be a list")
    parsed = ModelService(
        name=name,
        start_command=start,
        port=port,
        model_path=model_path,
        health_check=_health_check(service.get("health_check")),
        pre_start_actions=tuple(_action(a, i) for i, a in enumerate(actions)),
    )
    if len(command_line(parsed, port=port)) > MAX_COMMAND:
        raise _bad(f"the start command and pre-start actions are longer than {MAX_COMMAND} characters")
    return parsed


def check_env(value: Any) -> dict[str, str]:
    """An endpoint's extra environment: names to strings."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or len(value) > 100:
        raise InvalidInput("env must be an object of at most 100 NAME: value pairs")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise InvalidInput(f"env name {str(k)[:40]!r} is not a variable name (letters, digits, '_')")
        if k in ("PORT", "HOST") or k.startswith("LABFLEET_"):
            raise InvalidInput(f"env {k} is set by labfleet")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise InvalidInput(f"env {k} must be a string")
        v = str(v)
        if "\x00" in v or len(v) > 4096:
            raise InvalidInput(f"env {k} must be at most 4096 characters, without NUL")
        out[k] = v
    return out


# In a replica's command, where the session's runner puts the port the command listens on.
PORT_PLACEHOLDER = "{port}"


def command_line(service: ModelService, *, port: int | str) -> str:
    """The start command as one shell line, with ``port`` where the definition named its own (the
    replica's port, or :data:`PORT_PLACEHOLDER` for the session's runner to fill in)."""
    value = str(port)
    if isinstance(service.start_command, str):
        return service.start_command.replace("{port}", value)
    args = [value if a == str(service.port) else a.replace("{port}", value) for a in service.start_command]
    # The placeholder stands alone unquoted: the runner replaces it with digits.
    return " ".join(a if a == PORT_PLACEHOLDER else shlex.quote(a) for a in args)


def _action_line(action: Mapping[str, Any]) -> str:
    kind, args = action["action"], action["args"]
    if kind == "mkdir":
        return f"mkdir -p -- {shlex.quote(args['path'])}"
    if kind == "write_file":
        redirect = ">>" if args["append"] else ">"
        name = shlex.quote(args["filename"])
        return f"printf '%s' {shlex.quote(args['body'])} {redirect} {name} && chmod {args['mode']} {name}"
    if kind == "run_command":
        return shlex.join(args["command"])
    return f"echo {shlex.quote('[model] ' + args['message'])}"


# Where a replica's command listens: the session's loopback, behind its runner's front. The front
# listens where the router reaches the replica (every address of the session, or what the spawner
# says in $LABFLEET_INFERENCE_HOST); the command never does.
HOST_LINE = "HOST=127.0.0.1"


def replica_command(service: ModelService, *, folder: str, env: Mapping[str, str] | None = None) -> str:
    """What a replica's inference session runs: ``$HOST`` set (the runner sets ``$PORT`` and puts it
    where the command had its port), the endpoint's env, then in the mounted model folder the pre-start
    actions (any failing stops the replica) and the command."""
    lines = ["set -e", f"export {HOST_LINE}"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted((env or {}).items())]
    lines.append(f'cd "${{LABFLEET_VFOLDER_DIR:-$HOME/vfolders}}"/{shlex.quote(folder)}')
    lines += [_action_line(a) for a in service.pre_start_actions]
    lines.append(
        "exec " + command_line(service, port=PORT_PLACEHOLDER)
        if not isinstance(service.start_command, str)
        else command_line(service, port=PORT_PLACEHOLDER)
    )
    return "\n".join(lines)
