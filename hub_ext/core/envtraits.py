"""Options that fall back on environment variables, declared on the trait itself.

``Float(5.0, help=...).tag(config=True, env="LABFLEET_SCHEDULE_INTERVAL")``: one loader,
:func:`load_env_fallbacks`, reads every such variable for an app once its config file and command
line are in.  An option set there wins; else the first of the trait's variables that is set and not
empty gives its value, read by the trait's type (a number, true/false, a comma-separated list, or
JSON for a list of objects or an object); else the trait's default.  A variable that cannot be read
is an :class:`EnvError` that names it.  :func:`document_env` writes each option's variables into
its help, so ``--help-all`` lists them.

Pure: the standard library and traitlets only (the Hub imports it too).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from traitlets import Bool, Dict, Float, HasTraits, Integer, List, TraitError, TraitType


class EnvError(ValueError):
    """An environment variable an option falls back on holds what the option cannot take."""


def env_names(trait: TraitType) -> tuple[str, ...]:
    """The variables a trait falls back on, first wins (``env`` metadata: a name or a tuple)."""
    names = trait.metadata.get("env") or ()
    return (names,) if isinstance(names, str) else tuple(names)


def parse_env(trait: TraitType, name: str, raw: str) -> Any:
    """``raw``, the value of ``$name``, as ``trait`` takes it; EnvError when it cannot be read."""
    read, wanted = _reader(trait)
    try:
        return read(raw)
    except (ValueError, KeyError):
        raise EnvError(f"${name}={raw[:80]!r}: {wanted}") from None


def _first_set(trait: TraitType) -> tuple[str, str] | None:
    """(name, value) of the first of ``trait``'s variables that is set and not empty."""
    for name in env_names(trait):
        raw = os.environ.get(name)
        if raw:
            return name, raw
    return None


def load_env_fallbacks(app: HasTraits, configured: Mapping[str, Any]) -> list[str]:
    """Give every option of ``app`` not in ``configured`` (the app's own section of its config) the
    value of its environment variable, where one is set; the names of the options it set."""
    done = []
    for option, trait in sorted(app.traits(config=True).items()):
        found = None if option in configured else _first_set(trait)
        if found is None:
            continue
        name, raw = found
        value = parse_env(trait, name, raw)
        try:
            setattr(app, option, value)
        except TraitError as e:
            raise EnvError(f"${name}={raw[:80]!r}: {e}") from None
        done.append(option)
    return done


def env_value(obj: HasTraits, option: str) -> Any | None:
    """The value of the first of ``option``'s variables that is set, read by its trait, else None:
    for a trait's ``@default`` in an object no app loads (the Hub makes the spawners)."""
    trait = obj.traits()[option]
    found = _first_set(trait)
    return parse_env(trait, *found) if found is not None else None


def document_env(cls: type[HasTraits]) -> type[HasTraits]:
    """Add to the help of each of ``cls``'s options that falls back on variables which they are;
    a class decorator (once per class)."""
    for trait in cls.class_traits(config=True).values():
        names = env_names(trait)
        if names and "Environment:" not in (trait.help or ""):
            trait.help = (
                (trait.help or "").rstrip() + "\n\nEnvironment: " + ", then ".join(f"${n}" for n in names)
            )
    return cls


_BOOLS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def _holds_objects(trait: List) -> bool:
    return isinstance(getattr(trait, "_trait", None), Dict)


def _reader(trait: TraitType) -> tuple[Callable[[str], Any], str]:
    """How a variable is read for ``trait``, and what a value that cannot be read is not."""
    if isinstance(trait, Dict) or (isinstance(trait, List) and _holds_objects(trait)):
        return json.loads, "not JSON"
    if isinstance(trait, List):
        return (lambda raw: [part.strip() for part in raw.split(",") if part.strip()]), "cannot be read"
    if isinstance(trait, Bool):
        return (lambda raw: _BOOLS[raw.strip().lower()]), "write true or false"
    if isinstance(trait, Integer):
        return int, "not a whole number"
    if isinstance(trait, Float):
        return float, "not a number"
    return (lambda raw: raw), "cannot be read"
