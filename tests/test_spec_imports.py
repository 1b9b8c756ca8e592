"""spec/ imports nothing from the runtime (alerts/ reads its yaml walker as a leaf), and the
rule-file checks in alerts/ never import cli/ (DESIGN.md "Dependency direction")."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "expr_tracker"


def imported(path: Path) -> set[str]:
    """Every expr_tracker module ``path`` imports, at module level or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {name for name in out if name.split(".")[0] == "expr_tracker"}


#: modules with no project imports that spec/ may use
LEAVES = {"expr_tracker.errors", "expr_tracker.ruletext", "expr_tracker.units"}


def test_spec_imports_nothing_from_the_runtime():
    for path in sorted((PACKAGE / "spec").glob("*.py")):
        for name in imported(path):
            assert name.startswith("expr_tracker.spec") or name in LEAVES, (
                f"{path.name} imports {name}"
            )


def test_rule_file_checks_do_not_import_cli():
    for module in ("rulefiles.py", "unittests.py"):
        for name in imported(PACKAGE / "alerts" / module):
            assert not name.startswith("expr_tracker.cli"), f"alerts/{module} imports {name}"
