"""labfleet/ is a view of the folders (symbolic links), the package the wheel builds from them."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VIEW = REPO / "labfleet"
SUBPACKAGES = {
    "spawner": "spawner",
    "session": "server_ext",
    "widgets": "widgets",
    "console": "admin_dashboards",
}


def expected() -> dict[str, str]:
    links = {p.name: f"../hub_ext/{p.name}" for p in (REPO / "hub_ext").iterdir()}
    links = {k: v for k, v in links.items() if k != "__pycache__" and (k.endswith(".py") or "." not in k)}
    links.update({name: f"../{folder}" for name, folder in SUBPACKAGES.items()})
    return links


def test_the_view_links_every_folder_of_the_package():
    links = {p.name: os.readlink(p) for p in VIEW.iterdir() if p.is_symlink()}
    assert links == expected(), "run .rename/rename_to_labfleet.py (it adds the missing links)"


def test_the_view_and_the_folders_are_the_same_modules():
    import labfleet.core
    import labfleet.spawner

    assert Path(labfleet.core.__file__).resolve().parent == REPO / "hub_ext" / "core"
    assert Path(labfleet.spawner.__file__).resolve().parent == REPO / "spawner"


OLD_NAMES = ("hub_ext", "spawner", "server_ext", "widgets", "admin_dashboards")


def _sources():
    """The repository's own Python files (tracked by git: no venv, no cache, no installed package)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.py"], cwd=REPO, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    for rel in filter(None, out.split("\0")):
        path = REPO / rel
        if rel.split("/")[0] != "labfleet" and path.is_file() and not path.is_symlink():
            yield rel, path


def test_no_module_imports_a_folder_by_its_own_name():
    """In development the folders import under their own names too (the checkout is on sys.path): one
    such import would load a second copy of a module beside labfleet's (two registries, two caches)."""
    import ast

    found = []
    for rel, path in _sources():
        for node in ast.walk(ast.parse(path.read_bytes(), rel)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            found += [f"{rel}:{node.lineno} {n}" for n in names if n.split(".")[0] in OLD_NAMES]
    assert found == []
