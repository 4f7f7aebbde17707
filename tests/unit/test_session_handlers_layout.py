"""The layout of ``labfleet.session`` (server_ext/): every jupyter-server (tornado) handler class of the
session extension is defined in the ``labfleet.session.handlers`` package, which the extension registers
from. Read from the source (an AST walk), and checked once more on the imported modules."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

SESSION = Path(__file__).resolve().parents[2] / "server_ext"  # installed as labfleet.session
HANDLERS = "handlers"


def base_names(node: ast.ClassDef) -> set[str]:
    """The last part of each base's name: ``web.RequestHandler`` -> ``RequestHandler``."""
    names = set()
    for base in node.bases:
        if isinstance(base, ast.Attribute):
            names.add(base.attr)
        elif isinstance(base, ast.Name):
            names.add(base.id)
    return names


def handler_classes(root: Path) -> dict[str, str]:
    """{class name: file relative to ``root``} for every handler class defined under ``root``: a class
    whose base is a handler (``...Handler``, ``...HandlerMixin``) or another handler class found here."""
    classes = [
        (node, path.relative_to(root).as_posix())
        for path in sorted(root.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        if isinstance(node, ast.ClassDef)
    ]
    found: dict[str, str] = {}
    grew = True
    while grew:  # until no new subclass of a handler found here turns up
        grew = False
        for node, where in classes:
            if node.name in found:
                continue
            bases = base_names(node)
            if any(b.endswith(("Handler", "HandlerMixin")) or b in found for b in bases):
                found[node.name] = where
                grew = True
    return found


def outside_the_package(found: dict[str, str]) -> list[str]:
    return sorted(f"{where}: {name}" for name, where in found.items() if where.split("/")[0] != HANDLERS)


def test_every_handler_class_is_in_the_handlers_package():
    found = handler_classes(SESSION)
    # Not an empty scan: the extension's endpoints are there.
    for name in (
        "RunnerStateHandler",
        "InferenceProxyHandler",
        "AppsHandler",
        "FleetHandler",
        "ServerHandler",
    ):
        assert found.get(name, "").startswith(f"{HANDLERS}/"), name
    assert outside_the_package(found) == []


def test_the_imported_modules_agree():
    # A handler class the AST scan could miss (a base under another name): its class says where it lives.
    from tornado.web import RequestHandler

    import labfleet.session

    wrong = []
    for info in pkgutil.walk_packages(labfleet.session.__path__, "labfleet.session."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, RequestHandler)
                and value.__module__ == info.name
                and not info.name.startswith(f"labfleet.session.{HANDLERS}.")
            ):
                wrong.append(f"{info.name}.{value.__name__}")
    assert wrong == []


def test_the_scan_catches_a_handler_outside(tmp_path):
    (tmp_path / HANDLERS).mkdir()
    (tmp_path / HANDLERS / "ok.py").write_text("class Base(APIHandler): ...\n")
    (tmp_path / "stray.py").write_text(
        "from .handlers.ok import Base\nclass Sub(Base): ...\nclass Plain: ...\nclass Raw(web.RequestHandler): ...\n"
    )
    assert outside_the_package(handler_classes(tmp_path)) == ["stray.py: Raw", "stray.py: Sub"]
