"""build/ is the composition root: nothing in alerts/, spans/ or history/ imports it or api
(not even inside a function), so no runtime package reaches into a Run under construction
(DESIGN.md "Dependency direction")."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "expr_tracker"


def imported(path: Path) -> set[str]:
    """Every expr_tracker module ``path`` imports (``from expr_tracker import api`` counts as
    ``expr_tracker.api``), at module level or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            if node.module == "expr_tracker":
                out.update(f"expr_tracker.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {name for name in out if name.split(".")[0] == "expr_tracker"}


def test_runtime_packages_import_neither_build_nor_api():
    for package in ("alerts", "spans", "history"):
        for path in sorted((PACKAGE / package).rglob("*.py")):
            for name in imported(path):
                top = ".".join(name.split(".")[:2])
                assert top not in ("expr_tracker.build", "expr_tracker.api"), (
                    f"{path.relative_to(PACKAGE)} imports {name}"
                )


def test_build_modules_stay_small():
    for path in sorted((PACKAGE / "build").glob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 600, f"build/{path.name} has {lines} lines"
