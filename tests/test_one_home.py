"""One home per concept (docs/architecture.md "One home per concept"): a public top-level
function or class name is defined in one module of the package.

Two modules defining the same public name are either one thing written twice (merge them:
a second implementation drifts from the first) or two things under one name (rename one: a
reader, a grep and an import cannot tell them apart). Not counted:

- a lazy forwarder: a function whose body only imports the same name from its home and
  returns its call (``api.alert`` loading ``alerts.delivery.alert`` on first use, so
  ``import expr_tracker`` stays light), one implementation behind two doors;
- ``register(subparsers)`` of each ``cli`` command module: the hook ``cli/main.py`` calls.

``TWINS`` lists the true exceptions: two implementations of one thing kept on purpose, each
with the test that checks them against each other. It is empty: the Python and the SQL M4
(``history/downsample.py``, ``ui/series.py``) are private names.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from helpers import ROOT

PACKAGE = ROOT / "expr_tracker"

#: name -> (the modules defining it, the test that checks them against each other)
TWINS: dict[str, tuple[frozenset[str], str]] = {}

#: name -> the package whose modules each define it as a hook their caller looks up
HOOKS = {"register": "expr_tracker.cli"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _forwards(fn: ast.FunctionDef) -> bool:
    """True when ``fn`` only imports its own name from elsewhere and returns its call."""
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    *imports, last = body or [None]
    local = {
        alias.asname or alias.name
        for node in imports
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name == fn.name
    }
    return (
        bool(local)
        and all(isinstance(node, ast.ImportFrom) for node in imports)
        and isinstance(last, ast.Return)
        and isinstance(last.value, ast.Call)
        and isinstance(last.value.func, ast.Name)
        and last.value.func.id in local
    )


def _definitions() -> dict[str, list[str]]:
    """public name -> the modules defining it at the top level (forwarders left out)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if node.name.startswith("_"):
                continue
            if isinstance(node, ast.FunctionDef) and _forwards(node):
                continue
            hook = HOOKS.get(node.name)
            if hook is not None and module.startswith(hook + "."):
                continue
            found[node.name].append(module)
    return found


DEFINITIONS = _definitions()


def test_each_public_name_has_one_home():
    twice = {
        name: modules
        for name, modules in sorted(DEFINITIONS.items())
        if len(modules) > 1 and frozenset(modules) != TWINS.get(name, (None,))[0]
    }
    assert not twice, "public names defined in more than one module:\n" + "\n".join(
        f"  {name}: {', '.join(modules)}" for name, modules in twice.items()
    )


def test_the_scan_sees_definitions_and_forwarders():
    # a broken scan cannot pass silently: known homes are seen, the forwarders are not
    assert DEFINITIONS["flatten"] == ["expr_tracker.history.values"]
    assert DEFINITIONS["alert"] == ["expr_tracker.alerts.delivery.direct"]  # api's forwards
    assert "expr_tracker.cli.alert" not in DEFINITIONS.get("register", [])
    twice = ast.parse("def f():\n    x = 1\n    return g()\n").body[0]
    assert not _forwards(twice)  # type: ignore[arg-type]
    lazy = ast.parse('def f(a):\n    """doc"""\n    from m import f as g\n\n    return g(a)\n')
    assert _forwards(lazy.body[0])  # type: ignore[arg-type]


def test_every_twin_is_still_two():
    for name, (modules, _test) in TWINS.items():
        assert set(DEFINITIONS.get(name, ())) == set(modules), name
