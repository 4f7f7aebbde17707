"""Each of labfleet's words has one definition (labfleet.core.vocab; sizes in labfleet.core.slots,
how they read for people in labfleet.core.display), and every process imports it.

An AST scan of the product's Python (migrations aside: they are history and import nothing of
the app) finds a word typed again: a literal holding exactly the session types, a named subset of
statuses, the slot names or the folder rights; the port bound; a unit table of the size grammar or of the bytes
people read.  The TypeScript side keeps its copies where this test checks them against Python's.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from labfleet.core import slots, vocab

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("hub_ext", "spawner", "server_ext", "widgets", "admin_dashboards")
VOCAB = "hub_ext/core/vocab.py"
SIZES = "hub_ext/core/slots.py"  # the size grammar
KIT = "hub_ext/core/display.py"  # how bytes read for people

WORDS = {
    "SESSION_TYPES": vocab.SESSION_TYPES,
    "COMMAND_SESSION_TYPES": vocab.COMMAND_SESSION_TYPES,
    "SESSION_STATUSES": vocab.SESSION_STATUSES,
    "STARTING_STATUSES": vocab.STARTING_STATUSES,
    "HOLDING_STATUSES": vocab.HOLDING_STATUSES,
    "LIVE_STATUSES": vocab.LIVE_STATUSES,
    "ACTIVE_STATUSES": vocab.ACTIVE_STATUSES,
    "FINAL_STATUSES": vocab.FINAL_STATUSES,
    "ENVIRONMENT_STATUSES": vocab.ENVIRONMENT_STATUSES,
    "BUILD_PENDING_STATUSES": vocab.BUILD_PENDING_STATUSES,
    "FOLDER_PERMISSIONS": vocab.FOLDER_PERMISSIONS,
    "SLOT_NAMES": vocab.SLOT_NAMES,
    "CHARGED_SLOTS": vocab.CHARGED_SLOTS,
}


def product_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *FOLDERS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sorted(p for p in listed if p.endswith(".py") and "/migrations/" not in p and (ROOT / p).exists())


def strings_of(node: ast.AST) -> frozenset[str] | None:
    """The strings of a tuple, list or set literal made of strings only, else None."""
    if not isinstance(node, (ast.Tuple, ast.List, ast.Set)) or len(node.elts) < 2:
        return None
    if not all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in node.elts):
        return None
    return frozenset(i.value for i in node.elts)  # type: ignore[attr-defined]


def constant_dict(node: ast.AST) -> dict | None:
    """A dict literal of constants only, as a dict; else None."""
    if not isinstance(node, ast.Dict) or not node.keys:
        return None
    pairs = list(zip(node.keys, node.values, strict=True))
    if not all(isinstance(k, ast.Constant) and isinstance(v, ast.Constant) for k, v in pairs):
        return None
    return {k.value: v.value for k, v in pairs}  # type: ignore[union-attr]


def retyped(source: str, path: str) -> list[str]:
    """Where ``source`` types one of labfleet's words again, as ``path:line: what``."""
    wanted = {frozenset(v): name for name, v in WORDS.items()}
    found = []
    for node in ast.walk(ast.parse(source, path)):
        line = getattr(node, "lineno", 0)
        got = strings_of(node)
        if got is not None and got in wanted:
            found.append(f"{path}:{line}: {wanted[got]} typed again")
        if isinstance(node, ast.Constant) and node.value == vocab.PORT_RANGE[1]:
            found.append(f"{path}:{line}: the port bound typed again (vocab.PORT_RANGE)")
        # A table keyed by the words (a badge per right, a transition per status) is no copy of them;
        # the rights with the words people read are.
        table = constant_dict(node)
        if table == vocab.FOLDER_RIGHTS:
            found.append(f"{path}:{line}: FOLDER_RIGHTS typed again")
        keys = (
            {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if isinstance(node, ast.Dict)
            else set()
        )
        if {"k", "m", "g"} <= keys and path != SIZES:
            found.append(f"{path}:{line}: a size unit table (the grammar is core.slots.parse_bytes)")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "(?:i?b)?" in node.value:
            if path != SIZES:
                found.append(f"{path}:{line}: a size pattern (the grammar is core.slots.parse_bytes)")
        if (
            isinstance(node, ast.Tuple)
            and len(node.elts) == 2
            and isinstance(node.elts[0], ast.Constant)
            and node.elts[0].value in ("KiB", "GiB")
            and path != KIT
        ):
            found.append(
                f"{path}:{line}: a byte unit table (people read bytes through core.display.fmt_bytes)"
            )
    return found


def test_each_word_has_one_definition():
    found = []
    for path in product_files():
        if path == VOCAB:
            continue
        found += retyped((ROOT / path).read_text(), path)
    assert not found, "\n".join(found)


def test_the_scan_finds_a_word_typed_again():
    # What the old tree had, in the forms it had them.
    assert retyped('SESSION_TYPES = ("interactive", "batch", "inference")\n', "x.py")
    assert retyped('LIVE = ["RUNNING", "PENDING", "PREPARING", "SCHEDULED"]\n', "x.py")  # any order
    assert retyped('RIGHTS = {"ro": "read-only", "rw": "read-write", "wd": "read-write-delete"}\n', "x.py")
    assert retyped("ok = 1 <= port <= 65535\n", "x.py")
    assert retyped('_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}\n', "x.py")
    assert retyped('UNITS = (("GiB", 2**30), ("MiB", 2**20))\n', "x.py")
    # A subset of no name, a table keyed by the words, and the words used through their name, are not.
    assert not retyped('BADGES = {"ro": "grey", "rw": "blue", "wd": "amber"}\n', "x.py")
    assert not retyped('if status in ("RUNNING", "TERMINATING"):\n    pass\n', "x.py")
    assert not retyped("from labfleet.core.vocab import SESSION_TYPES\nx = SESSION_TYPES\n", "x.py")


def test_the_named_subsets_are_subsets_and_in_order():
    statuses = vocab.SESSION_STATUSES
    for name in (
        "STARTING_STATUSES",
        "HOLDING_STATUSES",
        "LIVE_STATUSES",
        "ACTIVE_STATUSES",
        "FINAL_STATUSES",
    ):
        subset = WORDS[name]
        assert set(subset) <= set(statuses), name
        assert list(subset) == sorted(subset, key=statuses.index), name  # the order a session goes
    assert set(vocab.LIVE_STATUSES) | set(vocab.FINAL_STATUSES) == set(statuses)
    assert not set(vocab.LIVE_STATUSES) & set(vocab.FINAL_STATUSES)
    assert set(vocab.COMMAND_SESSION_TYPES) < set(vocab.SESSION_TYPES)
    pending = vocab.BUILD_PENDING_STATUSES
    assert list(pending) == list(vocab.ENVIRONMENT_STATUSES[: len(pending)])  # a build's first steps


def _ts(path: str) -> str:
    return (ROOT / "labextension" / "src" / path).read_text()


def _ts_strings(source: str, name: str) -> list[str]:
    m = re.search(rf"export const {name}\b[^=]*=\s*\[([^\]]*)\]", source)
    assert m, f"{name} is not in the TypeScript source any more: update this test"
    return re.findall(r"'([^']*)'", m.group(1))


def test_the_typescript_copies_agree_with_python():
    types = _ts("types.ts")
    assert _ts_strings(types, "SESSION_TYPES") == list(vocab.SESSION_TYPES)
    assert _ts_strings(types, "PERMISSIONS") == list(vocab.FOLDER_PERMISSIONS)
    fmt = _ts("format.ts")
    pattern = re.search(r"const MEM_RE = /(.*)/i;", fmt)
    assert pattern and pattern.group(1) == slots._MEM_RE.pattern
    units = re.search(r"const MEM_UNITS[^{]*\{([^}]*)\}", fmt)
    assert units
    letters = {k.strip("'") for k in re.findall(r"^\s*('[^']*'|\w+):", units.group(1), re.MULTILINE)}
    assert letters == {k for k in slots._MEM_UNITS if k != "b"}


@pytest.mark.parametrize(
    ("text", "size"),
    [("32g", 32 * 2**30), ("512 MiB", 512 * 2**20), ("1.5t", 3 * 2**39), ("1024", 1024), (7, 7)],
)
def test_one_size_grammar_reads_sizes(text, size):
    assert slots.parse_bytes(text) == size
    assert slots.parse_bytes(slots.format_amount("mem", slots.Decimal(size))) == size


@pytest.mark.parametrize("text", ["", "12zz", "1.3k", "-1g", True, "g"])
def test_one_size_grammar_refuses_what_is_not_a_size(text):
    assert slots.parse_bytes(text) is None
