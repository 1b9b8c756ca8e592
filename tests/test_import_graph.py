"""The import graph of expr_tracker keeps its direction (docs/architecture.md "Import
direction"):

    cli -> api -> assemble -> {alerts, spans, runs, artifacts, backends, system} -> history
    -> leaves

(``process_exit`` beside ``history``: runs, backends and api call it; it imports only leaves.)

Every import counts, at module level or inside a function (a function-level import that
dodges a cycle is still an edge). The leaves import nothing from the project; ``spec``
imports only leaves (``alerts`` reads it as a leaf: models, errors, located YAML); no module
imports a package above it; there is no cycle among modules at module level; and no private
name (``_x``) leaves its module, imported or read as ``module._x`` (the private leaf
modules ``_current``, ``_warn`` and ``_version`` of the top package are meant to be
imported)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from helpers import ROOT

PACKAGE = ROOT / "expr_tracker"

#: modules with no project imports
LEAVES = {"_current", "_version", "_warn", "errors", "ruletext", "units"}

#: group -> the groups it may import (a group is the first name under expr_tracker)
ALLOWED: dict[str, set[str]] = {
    "spec": LEAVES,
    "history": LEAVES,
    "spans": LEAVES | {"history"},
    "runconfig": LEAVES | {"history"},
    "runsummary": LEAVES | {"history"},
    "runs": LEAVES | {"history", "runconfig", "runsummary", "process_exit"},
    # the process exit hooks: called by runs, backends and api; imports only the leaves
    "process_exit": LEAVES,
    "proxies": LEAVES,
    "wandb_compat": LEAVES | {"spec", "runconfig"},
    "backends": LEAVES | {"history", "process_exit", "media"},
    "alerts": LEAVES | {"history", "spec"},
    "trace": LEAVES | {"history"},
    "artifacts": LEAVES | {"history"},
    # media types, their store and readers, et.watch (docs/media.md)
    "media": LEAVES | {"history"},
    # the system sampler (docs/system.md): leaves only (psutil, NVML, a write callable)
    "system": LEAVES,
    "query": LEAVES | {"history", "media"},
    "ui": LEAVES | {"history", "query", "trace", "media"},
    "sync": LEAVES | {"history", "query", "media"},
    "plugins": {"spans"},
    "integrations": LEAVES | {"api", "runs", "spec", "history"},
    "testing": LEAVES | {"alerts"},
    "assemble": LEAVES
    | {
        "history",
        "spans",
        "runs",
        "runconfig",
        "runsummary",
        "alerts",
        "artifacts",
        "spec",
        "backends",
        "system",
        "sync",
        "media",
        "query",
        "process_exit",
    },
    "api": LEAVES
    | {
        "history",
        "spans",
        "runs",
        "runsummary",
        "alerts",
        "artifacts",
        "spec",
        "assemble",
        "wandb_compat",
        "backends",
        "query",
        "process_exit",
    },
}
for _leaf in LEAVES:
    ALLOWED[_leaf] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _target(module: str, name: str | None) -> str:
    """The project module an import refers to (``from pkg import mod`` names ``pkg.mod``)."""
    if name and f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    while module not in MODULES and "." in module:
        module = module.rsplit(".", 1)[0]
    return module


def _package(module: str) -> str:
    """The package a module belongs to (a package is its own)."""
    if MODULES[module].name == "__init__.py":
        return module
    return module.rpartition(".")[0]


def _imports(name: str, path: Path):
    """(module, imported name or None, at module level?) for each import of one module;
    ``if TYPE_CHECKING:`` blocks are skipped (never executed)."""
    is_package = path.name == "__init__.py"
    todo = [(ast.parse(path.read_text(encoding="utf-8")), True)]
    while todo:
        node, module_level = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                todo.append((child, False))
                continue
            if (
                isinstance(child, ast.If)
                and isinstance(child.test, ast.Name)
                and child.test.id == "TYPE_CHECKING"
            ):
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, None, module_level
            elif isinstance(child, ast.ImportFrom):
                module = child.module or ""
                if child.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - child.level + 1]
                    module = ".".join([*base, *([module] if module else [])])
                for alias in child.names:
                    yield module, alias.name, module_level
            todo.append((child, module_level))


#: the private leaf modules of the top package, meant to be imported (their names are not)
PRIVATE_LEAVES = {"expr_tracker._current", "expr_tracker._version", "expr_tracker._warn"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_attributes(name: str, path: Path, bound: dict[str, str]):
    """``(line, module, attribute)`` for each ``alias.attr`` read in one module, where
    ``alias`` is bound to a project module by an import (``from pkg import mod``,
    ``import pkg.mod as alias``)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Attribute):
            continue
        chain = []
        value = node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in bound:
            module = ".".join([bound[value.id], *reversed(chain)])
            if module in MODULES:
                yield node.lineno, module, node.attr


