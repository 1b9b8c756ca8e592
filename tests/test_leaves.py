"""The leaves import nothing from the project, and no private name crosses a package."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "expr_tracker"
#: modules that import nothing from expr_tracker (DESIGN.md "Layout")
LEAVES = ("_current.py", "_warn.py", "_version.py", "errors.py", "ruletext.py", "units.py")


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, [alias.name for alias in node.names]))
    return out


def test_leaves_import_nothing_from_the_project():
    for name in LEAVES:
        for module, _ in _imports(PACKAGE / name):
            assert not module.startswith("expr_tracker"), f"{name} imports {module}"


def test_units_and_warn_need_no_pydantic():
    for name in ("_warn.py", "units.py"):
        for module, _ in _imports(PACKAGE / name):
            assert not module.startswith("pydantic"), f"{name} imports {module}"


def test_no_private_name_crosses_a_package():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
        for module, names in _imports(path):
            if not module.startswith("expr_tracker."):
                continue
            is_pkg = (PACKAGE.parent / module.replace(".", "/") / "__init__.py").exists()
            there = module if is_pkg else module.rsplit(".", 1)[0]
            if there == here:
                continue
            for name in names:
                if name.startswith("_") and not name.startswith("__"):
                    bad.append(f"{path.relative_to(PACKAGE.parent)}: {module}.{name}")
    assert not bad, "private names imported across packages:\n" + "\n".join(bad)
