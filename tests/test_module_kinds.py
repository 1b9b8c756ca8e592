"""What a module is (docs/architecture.md "What a module is"): one object — one public class
that holds state, with its private helpers — or a family of pure functions; a module holding
several stateful public classes is a named family of one kind (the delivery policies, the
span plugins), listed in ``FAMILIES`` with the kind.

A class "holds state" when one of its methods assigns ``self.<attr>``; exceptions, enums,
named tuples and protocols do not count. A line count says nothing about ownership: a
600-line module can be one idea, and two 100-line objects sharing a module is how a second
job moves in unnoticed.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from helpers import ROOT

PACKAGE = ROOT / "expr_tracker"

#: module (relative to expr_tracker/) -> the kind its stateful public classes are of
FAMILIES: dict[str, str] = {
    "alerts/delivery/policy.py": "delivery policies (token bucket, dedup, retry rule)",
    "alerts/delivery/stages.py": "a lane's stages and the tickets they pass along",
    "alerts/baseline.py": "baseline() tables (one call's per-step values, an engine's tables)",
    "artifacts/model.py": "the artifact model (an artifact and its logged versions)",
    "cli/output.py": "terminal/record writers of et commands",
    "history/cache.py": "the row cache and its decoded disk tail",
    "history/columns.py": "the columnar view of a history (a column, the columns)",
    "history/pending.py": "a writer's pending queue (its own list, or the store's row cache)",
    "media/types.py": "media values for et.log (image, histogram, table)",
    "runs.py": "a run, and the disabled run that stands in for one",
    "spans/plugins.py": "span plugins (CPU time, torch memory, GPU stats)",
    "sync/store.py": "object stores (S3 and a shared folder) behind one protocol",
    "testing.py": "test doubles for users' tests (channel, capture, clock, webhook server)",
}

_NOT_STATE = {"Enum", "IntEnum", "StrEnum", "NamedTuple", "TypedDict", "Protocol"}


def _holds_state(cls: ast.ClassDef) -> bool:
    for base in cls.bases:
        text = ast.unparse(base)
        if text.split(".")[-1] in _NOT_STATE or text.endswith(("Error", "Exception", "Warning")):
            return False
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                if t.value.id == "self":
                    return True
    return False


def stateful_public_classes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and _holds_state(node)
    ]


def _without_exceptions(rel: str, classes: list[str]) -> list[str]:
    """``classes`` less the exceptions whose base the scan cannot see (imported from another
    module): the module is imported to ask."""
    name = "expr_tracker." + rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    module = importlib.import_module(name)
    return [c for c in classes if not issubclass(getattr(module, c), BaseException)]


def test_a_module_holds_one_object_or_is_a_named_family():
    mixed = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        classes = stateful_public_classes(path)
        if len(classes) > 1 and rel not in FAMILIES:
            classes = _without_exceptions(rel, classes)
        if len(classes) > 1 and rel not in FAMILIES:
            mixed.append(f"{rel}: {', '.join(classes)}")
    assert not mixed, (
        "modules holding several objects (split by owner, or list the module in FAMILIES "
        "with the kind they share):\n" + "\n".join(mixed)
    )


def test_every_listed_family_is_still_one():
    # a family that lost its members is a module that should leave the list
    for rel in FAMILIES:
        path = PACKAGE / rel
        assert path.exists(), rel
        assert len(stateful_public_classes(path)) > 1, rel


def test_the_scan_tells_state_from_records(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "class Owner:\n"
        "    def __init__(self):\n"
        "        self.n = 0\n"
        "class Other:\n"
        "    def bump(self):\n"
        "        self.k += 1\n"
        "class Bad(ValueError):\n"
        "    def __init__(self):\n"
        "        self.why = 1\n"
        "class _Helper:\n"
        "    def __init__(self):\n"
        "        self.x = 1\n"
        "class Record:\n"
        "    x: int = 0\n",
        encoding="utf-8",
    )
    assert stateful_public_classes(probe) == ["Owner", "Other"]