def _edges() -> tuple[dict[str, set[str]], dict[str, set[str]], list[str]]:
    """(every import, module-level imports, private names one module takes from another)."""
    every: dict[str, set[str]] = defaultdict(set)
    top: dict[str, set[str]] = defaultdict(set)
    private: list[str] = []
    for name, path in MODULES.items():
        bound: dict[str, str] = {}  # local name -> the project module it is
        for module, imported, module_level in _imports(name, path):
            if module.split(".")[0] != "expr_tracker":
                continue
            target = _target(module, imported)
            every[name].add(target)
            if module_level:
                top[name].add(target)
            if imported is not None and target == f"{module}.{imported}":
                bound[imported] = target  # `from pkg import mod`
            elif imported is None:
                bound[module.split(".")[0]] = module.split(".")[0]
            if imported and _private(imported) and target not in PRIVATE_LEAVES:
                private.append(f"{name}: from {module} import {imported}")
        for alias in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(alias, ast.alias) and alias.asname and alias.name in MODULES:
                bound[alias.asname] = alias.name  # `import pkg.mod as alias`
        for line, module, attr in _module_attributes(name, path, bound):
            if _private(attr) and module != name and f"{module}.{attr}" not in PRIVATE_LEAVES:
                private.append(f"{name}:{line}: {module}.{attr}")
    return every, top, private


EVERY, MODULE_LEVEL, PRIVATE = _edges()


