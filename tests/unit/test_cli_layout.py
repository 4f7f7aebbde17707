"""The layout of ``labfleet.cli``: the command framework (``base``) and what commands print (``output``)
are two modules, and the dependency runs one way: base and the commands import output, output imports
nothing of the CLI. Read from the source (an AST walk), like tests/unit/test_import_direction.py."""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "hub_ext" / "cli"  # installed as labfleet.cli


def tree(name: str) -> ast.Module:
    path = CLI / f"{name}.py"
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def defined(module: ast.Module) -> set[str]:
    """The names a module defines at its top level: functions, classes, assigned constants."""
    names: set[str] = set()
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def imported_modules(module: ast.Module) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(module):  # an import inside a function counts too
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


def test_output_imports_nothing_of_the_command_framework():
    cli_imports = {m for m in imported_modules(tree("output")) if m.startswith((".", "labfleet.cli"))}
    assert cli_imports == set(), (
        "labfleet.cli.output sits below the command framework: plain values in, text out"
    )


def test_the_command_framework_defines_no_formatting():
    output_names = {n for n in defined(tree("output")) if not n.startswith("_")}
    assert {"format_table", "cell", "json_text", "bytes_text", "slots_text", "one_line"} <= output_names
    base = tree("base")
    assert defined(base) & output_names == set(), "formatting lives in labfleet.cli.output"
    # The text layout itself (JSON, wrapped paragraphs) is output's: base prints through it.
    assert imported_modules(base) & {"json", "textwrap"} == set()


def test_commands_take_formatting_from_output_not_from_base():
    output_names = defined(tree("output"))
    wrong = [
        f"{path.name}:{node.lineno} {alias.name}"
        for path in sorted(CLI.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        if isinstance(node, ast.ImportFrom) and node.module == "labfleet.cli.base"
        for alias in node.names
        if alias.name in output_names
    ]
    assert wrong == [], "import these from labfleet.cli.output"
