"""The package stays readable: the training core never imports the tools, no two modules import
each other (directly or around a circle), and no file or function outgrows one reading.

Read from the source with `ast`: nothing is imported or run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import {{ cookiecutter.package_name }} as package

PACKAGE = Path(package.__file__).parent
MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 60


def modules() -> dict[str, Path]:
    """{dotted name within the package: file}; a package is named by its __init__.py."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports anywhere in its file (at the top, inside a
    function, or for type checking only: each is an arrow a reader follows)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue  # absolute imports are of other packages
        base = package.split(".") if package else []
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        target = ".".join([*base, *(node.module.split(".") if node.module else [])])
        for alias in node.names:  # `from . import data` imports the module data
            sub = f"{target}.{alias.name}" if target else alias.name
            found.add(sub if sub in known else target)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def test_the_core_never_imports_the_tools():
    wrong = {
        (name, target)
        for name, targets in graph().items()
        if not (name == "tools" or name.startswith("tools."))
        for target in targets
        if target == "tools" or target.startswith("tools.")
    }
    assert wrong == set()


def test_no_modules_import_each_other_around_a_circle():
    edges = graph()
    circles = []

    def visit(name: str, path: list[str]) -> None:
        for target in edges[name]:
            if target == path[0]:
                circles.append([*path, target])
            elif target not in path and target > path[0]:  # each circle once, from its least
                visit(target, [*path, target])

    for start in edges:
        visit(start, [start])
    assert circles == []


def test_the_graph_sees_imports_inside_functions():
    # The check above must see a lazy import: config/schema.py imports the registries inside
    # components().
    assert {"data", "models", "tasks"} <= graph()["config.schema"]


def test_no_file_is_longer_than_one_reading():
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert long == {}


def test_no_function_is_longer_than_one_screen():
    long = {}
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(PACKAGE)}:{node.name}"] = n
    assert long == {}
