"""Spawn options: the untrusted ``user_options`` from the form or the Hub REST API.

:func:`parse_options` checks every key, type and range and returns a :class:`SessionOptions`,
or raises :class:`OptionsError` with a message for a person.  What only the labfleet service
knows (is this the user's project? may the project use this image? is the quota enough?) is
checked there, at admission.  Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, TypeGuard

from labfleet.core.slots import parse_bytes
from labfleet.core.vocab import COMMAND_PORT_RANGE, COMMAND_SESSION_TYPES, SESSION_TYPES

OPTION_KEYS = (
    "project",
    "image",
    "resource_group",
    "cpu",
    "mem",
    "gpu",
    "vfolders",
    "type",
    "command",
    "port",
)

# Bounds that no node reaches: anything past them is a typo, not a request.
MAX_CPU = Decimal(1024)
MAX_MEM = 64 * 2**40
MAX_GPU = Decimal(64)
MAX_COMMAND = 8192
MAX_VFOLDERS = 64
# An inference command's port where sessions share the node's network (model serving picks one per
# replica): never a privileged port.
GPU_QUANTUM = Decimal("0.01")
CPU_QUANTUM = Decimal("0.001")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# A virtual folder's name (a leading "." is allowed: such folders are mounted automatically), or its id.
_VFOLDER = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_PROJECT = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,63}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$")


class OptionsError(ValueError):
    """A spawn option is wrong; the message says which and why."""


@dataclass(frozen=True)
class SessionOptions:
    project: str
    image: str | None = None
    resource_group: str | None = None
    cpu: Decimal | None = None
    mem: int | None = None
    gpu: Decimal = Decimal(0)  # whole devices when integral, else a fraction of one device
    vfolders: tuple[str, ...] = ()
    type: str = "interactive"
    command: str = ""
    port: int | None = None  # inference only: the port its command listens on (else one picked at start)

    def slots(self) -> dict[str, Any]:
        """The session's slots as the service's admission API takes them."""
        out: dict[str, Any] = {}
        if self.cpu is not None:
            out["cpu"] = str(self.cpu)
        if self.mem is not None:
            out["mem"] = self.mem
        if self.gpu:
            if self.gpu == self.gpu.to_integral_value():
                out["gpu"] = int(self.gpu)
            else:
                out["gpu.shares"] = str(self.gpu)
        return out

    def to_json(self) -> dict[str, Any]:
        """Back to plain user_options (kept in the Hub's DB between restarts)."""
        out: dict[str, Any] = {"project": self.project, "type": self.type}
        if self.image is not None:
            out["image"] = self.image
        if self.resource_group is not None:
            out["resource_group"] = self.resource_group
        if self.cpu is not None:
            out["cpu"] = str(self.cpu)
        if self.mem is not None:
            out["mem"] = self.mem
        if self.gpu:
            out["gpu"] = str(self.gpu)
        if self.vfolders:
            out["vfolders"] = list(self.vfolders)
        if self.command:
            out["command"] = self.command
        if self.port is not None:
            out["port"] = self.port
        return out


def parse_port(value: Any) -> int:
    """An inference command's port: an integer in COMMAND_PORT_RANGE (digits in a string too)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionsError(f"port must be a whole number, not {str(value)[:40]!r}")
    low, high = COMMAND_PORT_RANGE
    if not low <= value <= high:
        raise OptionsError(f"port must be from {low} to {high}, not {value}")
    return value


def _number(value: Any, key: str, *, maximum: Decimal, quantum: Decimal) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise OptionsError(f"{key} must be a number, not {type(value).__name__}")
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise OptionsError(f"{key} must be a number, not {str(value)[:40]!r}") from None
    if not amount.is_finite():
        raise OptionsError(f"{key} must be a finite number")
    if amount < 0:
        raise OptionsError(f"{key} cannot be negative ({value})")
    if amount > maximum:
        raise OptionsError(f"{key}={value} is more than any node has (at most {maximum})")
    if amount != amount.quantize(quantum):
        raise OptionsError(f"{key} takes steps of {quantum}, not {value}")
    return amount.quantize(quantum).normalize()


def parse_mem(value: Any) -> int:
    """Bytes from ``8g``, ``512m``, ``1.5GiB`` or a plain number of bytes."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise OptionsError(f"mem must be a size like 8g or 512m, not {type(value).__name__}")
    amount = parse_bytes(value)
    if amount is None:
        raise OptionsError(f"mem must be a size like 8g or 512m, not {str(value)[:40]!r}")
    if amount <= 0:
        raise OptionsError("mem must be more than 0")
    if amount > MAX_MEM:
        raise OptionsError(f"mem={value} is more than any node has")
    return amount


def _name(value: Any, key: str, pattern: re.Pattern[str] = _NAME) -> str:
    if not isinstance(value, str):
        raise OptionsError(f"{key} must be a name, not {type(value).__name__}")
    value = value.strip()
    if not pattern.match(value):
        raise OptionsError(f"{key} {value[:70]!r} is not a valid name")
    return value


def is_vfolder_name(value: Any) -> TypeGuard[str]:
    """A folder name that is safe as one path component under ~/vfolders/."""
    return isinstance(value, str) and bool(_VFOLDER.match(value)) and value not in (".", "..")


def is_vfolder_id(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and bool(_UUID.match(value))


def _vfolder(value: Any) -> str:
    if not isinstance(value, str):
        raise OptionsError(f"vfolder must be a name or id, not {type(value).__name__}")
    value = value.strip()
    if not (is_vfolder_name(value) or is_vfolder_id(value)):
        raise OptionsError(
            f"vfolder {value[:70]!r} is not a folder name (up to 64 letters, digits, '.', '_' or '-';"
            " not '.' or '..') nor a folder id"
        )
    return value


def _vfolders(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v for v in re.split(r"[,\s]+", value) if v]
    if not isinstance(value, (list, tuple)):
        raise OptionsError("vfolders must be a list of folder names or ids")
    if len(value) > MAX_VFOLDERS:
        raise OptionsError(f"at most {MAX_VFOLDERS} vfolders per session, not {len(value)}")
    names = tuple(_vfolder(v) for v in value)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise OptionsError(f"vfolder {twice[0]!r} is named twice")
    return names


def parse_options(raw: Any) -> SessionOptions:
    """Check untrusted user_options; blank values count as not given (forms send them)."""
    if not isinstance(raw, Mapping):
        raise OptionsError("user options must be a JSON object")
    unknown = sorted(str(k) for k in raw if k not in OPTION_KEYS)
    if unknown:
        raise OptionsError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(OPTION_KEYS)}")
    opts = {k: v for k, v in raw.items() if not (v is None or (isinstance(v, str) and not v.strip()))}
    if "project" not in opts:
        raise OptionsError("choose a project")
    project = _name(opts["project"], "project", _PROJECT)
    stype = opts.get("type", "interactive")
    if stype not in SESSION_TYPES:
        raise OptionsError(f"type must be one of {', '.join(SESSION_TYPES)}, not {str(stype)[:40]!r}")
    command = opts.get("command", "")
    if not isinstance(command, str):
        raise OptionsError("command must be a string")
    command = command.strip()
    if len(command) > MAX_COMMAND:
        raise OptionsError(f"command is longer than {MAX_COMMAND} characters")
    if "\x00" in command:
        raise OptionsError("command contains a NUL character")
    if stype in COMMAND_SESSION_TYPES and not command:
        raise OptionsError(f"a {stype} session needs a command")
    if stype == "interactive" and command:
        raise OptionsError("an interactive session takes no command (choose type batch or inference)")
    port = parse_port(opts["port"]) if "port" in opts else None
    if port is not None and stype != "inference":
        raise OptionsError("port is for inference sessions only (the port their command listens on)")
    cpu = _number(opts["cpu"], "cpu", maximum=MAX_CPU, quantum=CPU_QUANTUM) if "cpu" in opts else None
    if cpu is not None and cpu == 0:
        raise OptionsError("cpu must be more than 0")
    gpu = _number(opts.get("gpu", 0), "gpu", maximum=MAX_GPU, quantum=GPU_QUANTUM)
    return SessionOptions(
        project=project,
        image=_name(opts["image"], "image", _IMAGE) if "image" in opts else None,
        resource_group=_name(opts["resource_group"], "resource_group") if "resource_group" in opts else None,
        cpu=cpu,
        mem=parse_mem(opts["mem"]) if "mem" in opts else None,
        gpu=gpu,
        vfolders=_vfolders(opts.get("vfolders", [])),
        type=stype,
        command=command,
        port=port,
    )


def options_from_form(formdata: Mapping[str, list[str]]) -> dict[str, Any]:
    """The spawn form's fields (lists of strings) as user_options; parse_options checks them."""
    out: dict[str, Any] = {}
    for key, values in formdata.items():
        if key.startswith("_"):
            continue  # the Hub's own fields (_xsrf), not options
        if key == "vfolders":
            out["vfolders"] = [v for v in values if v.strip()]
        elif values:
            out[key] = values[0]
    return out