def _group(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "expr_tracker"


def test_the_graph_is_read():
    # the scan sees the edges we know exist, so a broken scan cannot pass silently
    assert "expr_tracker.history.store" in EVERY["expr_tracker.assemble.history"]
    assert "expr_tracker.assemble" in EVERY["expr_tracker.api"]


def test_imports_run_one_way():
    bad = []
    for module, targets in sorted(EVERY.items()):
        group = _group(module)
        if group not in ALLOWED:
            continue  # cli, hydra and the public door may use everything below them
        for target in sorted(targets):
            other = _group(target)
            if other != group and other not in ALLOWED[group]:
                bad.append(f"{module} imports {target} ({group} may not import {other})")
    assert not bad, "imports against the direction:\n" + "\n".join(bad)


def test_nothing_below_imports_cli_api_or_assemble():
    for module, targets in EVERY.items():
        if _group(module) in ("cli", "api", "assemble", "hydra", "integrations", "expr_tracker"):
            continue  # integrations sit above api, beside cli: nothing imports them
        for target in targets:
            assert _group(target) not in ("cli", "api", "assemble", "hydra"), (module, target)


#: what the top package may import from integrations: the watch that registers tracker names
#: once a framework is loaded (it imports no framework itself)
AUTOLOAD = "expr_tracker.integrations.autoload"


def test_nothing_imports_the_integrations():
    # each framework integration sits on top (it imports its framework); the package never
    # reaches up to one, so `import expr_tracker` imports no framework (the top package
    # installs the autoload watch, which imports none: tests/integrations check sys.modules)
    for module, targets in EVERY.items():
        if _group(module) != "integrations":
            allowed = {AUTOLOAD} if module == "expr_tracker" else set()
            reached = [t for t in targets if _group(t) == "integrations" and t not in allowed]
            assert not reached, module
    assert EVERY[AUTOLOAD] <= {"expr_tracker.integrations.accelerate"}  # by name, on demand


def test_no_cycle_at_module_level():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def connect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in MODULE_LEVEL.get(v, ()):
            if w == v or w not in MODULES:
                continue
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(MODULES):
        if module not in index:
            connect(module)
    assert not cycles, f"module-level import cycles: {cycles}"


def _calls(path: Path) -> set[str]:
    """The names a module calls: ``f(...)`` as ``f``, ``a.b.f(...)`` as ``b.f``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name):
            out.add(func.id)
        elif isinstance(func, ast.Attribute):
            owner = func.value
            head = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            out.add(f"{head}.{func.attr}")
    return out


#: the calls that turn an alerts spec into delivery: a dispatcher, a channel's policy
COMPOSING_DELIVERY = {"Dispatcher", "Policy.from_spec", "effective_policy"}


def test_only_assemble_composes_delivery():
    # docs/architecture.md "Import direction": a Dispatcher comes from a spec in assemble/
    # only (a run's, et alert's, the run-less et.alert's); alerts/delivery/ takes plain
    # values, so it imports nothing of spec
    assert COMPOSING_DELIVERY <= _calls(MODULES["expr_tracker.assemble.delivery"])
    bad = []
    for module, path in sorted(MODULES.items()):
        if _group(module) == "assemble":
            continue
        for call in sorted(_calls(path) & COMPOSING_DELIVERY):
            bad.append(f"{module} calls {call}(...)")
        if module.startswith("expr_tracker.alerts.delivery"):
            bad += [f"{module} imports {t}" for t in sorted(EVERY[module]) if _group(t) == "spec"]
    assert not bad, "delivery composed outside assemble/:\n" + "\n".join(bad)


def test_delivery_stages_never_import_the_lane():
    # the lane runs its stages and applies their verdicts; a stage is handed values and
    # callables and never sees the lane, not even as a type (an import under
    # TYPE_CHECKING, which the cycle check skips, would still tie the two together)
    lane, stages = "expr_tracker.alerts.delivery.lane", "expr_tracker.alerts.delivery.stages"
    assert stages in MODULE_LEVEL[lane]  # the one direction: lane -> stages
    tree = ast.parse(MODULES[stages].read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [_target(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found += [_target(node.module or "", a.name) for a in node.names]
    assert lane not in found, f"{stages} imports {lane}"


def test_leaves_need_no_pydantic():
    for leaf in ("_warn", "units"):
        tree = ast.parse((PACKAGE / f"{leaf}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                module = getattr(node, "module", None) or ""
                assert "pydantic" not in [module.split(".")[0], *names], leaf


def test_no_private_name_leaves_its_module():
    # a name one module shares with another is public (no leading underscore): imported
    # (`from m import _x`) or read through the module (`m._x`), a private name is a
    # dependency nobody sees; only the private leaf modules themselves are imported
    assert not PRIVATE, "private names used outside their module:\n" + "\n".join(PRIVATE)


def test_the_private_name_scan_sees_both_ways(tmp_path):
    # the scan above reads `from m import _x` and `m._x`: a broken scan cannot pass silently
    path = tmp_path / "probe.py"
    path.write_text(
        "from expr_tracker.spans import core\n"
        "from expr_tracker.history.codec import _x\n"
        "core._active\n",
        encoding="utf-8",
    )
    bound = {"core": "expr_tracker.spans.core"}
    got = list(_module_attributes("probe", path, bound))
    assert got == [(3, "expr_tracker.spans.core", "_active")]
    names = [imported for _, imported, _ in _imports("expr_tracker.probe", path)]
    assert "_x" in names
