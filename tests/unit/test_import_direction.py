"""Imports inside labfleet (the folder hub_ext/) run one way (../shared/DESIGN.md, "The house").

    core  <-  tenancy  <-  storage  <-  compute  <-  usage  <-  reclaim  <-  serving  <-  service, agent  <-  cli

A context imports only from contexts below it (and from itself); ``hub/`` (the Hub process)
imports only the pure parts of ``core``, never SQLAlchemy or the DB layer. Read from the source
(an AST walk), so an import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HUB_EXT = Path(__file__).resolve().parents[2] / "hub_ext"  # installed as the package `labfleet`
PACKAGE = "labfleet"

# A context's rank: it may import contexts of a lower or equal rank only.
RANKS = {
    "core": 0,
    "tenancy": 1,
    "storage": 2,
    "compute": 3,
    "usage": 4,
    "reclaim": 5,
    "serving": 6,  # model serving: endpoints of inference sessions (compute) behind one URL
    "service": 7,
    "agent": 7,  # the node agent: a process of its own, on top like the service
    "cli": 8,  # the `labfleet` command, which starts the agent too (`labfleet agent`)
}
# What the Hub process may import of labfleet: modules that touch neither SQLAlchemy nor the DB.
HUB_MAY_IMPORT = {
    "labfleet.hub",
    "labfleet.core.dburl",
    "labfleet.core.envtraits",
    "labfleet.core.display",
    "labfleet.core.errors",
    "labfleet.core.hubmap",
    "labfleet.core.http",
    "labfleet.core.rights",
    "labfleet.core.secretbox",
    "labfleet.core.sessionlogs",
    "labfleet.core.signing",
    "labfleet.core.slots",
    "labfleet.core.validate",
    "labfleet.core.vocab",
}
DB_PACKAGES = ("sqlalchemy", "alembic")


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in the file, relative ones resolved."""
    rel = path.relative_to(HUB_EXT).with_suffix("")
    package = [PACKAGE, *rel.parts[:-1]]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.count(".") < 2:  # `from labfleet.core import db` imports labfleet.core.database
                out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, mod))
    return out


# labfleet's subpackages from the other folders (spawner/, server_ext/, widgets/, admin_dashboards/):
# outside the house, as they were before they became subpackages of labfleet.
OUTSIDE = {"spawner", "session", "widgets", "console"}


def in_house(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == PACKAGE and (len(parts) == 1 or parts[1] not in OUTSIDE)


def context_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and in_house(module) else None


def sources() -> list[Path]:
    return sorted(p for p in HUB_EXT.rglob("*.py") if "migrations" not in p.parts)


def violations(path: Path) -> list[str]:
    ctx = context_of(".".join([PACKAGE, *path.relative_to(HUB_EXT).with_suffix("").parts]))
    found = []
    for line, mod in imports_of(path):
        where = f"{path.relative_to(HUB_EXT.parent)}:{line} imports {mod}"
        if ctx == "hub":
            if mod.split(".")[0] in DB_PACKAGES:
                found.append(f"{where}: the Hub process never touches the DB")
            elif in_house(mod) and not any(mod == ok or mod.startswith(ok + ".") for ok in HUB_MAY_IMPORT):
                found.append(f"{where}: hub/ may import only {sorted(HUB_MAY_IMPORT)}")
            continue
        target = context_of(mod)
        if target is None or ctx is None or target == ctx:
            continue
        if target == "hub":
            found.append(f"{where}: only the Hub process imports hub/")
        elif target not in RANKS or ctx not in RANKS:
            found.append(f"{where}: {ctx!r} or {target!r} is not a known context")
        elif RANKS[target] > RANKS[ctx]:
            found.append(f"{where}: {ctx} sits below {target}")
        elif RANKS[target] == RANKS[ctx]:
            found.append(f"{where}: {ctx} and {target} are siblings")
    return found


def test_every_context_is_known():
    packages = {p.name for p in HUB_EXT.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(RANKS) | {"hub"}, "a new context needs a rank in RANKS and in DESIGN.md"


def test_imports_run_one_way():
    problems = [v for p in sources() for v in violations(p)]
    assert problems == []


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from labfleet.compute import sessions\n", "tenancy sits below compute"),
        ("from ..storage.hosts import RIGHTS\n", "tenancy sits below storage"),
        ("from labfleet.hub.client import service_call\n", "only the Hub process imports hub/"),
    ],
)
def test_a_wrong_way_import_is_caught(tmp_path, monkeypatch, source, expected):
    # The checker itself: a module of tenancy/ that imports upward is reported.
    fake = tmp_path / "hub_ext"
    (fake / "tenancy").mkdir(parents=True)
    bad = fake / "tenancy" / "bad.py"
    bad.write_text(source)
    monkeypatch.setitem(globals(), "HUB_EXT", fake)
    assert any(expected in v for v in violations(bad))


@pytest.mark.parametrize(
    "source",
    ["import sqlalchemy\n", "from labfleet.core import db\n", "from labfleet.core.models import User\n"],
)
def test_the_hub_process_may_not_reach_the_db(tmp_path, monkeypatch, source):
    fake = tmp_path / "hub_ext"
    (fake / "hub").mkdir(parents=True)
    bad = fake / "hub" / "bad.py"
    bad.write_text(source)
    monkeypatch.setitem(globals(), "HUB_EXT", fake)
    assert violations(bad), source


# The service's transport (its base handler: authentication, bodies, pages, run()) knows who is
# calling (tenancy) and nothing of what the calls do: the service's own after-commit hooks serve
# the queues, count their waits and tell the Hub (LabfleetService.after_commit).
TRANSPORT = HUB_EXT / "service" / "base.py"
TRANSPORT_MAY_IMPORT = {"core", "tenancy"}


def test_the_service_transport_imports_no_context_but_who_calls():
    contexts = {context_of(mod) for _, mod in imports_of(TRANSPORT)} - {None}
    assert contexts <= TRANSPORT_MAY_IMPORT, sorted(contexts - TRANSPORT_MAY_IMPORT)
