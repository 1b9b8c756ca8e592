"""YAML with locations: one located walker for spec files and rule files.

``compose_unique()`` parses a document once, keeping its nodes (line and column of every
key and value) and every mapping key written twice (``UniqueKeyLoader``). ``yaml_locations()``
maps each dotted spec path to its ``(file, line, column)``; ``LocatedYaml`` looks up the
node of one path (a tuple of keys), for the rule-file checks. Imports nothing from the
runtime, so ``alerts/`` may use it too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from expr_tracker.spec.errors import SpecError, SpecIssue, join_path
from expr_tracker.spec.merge import Location, item_key, named_items
from expr_tracker.spec.models import NAMED_LISTS

__all__ = [
    "DuplicateKeyError",
    "LocatedYaml",
    "UniqueKeyLoader",
    "child_nodes",
    "compose_unique",
    "duplicate_key_message",
    "interpolated_leaves",
    "interpolation",
    "interpolation_note",
    "key_path",
    "load_yaml",
    "package_section",
    "yaml_error",
    "yaml_locations",
]


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping holds the same key twice (plain YAML loading keeps the last one silently)."""


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that records duplicate mapping keys instead of dropping them.

    ``duplicates`` lists ``(key, mark, first_mark)`` (``yaml.Mark``: 0-based line/column of
    the repeated key and of its first occurrence). Keys brought in by a ``<<`` merge may be
    overridden: only the keys written in one mapping are compared.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.duplicates: list[tuple[Any, yaml.Mark, yaml.Mark]] = []
        self._checked: set[int] = set()

    def _check_unique(self, node: yaml.MappingNode) -> None:
        if id(node) in self._checked:
            return
        self._checked.add(id(node))
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: construct_mapping reports it
                continue
            if first is not key_node.start_mark:
                self.duplicates.append((key, key_node.start_mark, first))

    def flatten_mapping(self, node: yaml.MappingNode) -> None:  # before merges are inlined
        self._check_unique(node)
        super().flatten_mapping(node)

    def construct_mapping(self, node: Any, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            self._check_unique(node)
        return super().construct_mapping(node, deep=deep)


def duplicate_key_message(key: Any, first: yaml.Mark) -> str:
    """``duplicate key 'a' (first at line 3, column 5): YAML would keep only the last one``."""
    return (
        f"duplicate key {key!r} (first at line {first.line + 1}, column {first.column + 1}): "
        "YAML would keep only the last one"
    )


def compose_unique(text: str) -> tuple[Any, Any, list[tuple[Any, yaml.Mark, yaml.Mark]]]:
    """``(node, data, duplicates)`` of one YAML document, parsed once."""
    loader = UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
        return node, data, sorted(loader.duplicates, key=lambda d: d[1].index)
    finally:
        loader.dispose()


def yaml_error(exc: yaml.YAMLError, text: str | None) -> tuple[str, tuple[int, int] | None]:
    """What a YAML error says and where, as every spec error reports it: ``(problem,
    (line, column))``, 1-based, or ``(problem, None)`` when nothing says where.

    A marked error has its problem and mark. A reader error (a NUL byte or another
    character YAML refuses) has only a character position in the text it was given: that
    position in ``text`` becomes line:column, and its message loses the position.
    """
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return getattr(exc, "problem", None) or str(exc), (mark.line + 1, mark.column + 1)
    problem = getattr(exc, "problem", None) or str(exc).split("\n", 1)[0]
    pos = getattr(exc, "position", None)
    if isinstance(exc, yaml.reader.ReaderError) and text is not None and isinstance(pos, int):
        line_start = text.rfind("\n", 0, pos) + 1
        return problem, (text.count("\n", 0, pos) + 1, pos - line_start + 1)
    return problem, None


def load_yaml(path: str | os.PathLike) -> Any:
    """Parse a YAML file with the safe loader (no Python object tags). An empty file is None.

    Raises:
        OSError: the file cannot be read.
        yaml.YAMLError: the text is not valid YAML; ``DuplicateKeyError`` (one of them) when
            a mapping repeats a key, at the first repeat.
    """
    with open(path, encoding="utf-8") as f:
        _, data, duplicates = compose_unique(f.read())
    if duplicates:
        key, mark, first = duplicates[0]
        raise DuplicateKeyError(None, None, duplicate_key_message(key, first), mark)
    return data


def node_key(key_node: Any) -> Any:
    """The value of a mapping key node as the safe loader reads it (``off`` -> False)."""
    if key_node.tag == "tag:yaml.org,2002:str" or not isinstance(key_node, yaml.ScalarNode):
        return getattr(key_node, "value", None)
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(key_node, deep=True)
    except yaml.YAMLError:
        return key_node.value
    finally:
        loader.dispose()


def mapping_entry_key(path: str, data: Mapping, key: Any) -> Any:
    """Path segment of the entry ``key`` of a named list written as a mapping: the entry's
    name as the merge reads it, else its position (a key YAML read as a bool or number)."""
    name = named_items(path, {key: data[key]})[0][0]
    return name if name is not None else list(data).index(key)


def yaml_locations(node: Any, data: Any, path: str, file: str, out: dict[str, Location]) -> None:
    if isinstance(node, yaml.MappingNode) and isinstance(data, Mapping):
        named = path in NAMED_LISTS
        for key_node, value_node in node.value:
            key = node_key(key_node)
            try:
                if key not in data or not (named or isinstance(key, str)):
                    continue
            except TypeError:  # an unhashable key
                continue
            p = join_path(path, mapping_entry_key(path, data, key) if named else key)
            out[p] = (file, key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            yaml_locations(value_node, data[key], p, file, out)
    elif isinstance(node, yaml.SequenceNode) and isinstance(data, list):
        for i, (item_node, item) in enumerate(zip(node.value, data, strict=False)):
            p = join_path(path, item_key(path, item, i))
            out[p] = (file, item_node.start_mark.line + 1, item_node.start_mark.column + 1)
            yaml_locations(item_node, item, p, file, out)


def key_path(node: Any, data: Any, target: yaml.Mark, path: str) -> str | None:
    """Dotted path of the mapping key written at ``target`` (for duplicate keys)."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = node_key(key_node)
            p = join_path(path, key)
            if key_node.start_mark is target:
                return p
            try:
                child = data.get(key) if isinstance(data, Mapping) else None
            except TypeError:
                child = None
            found = key_path(value_node, child, target, p)
            if found is not None:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item_node in enumerate(node.value):
            item = data[i] if isinstance(data, list) and i < len(data) else None
            found = key_path(item_node, item, target, join_path(path, item_key(path, item, i)))
            if found is not None:
                return found
    return None


def child_nodes(node: Any, key: Any) -> tuple[Any, Any]:
    """One step down a document's nodes: ``(key_node, value_node)`` of ``key`` in a mapping
    node (the last of repeated keys wins; an int ``key`` not written there is a position,
    for a named list written as a mapping) or of item ``key`` in a sequence node (key_node
    None); ``(None, None)`` when there is none."""
    found = None, None
    if node.tag.endswith(":seq") and isinstance(node.value, list):
        if isinstance(key, int) and key < len(node.value):
            found = None, node.value[key]
    elif isinstance(node.value, list):  # a mapping
        for k, v in node.value:
            if getattr(k, "value", None) == key:
                found = k, v
        if found == (None, None) and isinstance(key, int) and key < len(node.value):
            found = node.value[key]
    return found


def package_section(node: Any, data: Any, package: str | None, file: str, source: str) -> tuple:
    """``(node, data)`` of the section at dotted ``package`` (``"tracker"``) of a file (a
    Hydra app's config holding the spec under ``tracker:``); unchanged without a package.

    Raises:
        SpecError: the section is missing or not a mapping.
    """
    if not package:
        return node, data
    where = ""
    for key in package.split("."):
        where = join_path(where, key)
        if not isinstance(data, Mapping) or key not in data:
            keys = ", ".join(map(str, data)) if isinstance(data, Mapping) else "none"
            msg = f"no section {where!r} in {file} (--package {package}; keys there: {keys})"
            raise SpecError([SpecIssue("", msg, source=source)])
        data = data[key]
        node = child_nodes(node, key)[1] if isinstance(node, yaml.MappingNode) else None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        msg = f"the section {package!r} of {file} must be a mapping, not {type(data).__name__}"
        raise SpecError([SpecIssue("", msg, source=source)])
    return node, data


# --- one path of a document: where it is written (rule files, unit-test files) ---------


class LocatedYaml:
    """A YAML document and the line:column of each path in it (node marks), parsed once
    with ``UniqueKeyLoader``: ``duplicates`` lists ``(key, mark, first_mark)`` of every
    mapping key written twice (plain YAML keeps the last one silently)."""

    def __init__(self, text: str):
        self.root, self.data, self.duplicates = compose_unique(text)

    def pair(self, path):
        """``(key_node, value_node)`` at ``path`` (key_node ``None`` for list items)."""
        key_node, node = None, self.root
        for key in path:
            if node is None:
                return None, None
            key_node, node = child_nodes(node, key)
        return key_node, node

    def node(self, path):
        return self.pair(path)[1]

    def where_key(self, path) -> tuple[int, int]:
        """line:column of the key at ``path`` (of its value when it has no key node)."""
        key_node, _ = self.pair(path)
        if key_node is None:
            return self.where(path)
        return key_node.start_mark.line + 1, key_node.start_mark.column + 1

    def where(self, path, column_in_value: int | None = None) -> tuple[int, int]:
        node = self.node(path)
        while node is None and path:
            path = path[:-1]
            node = self.node(path)
        if node is None:
            return 1, 1
        line, col = node.start_mark.line + 1, node.start_mark.column + 1
        if column_in_value and getattr(node, "style", None) in (None, "", '"', "'"):
            if getattr(node, "style", None) in ('"', "'"):
                col += 1
            if node.start_mark.line == node.end_mark.line:
                col += column_in_value - 1
        return line, col


# --- OmegaConf interpolations left in a file (only Hydra resolves them) ----------------

#: an OmegaConf interpolation: ``${key}``, ``${..rel}``, ``${oc.select:a.b,default}`` (one
#: level of nesting inside, as ``${oc.select:${x},y}``)
_INTERPOLATION_RE = re.compile(r"\$\{(?:[^{}]|\{[^{}]*\})*\}")


def interpolation(value: Any) -> str | None:
    """The first OmegaConf interpolation ``${...}`` in ``value`` when it is a string (``\\${``,
    OmegaConf's escape, does not count); None otherwise."""
    if not isinstance(value, str) or "${" not in value:
        return None
    for m in _INTERPOLATION_RE.finditer(value):
        if not value[: m.start()].endswith("\\"):
            return m.group(0)
    return None


def interpolation_note(text: str) -> str:
    """What the commands say of a value holding interpolation ``text``."""
    return (
        f"holds a Hydra/OmegaConf interpolation `{text}` that only Hydra resolves: not "
        f"checked here; validate the composed config (python app.py --cfg job --resolve > "
        f"composed.yaml; see docs/cli.md)"
    )


def interpolated_leaves(data: Any, path: tuple = ()) -> list[tuple[tuple, str]]:
    """``(key path, interpolation)`` of every string value in ``data`` (nested mappings and
    lists) that holds an interpolation, in document order."""
    items: Iterable[tuple[Any, Any]]
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    else:
        text = interpolation(data)
        return [(path, text)] if text is not None else []
    out = []
    for key, value in items:
        out.extend(interpolated_leaves(value, (*path, key)))
    return out
