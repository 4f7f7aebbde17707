"""labfleet's unit of work (labfleet.core.unitofwork): every DB hook in one listed place, on
labfleet's own session class, and what the hooks keep, on a real SQLite database."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

import labfleet.service.app  # noqa: F401 (imports every context, so every hook a module could hang is hung)
from labfleet.core import allocversions, unitofwork, versions
from labfleet.core.bootstrap import ensure_default_group
from labfleet.core.models import Domain, Node, ResourceGroup
from tests.dbfixture import fresh_db

HUB_EXT = Path(__file__).resolve().parents[1] / "hub_ext"
EVENTS = ("before_flush", "after_flush", "after_commit", "after_soft_rollback", "after_transaction_end")


def _event_registrations(path: Path) -> list[tuple[int, str]]:
    """(line, first argument) of every ``event.listen(...)`` and ``@event.listens_for(...)``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("listen", "listens_for")
            and ast.unparse(node.func.value) in ("event", "sqlalchemy.event")
            and node.args
        ):
            found.append((node.lineno, ast.unparse(node.args[0])))
    return found


def test_the_only_session_hooks_are_the_listed_ones():
    # Elsewhere only the engine factory hangs hooks, and on the engine it makes (the connection pool).
    registered = {
        str(p.relative_to(HUB_EXT)): regs
        for p in sorted(HUB_EXT.rglob("*.py"))
        if (regs := _event_registrations(p))
    }
    assert set(registered) == {"core/unitofwork.py", "core/database.py"}
    assert {target for _, target in registered["core/database.py"]} == {"engine"}
    assert {target for _, target in registered["core/unitofwork.py"]} == {"LabfleetSession"}


def test_the_hooks_are_on_labfleets_session_class_and_not_on_sqlalchemys():
    for name in EVENTS:
        assert list(getattr(Session.dispatch, name)._clslevel.get(Session, [])) == [], name
    on_ours = {
        (name, fn)
        for name in EVENTS
        for fn in getattr(Session.dispatch, name)._clslevel[unitofwork.LabfleetSession]
    }
    assert on_ours == set(unitofwork.HOOKS)


def test_no_module_is_imported_for_its_side_effect():
    # An import nobody uses is either dead or wiring by side effect; a re-export says so.
    for path in HUB_EXT.rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "noqa" in line and "F401" in line:
                assert "(re-exported)" in line, f"{path.relative_to(HUB_EXT)}:{n}: {line.strip()}"


@pytest.fixture
def db_parts(tmp_path, monkeypatch):
    engine, factory = fresh_db(f"sqlite:///{tmp_path / 'lf.sqlite'}", tmp_path, monkeypatch)
    with factory.begin() as db:
        group_id = ensure_default_group(db).id
        db.add(Node(name="n1", resource_group_id=group_id, cpu="8", mem=2**34))
    yield engine, factory, group_id
    engine.dispose()


def _tenancy(engine) -> int:
    return versions.read_on(engine, versions.TENANCY)


def _alloc_version(factory, group_id: int) -> int:
    with factory() as db:
        return allocversions.version(db, group_id)


def test_a_labfleet_session_bumps_what_it_changes_and_a_plain_session_does_not(db_parts):
    engine, factory, group_id = db_parts
    before, alloc_before = _tenancy(engine), _alloc_version(factory, group_id)
    with Session(engine) as plain, plain.begin():  # SQLAlchemy's own class: no labfleet hook runs
        plain.add(Domain(name="plain"))
        plain.scalar(select(Node).where(Node.name == "n1")).labels = {"zone": "a"}
    assert (_tenancy(engine), _alloc_version(factory, group_id)) == (before, alloc_before)
    with factory.begin() as db:
        db.add(Domain(name="ours"))
        db.scalar(select(Node).where(Node.name == "n1")).labels = {"zone": "b"}
    assert _tenancy(engine) == before + 1
    assert _alloc_version(factory, group_id) == alloc_before + 1


def test_a_node_moved_to_another_group_bumps_both(db_parts):
    engine, factory, group_id = db_parts
    with factory.begin() as db:
        other = ResourceGroup(name="other")
        db.add(other)
    versions_before = (_alloc_version(factory, group_id), _alloc_version(factory, other.id))
    with factory.begin() as db:
        db.scalar(select(Node).where(Node.name == "n1")).resource_group_id = other.id
    assert (_alloc_version(factory, group_id), _alloc_version(factory, other.id)) == (
        versions_before[0] + 1,
        versions_before[1] + 1,
    )


class Heard:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def committed(self) -> None:
        self.log.append("committed")

    def rolled_back(self) -> None:
        self.log.append("rolled_back")

    def ended(self) -> None:
        self.log.append("ended")


@pytest.mark.parametrize(
    "outcome, heard",
    [
        ("commit", ["committed", "ended"]),
        # SQLAlchemy ends the outermost transaction before it reports the rollback: only ended().
        ("rollback", ["ended"]),
        ("savepoint_rolled_back_then_commit", ["rolled_back", "committed", "ended"]),
        ("savepoint_released_then_rollback", ["ended"]),
        ("close", ["ended"]),
    ],
)
def test_a_participant_hears_how_its_transaction_ended(db_parts, outcome, heard):
    _, factory, _ = db_parts
    log: list[str] = []
    db = factory()
    db.scalar(select(Domain.id).limit(1))  # a transaction is open
    first = unitofwork.participant(db, "test", lambda: Heard(log))
    assert unitofwork.participant(db, "test", lambda: Heard(log)) is first  # one per transaction
    if outcome == "commit":
        db.commit()
    elif outcome == "rollback":
        db.rollback()
    elif outcome == "savepoint_rolled_back_then_commit":
        db.begin_nested().rollback()
        db.commit()
    elif outcome == "savepoint_released_then_rollback":
        db.begin_nested().commit()  # releasing a savepoint commits nothing yet
        db.rollback()
    else:
        db.close()
    assert log == heard
    # The next transaction starts with no participant.
    db.scalar(select(Domain.id).limit(1))
    assert unitofwork.participant(db, "test", lambda: Heard(log)) is not first
    db.close()
