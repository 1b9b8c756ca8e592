"""Sources of a run spec, one merge, one validation, and where every value came from.

Each source returns a plain dict shaped like ``RunSpec``; ``merge()`` folds them, later wins
(DESIGN.md "Configuration precedence")::

    defaults < webhook environment variables (one channel each) < ET_ALERT_CONFIG file (its
    alerts) < ET_CONFIG file < configure_alert() values < init(spec=...) < init keywords

and Pydantic validates the result once. ``resolve()`` returns a ``ResolvedSpec``: the frozen
``RunSpec``, the source of every leaf value (``sources``), YAML ``(file, line, column)`` per
path where known (``locations``) and ``redacted()``, the JSON-able form saved as ``spec.json``.

Provenance strings: ``"default"``, ``"env:ET_SLACK_WEBHOOK_URL"``, ``"ET_ALERT_CONFIG:<path>"``,
``"ET_CONFIG:<path>"``, ``"configure_alert"``, ``"file:<path>"`` (spec given as a path),
``"spec"`` (a dict or DictConfig given), ``"init"`` (keyword arguments).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, SecretBytes, SecretStr, ValidationError

from expr_tracker.spec.errors import (
    SpecError,
    SpecIssue,
    is_secret_key,
    issues_from_validation_error,
    join_path,
    redact_config,
    suggest,
)
from expr_tracker.spec.models import (
    _SKIP,
    NAMED_LISTS,
    RunSpec,
    _is_omegaconf,
    _keep_literal,
    entry_name,
    named_entry,
    omegaconf_to_plain,
)
from expr_tracker.spec.names import default_run_name

__all__ = [
    "ALERT_CONFIG_ENV",
    "CONFIG_ENV",
    "KEYWORDS",
    "WEBHOOK_ENV",
    "DuplicateKeyError",
    "Layer",
    "ResolvedSpec",
    "UniqueKeyLoader",
    "alert_config_layer",
    "config_file_layer",
    "configure_alert_layer",
    "env_layers",
    "kwargs_to_dict",
    "load_file",
    "load_yaml",
    "merge",
    "merge_layers",
    "resolve",
    "resolve_file",
    "spec_layer",
    "validate_file",
]

Location = tuple[str, int, int]

#: Environment variable naming a whole-RunSpec file.
CONFIG_ENV = "ET_CONFIG"
#: Environment variable naming a file holding the ``alerts`` section.
ALERT_CONFIG_ENV = "ET_ALERT_CONFIG"
#: Webhook environment variables -> channel type, in precedence order (later wins).
WEBHOOK_ENV: tuple[tuple[str, str], ...] = (
    ("WEBHOOK_URL", "lark"),  # legacy name
    ("ET_LARK_WEBHOOK_URL", "lark"),
    ("ET_SLACK_WEBHOOK_URL", "slack"),
    ("ET_DINGTALK_WEBHOOK_URL", "dingtalk"),
    ("ET_WECOM_WEBHOOK_URL", "wecom"),
    ("ET_WEBHOOK_URL", "webhook"),
)

#: Flat keyword arguments of ``et.init`` -> dotted spec paths. The top-level RunSpec field
#: names (project, name, dir, ..., history, spans, alerts) are accepted as themselves.
KEYWORDS: dict[str, str] = {
    "cache_bytes": "history.cache.bytes",
    "cache_rows": "history.cache.rows",
    "max_open_seconds": "history.max_open_seconds",
    "step_policy": "history.step_policy",
    "rank_aware": "history.rank_aware",
    "buffer_size": "history.buffer.size",
    "buffer_interval": "history.buffer.interval",
    "max_buffer_seconds": "history.buffer.max_seconds",
    "max_pending_records": "history.buffer.max_pending_records",
    "alert_window": "history.alert_window",
    "spans": "spans.enabled",  # a mapping given as spans= is the whole section
    "span_metrics": "spans.metrics",
    "span_count": "spans.count",
    "span_print_fn": "spans.print",
    "span_async_write": "spans.async_write",
    "span_plugins": "spans.plugins",
    "span_buffer_size": "spans.buffer.size",
    "span_buffer_interval": "spans.buffer.interval",
    "span_max_buffer_seconds": "spans.buffer.max_seconds",
    "max_record_bytes": "spans.max_record_bytes",
    "max_pending_bytes": "spans.max_pending_bytes",
    "alert": "alerts",  # a mapping merged deeply; True/False sets alerts.enabled
    "alert_rules": "alerts.rules",
    "alert_on_rank": "alerts.on_rank",
    "watchdog_interval": "alerts.watchdog_interval",
    "notify_on": "alerts.notify_on",
}


# --- layers and merge ---------------------------------------------------------------------


@dataclass
class Layer:
    """One source: a RunSpec-shaped plain dict, where it came from, and YAML locations.

    Attributes:
        source: provenance string (``"file:conf/x.yaml"``, ``"init"``, ...).
        data: the values, shaped like ``RunSpec`` (``{"history": {"buffer": {"size": 10}}}``).
        locations: dotted path -> ``(file, line, column)``, 1-based, for YAML files.
        config_key: for an OmegaConf/Hydra DictConfig, its full key (``"tracker"``).
    """

    source: str
    data: dict[str, Any]
    locations: dict[str, Location] = field(default_factory=dict)
    config_key: str | None = None


def _item_key(list_path: str, item: Any, index: int) -> Any:
    if list_path in NAMED_LISTS:
        name = entry_name(list_path, item)
        if name is not None:
            return name
    return index


def _leaves(path: str, value: Any) -> Iterator[tuple[str, Any]]:
    """(path, value) of every leaf: mappings recurse, named lists recurse by entry name,
    other lists and empty mappings are leaves."""
    if isinstance(value, Mapping) and value and not isinstance(value, BaseModel):
        for key, child in value.items():
            yield from _leaves(join_path(path, key), child)
    elif isinstance(value, (list, tuple)) and path in NAMED_LISTS and value:
        for i, item in enumerate(value):
            yield from _leaves(join_path(path, _item_key(path, item, i)), item)
    else:
        yield path, value


def _copy(value: Any) -> Any:
    """Copy the containers of a plain-data value; leave every other object as it is."""
    if _is_omegaconf(value):
        return omegaconf_to_plain(value)
    if isinstance(value, Mapping) and not isinstance(value, BaseModel):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _named_items(list_path: str, value: Any) -> list[tuple[Any, Any]]:
    """(name, entry) pairs of a named list in list or mapping form; entry None = remove."""
    if isinstance(value, Mapping):
        pairs = []
        for key, entry in value.items():
            entry = named_entry(key, entry)
            name = entry_name(list_path, entry) if entry is not None else key
            pairs.append((name, entry))
        return pairs
    return [(entry_name(list_path, entry), entry) for entry in value]


class _Merger:
    """Folds layers into one dict, remembering the source (and location) of every leaf."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.locations: dict[str, Location] = {}

    def add(self, layer: Layer) -> None:
        self._merge(self.data, layer.data, "", layer)

    def _forget(self, path: str) -> None:
        for table in (self.sources, self.locations):
            for key in [k for k in table if k == path or k.startswith((path + ".", path + "["))]:
                del table[key]

    def _record(self, path: str, value: Any, layer: Layer) -> None:
        for leaf, _ in _leaves(path, value):
            self.sources[leaf] = layer.source
            location = _nearest(layer.locations, leaf)
            if location is not None:
                self.locations[leaf] = location

    def _merge(self, dst: dict, src: Mapping, path: str, layer: Layer) -> None:
        for key, value in src.items():
            p = join_path(path, key)
            if _is_omegaconf(value):
                value = omegaconf_to_plain(value, key_path=p)
            if p in NAMED_LISTS and isinstance(value, (list, tuple, Mapping)):
                current = dst.get(key)
                if not isinstance(current, list):
                    if key in dst:
                        self._forget(p)
                    current = dst[key] = []
                self._merge_named(current, value, p, layer)
            elif isinstance(value, Mapping) and not isinstance(value, BaseModel):
                if not isinstance(dst.get(key), dict):
                    if key in dst:
                        self._forget(p)
                    dst[key] = {}
                if not value and not dst[key]:
                    self._record(p, dst[key], layer)
                self._merge(dst[key], value, p, layer)
            else:
                if key in dst:
                    self._forget(p)
                dst[key] = _copy(value)
                self._record(p, dst[key], layer)
            if p in layer.locations:
                self.locations[p] = layer.locations[p]

    def _merge_named(self, current: list, value: Any, path: str, layer: Layer) -> None:
        earlier = {}
        for i, entry in enumerate(current):
            name = entry_name(path, entry)
            if name is not None:
                earlier.setdefault(name, i)
        removed: list[int] = []
        for position, (name, entry) in enumerate(_named_items(path, value)):
            index = earlier.get(name) if name is not None else None
            if name is not None and join_path(path, name) in layer.locations:
                self.locations[join_path(path, name)] = layer.locations[join_path(path, name)]
            if entry is None:  # a mapping entry set to null removes it
                if index is not None:
                    removed.append(index)
                    self._forget(join_path(path, name))
                continue
            if index is None:  # entries within one layer never merge with each other
                current.append(_copy(entry))
                if name is None:  # an unnamed entry: re-index its YAML locations
                    local, merged = join_path(path, position), join_path(path, len(current) - 1)
                    moved = {
                        merged + k[len(local) :]: v
                        for k, v in layer.locations.items()
                        if k == local or k.startswith((local + ".", local + "["))
                    }
                    self._record(merged, current[-1], Layer(layer.source, {}, moved))
                    if merged in moved:
                        self.locations[merged] = moved[merged]
                else:
                    self._record(join_path(path, name), current[-1], layer)
            elif isinstance(entry, Mapping) and isinstance(current[index], dict):
                self._merge(current[index], entry, join_path(path, name), layer)
            else:
                self._forget(join_path(path, name))
                current[index] = _copy(entry)
                self._record(join_path(path, name), current[index], layer)
        for index in sorted(removed, reverse=True):
            del current[index]


def merge_layers(layers: Sequence[Layer]) -> tuple[dict, dict[str, str], dict[str, Location]]:
    """Merge ``layers`` (later wins) into ``(data, sources, locations)``.

    ``sources`` maps each dotted leaf path to its layer's ``source``; ``locations`` maps it to
    the ``(file, line, column)`` its layer knew. Merge rules as in ``merge()``.
    """
    merger = _Merger()
    for layer in layers:
        merger.add(layer)
    return merger.data, merger.sources, merger.locations


def merge(*layers: Mapping[str, Any] | None, at: str = "") -> dict[str, Any]:
    """Merge RunSpec-shaped dicts, later wins; returns a new plain dict.

    ``at`` is the dotted path the layers sit at (``at="alerts"`` merges alerts sections, so
    their rules and channels merge by name); None layers are skipped.

    - Mappings merge deeply.
    - ``alerts.rules`` and ``alerts.channels`` (lists or ``{name: entry}`` mappings) merge by
      entry name (a channel's name defaults to its ``type``; a string rule is its own name):
      a later entry of the same name deep-merges into the earlier one, new names are
      appended, and ``{name: None}`` in mapping form removes that entry. Entries of one
      layer never merge with each other (duplicates are left for validation to report).
    - Every other list, and every other value, is replaced.
    """
    wrapped = [
        Layer(f"layer{i}", _nest(at, d) if at else dict(d))
        for i, d in enumerate(layers)
        if d is not None
    ]
    out: Any = merge_layers(wrapped)[0]
    for part in at.split(".") if at else ():
        out = out.get(part, {})
    return out


def _nearest(table: Mapping[str, Any], path: str) -> Any:
    """``table[path]``, else the entry of the nearest ancestor path, else None."""
    if path in table:
        return table[path]
    best = None
    for key in table:
        if path.startswith((key + ".", key + "[")) and (best is None or len(key) > len(best)):
            best = key
    return table[best] if best is not None else None


def _lookup(table: Mapping[str, Any], path: str) -> Any:
    """Like ``_nearest``, then falling back to the first descendant of ``path``."""
    found = _nearest(table, path)
    if found is None and path:
        for key, value in table.items():
            if key.startswith((path + ".", path + "[")):
                return value
    return found


# --- files ---------------------------------------------------------------------------------


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


def _node_key(key_node: Any) -> Any:
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


def _mapping_entry_key(path: str, data: Mapping, key: Any) -> Any:
    """Path segment of the entry ``key`` of a named list written as a mapping: the entry's
    name as the merge reads it, else its position (a key YAML read as a bool or number)."""
    name = _named_items(path, {key: data[key]})[0][0]
    return name if name is not None else list(data).index(key)


def _yaml_locations(node: Any, data: Any, path: str, file: str, out: dict[str, Location]) -> None:
    if isinstance(node, yaml.MappingNode) and isinstance(data, Mapping):
        named = path in NAMED_LISTS
        for key_node, value_node in node.value:
            key = _node_key(key_node)
            try:
                if key not in data or not (named or isinstance(key, str)):
                    continue
            except TypeError:  # an unhashable key
                continue
            p = join_path(path, _mapping_entry_key(path, data, key) if named else key)
            out[p] = (file, key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _yaml_locations(value_node, data[key], p, file, out)
    elif isinstance(node, yaml.SequenceNode) and isinstance(data, list):
        for i, (item_node, item) in enumerate(zip(node.value, data, strict=False)):
            p = join_path(path, _item_key(path, item, i))
            out[p] = (file, item_node.start_mark.line + 1, item_node.start_mark.column + 1)
            _yaml_locations(item_node, item, p, file, out)


def _load_toml(path: Path) -> Any:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise SpecError(
                [
                    SpecIssue(
                        "",
                        "reading TOML on Python 3.10 needs the `tomli` package "
                        "(pip install tomli), or use a .yaml or .json file",
                        source=f"file:{path}",
                    )
                ]
            ) from None
    with open(path, "rb") as f:
        return tomllib.load(f)


def _key_path(node: Any, data: Any, target: yaml.Mark, path: str) -> str | None:
    """Dotted path of the mapping key written at ``target`` (for duplicate keys)."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = _node_key(key_node)
            p = join_path(path, key)
            if key_node.start_mark is target:
                return p
            try:
                child = data.get(key) if isinstance(data, Mapping) else None
            except TypeError:
                child = None
            found = _key_path(value_node, child, target, p)
            if found is not None:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item_node in enumerate(node.value):
            item = data[i] if isinstance(data, list) and i < len(data) else None
            found = _key_path(item_node, item, target, join_path(path, _item_key(path, item, i)))
            if found is not None:
                return found
    return None


def _package(node: Any, data: Any, package: str | None, file: str, source: str) -> tuple:
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
        found = None
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if _node_key(key_node) == key:
                    found = value_node
        node = found
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        msg = f"the section {package!r} of {file} must be a mapping, not {type(data).__name__}"
        raise SpecError([SpecIssue("", msg, source=source)])
    return node, data


def load_file(
    path: str | os.PathLike,
    *,
    source: str | None = None,
    root: str = "",
    package: str | None = None,
) -> tuple[dict[str, Any], dict[str, Location]]:
    """Read a spec file: ``.yaml``/``.yml`` (safe loader), ``.json`` or ``.toml``.

    Args:
        path: the file; another suffix is read as YAML (which also reads JSON).
        source: provenance string put on errors (default ``"file:<path>"``).
        root: the dotted path the file's top level sits at, for ``locations``.
        package: a dotted section of the file to read instead of its top level (a Hydra
            app's config: ``"tracker"``); locations stay those of the file.

    Returns:
        ``(data, locations)``: the top-level mapping (``{}`` for an empty file) and, for
        YAML, dotted path (under ``root``) -> ``(file, line, column)``.

    Raises:
        SpecError: the file is missing or unreadable, does not parse (with its line and
            column), or its top level is not a mapping.
    """
    p = Path(path)
    file = str(path)
    source = source or f"file:{file}"
    locations: dict[str, Location] = {}
    duplicates: list[tuple[Any, yaml.Mark, yaml.Mark]] = []
    node = data = None
    suffix = p.suffix.lower()
    try:
        if suffix == ".json":
            text = p.read_text(encoding="utf-8")
            data = json.loads(text)
            try:  # JSON is (nearly always) YAML: its node marks give line and column
                node, _, duplicates = compose_unique(text)
                node, data = _package(node, data, package, file, source)
                _yaml_locations(node, data, root, file, locations)
            except yaml.YAMLError:
                locations.clear()
        elif suffix == ".toml":
            _, data = _package(None, _load_toml(p), package, file, source)
        else:
            text = p.read_text(encoding="utf-8")
            node, data, duplicates = compose_unique(text)
            node, data = _package(node, data, package, file, source)
            _yaml_locations(node, data, root, file, locations)
    except SpecError:
        raise
    except FileNotFoundError:
        raise SpecError([SpecIssue(root, f"file not found: {file}", source=source)]) from None
    except OSError as exc:
        msg = f"cannot read {file}: {exc.strerror or exc}"
        raise SpecError([SpecIssue(root, msg, source=source)]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = (file, mark.line + 1, mark.column + 1) if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(
            [SpecIssue(root, f"invalid YAML: {problem}", source=source, location=where)]
        ) from None
    except json.JSONDecodeError as exc:
        raise SpecError(
            [
                SpecIssue(
                    root,
                    f"invalid JSON: {exc.msg}",
                    source=source,
                    location=(file, exc.lineno, exc.colno),
                )
            ]
        ) from None
    except ValueError as exc:  # tomllib.TOMLDecodeError
        raise SpecError([SpecIssue(root, f"invalid TOML: {exc}", source=source)]) from None
    if duplicates:
        raise SpecError(
            [
                SpecIssue(
                    _key_path(node, data, mark, root) or root,
                    duplicate_key_message(key, first),
                    source=source,
                    location=(file, mark.line + 1, mark.column + 1),
                )
                for key, mark, first in duplicates
            ]
        )
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise SpecError(
            [
                SpecIssue(
                    root,
                    f"the top level of {file} must be a mapping, not {type(data).__name__}",
                    source=source,
                    location=(file, 1, 1),
                )
            ]
        )
    return dict(data), locations


def _alerts_section(data: Mapping[str, Any], source: str, location_of=None) -> dict[str, Any]:
    """An alerts-file's content as RunSpec data: its top level is the ``alerts`` section,
    or a mapping whose only key is ``alerts``."""
    if "alerts" in data:
        others = [k for k in data if k != "alerts"]
        if others:
            issues = [
                SpecIssue(
                    str(k),
                    "unexpected key: an alerts file holds either the alerts section itself "
                    "or a mapping with only an `alerts` key",
                    source=source,
                    location=location_of(str(k)) if location_of else None,
                )
                for k in others
            ]
            raise SpecError(issues)
        section = data["alerts"]
        if section is None:
            section = {}
        return {"alerts": section}
    return {"alerts": dict(data)}


#: the section of a Hydra app's config that holds the tracker's spec (``+tracker=...``)
APP_PACKAGE = "tracker"


def app_package(data: Any) -> str | None:
    """The section of a file holding the run spec, from the file's top level ``data``:
    ``"tracker"`` when it has a top-level ``tracker:`` mapping (a Hydra app's config, as
    ``python app.py --cfg job`` prints it; no spec has that key), else None (the file is
    the spec). Used by ``et.init(spec=PATH)``, ``ET_CONFIG`` and the CLI commands reading
    a file (``et config validate``, ``et rules check`` ...) alike."""
    if (
        isinstance(data, Mapping)
        and isinstance(data.get(APP_PACKAGE), Mapping)
        and APP_PACKAGE not in RunSpec.model_fields
    ):
        return APP_PACKAGE
    return None


def _file_layer(
    path: str | os.PathLike,
    source: str,
    kind: str,
    package: str | None = None,
    *,
    find_package: bool = False,
) -> Layer:
    """``find_package``: with no ``package``, read a Hydra app config's ``tracker:``
    section (``app_package``)."""
    file = os.fspath(path)
    if kind == "run" and package is None and find_package:
        data, locations = load_file(file, source=source)
        package = app_package(data)
        if package is None:
            return Layer(source, data, locations)
    if kind == "alerts":
        probe, _ = load_file(file, source=source, package=package)
        wrapped = "alerts" in probe
        root = "" if wrapped else "alerts"
        data, locations = load_file(file, source=source, root=root, package=package)
        data = _alerts_section(data, source, locations.get)
    else:
        data, locations = load_file(file, source=source, package=package)
    return Layer(source, data, locations)


def file_layer(path: str | os.PathLike, kind: str = "run", package: str | None = None) -> Layer:
    """A spec file as a layer (source ``"file:<path>"``) to give ``resolve(spec=...)``:
    ``kind`` ``"run"`` (a RunSpec) or ``"alerts"``; ``package`` a dotted section of the file
    (``"tracker"`` in a Hydra app's config), as ``load_file``.

    Raises:
        SpecError: as ``load_file``.
    """
    return _file_layer(path, f"file:{os.fspath(path)}", kind, package)


def alert_config_layer(path: str | os.PathLike) -> Layer:
    """The ``ET_ALERT_CONFIG`` file (its ``alerts``), source ``"ET_ALERT_CONFIG:<path>"``.

    Raises:
        SpecError: as ``load_file``, or when a file with an ``alerts`` key holds others too.
    """
    return _file_layer(path, f"{ALERT_CONFIG_ENV}:{os.fspath(path)}", "alerts")


def config_file_layer(path: str | os.PathLike) -> Layer:
    """The ``ET_CONFIG`` file (a whole RunSpec, or a Hydra app's config whose top-level
    ``tracker:`` section is read: ``app_package``), source ``"ET_CONFIG:<path>"``.

    Raises:
        SpecError: as ``load_file``.
    """
    return _file_layer(path, f"{CONFIG_ENV}:{os.fspath(path)}", "run", find_package=True)


def env_layers(environ: Mapping[str, str]) -> list[Layer]:
    """One layer per webhook variable set in ``environ`` (empty values ignored), each a
    channel ``{type, url}`` with source ``"env:<VARIABLE>"``. ``WEBHOOK_URL`` (legacy) comes
    before ``ET_LARK_WEBHOOK_URL``, so the latter wins for the ``lark`` channel."""
    layers = []
    for variable, channel_type in WEBHOOK_ENV:
        url = environ.get(variable)
        if url and url.strip():
            channel = {"type": channel_type, "url": url.strip()}
            layers.append(Layer(f"env:{variable}", {"alerts": {"channels": [channel]}}))
    return layers


def configure_alert_layer(values: Mapping[str, Any]) -> Layer:
    """``et.configure_alert(...)`` values: the ``alerts`` section (or ``{"alerts": {...}}``).

    Raises:
        SpecError: ``values`` is not a mapping.
    """
    if not isinstance(values, Mapping):
        raise SpecError(
            [
                SpecIssue(
                    "alerts",
                    "configure_alert values must be a mapping",
                    values,
                    source="configure_alert",
                )
            ]
        )
    return Layer("configure_alert", _alerts_section(_copy(values), "configure_alert"))


def _omegaconf_to_dict(cfg: Any) -> tuple[dict[str, Any], str | None]:
    """Resolve a DictConfig to a plain dict, reporting every broken interpolation and every
    missing (``???``) value at once, by their full config key. Inside ``config`` (the user's
    own values) a broken interpolation stays literal with a warning instead."""
    from omegaconf import DictConfig
    from omegaconf.errors import MissingMandatoryValue

    prefix = cfg._get_full_key("") or None
    issues: list[SpecIssue] = []

    def on_error(key_path: str, exc: Exception, raw: Any) -> Any:
        if (key_path == "config" or key_path.startswith("config.")) and not isinstance(
            exc, MissingMandatoryValue
        ):
            return _keep_literal(key_path, exc, raw)
        if isinstance(exc, MissingMandatoryValue):
            message = "is required: it is marked missing (???) in the config"
        else:
            reason = str(getattr(exc, "msg", exc)).splitlines()[0]
            message = f"interpolation {raw!r} could not be resolved: {reason}"
        issues.append(
            SpecIssue(
                key_path,
                message,
                source="spec",
                config_key=f"{prefix}.{key_path}" if prefix else key_path,
            )
        )
        return _SKIP

    if cfg is None or (isinstance(cfg, DictConfig) and cfg._is_none()):
        return {}, prefix
    if not isinstance(cfg, DictConfig):
        raise SpecError(
            [SpecIssue("", "spec must be a mapping (a DictConfig), not a list", source="spec")]
        )
    data = omegaconf_to_plain(cfg, on_error)
    if issues:
        raise SpecError(issues)
    return data, prefix


def spec_layer(spec: Any) -> Layer | None:
    """The ``spec=`` given to ``et.init``: a YAML/JSON/TOML path (``str`` or ``Path``;
    source ``"file:<path>"``; a Hydra app's config file gives its top-level ``tracker:``
    section, ``app_package``), a dict or an OmegaConf DictConfig (resolved; source
    ``"spec"``), or a ``RunSpec`` (only the values set on it). None gives None.

    Raises:
        SpecError: an unreadable or invalid file, a broken interpolation or missing value
            (named by its config key), or another type.
    """
    if spec is None:
        return None
    if isinstance(spec, Layer):  # file_layer(): a section of a file
        return spec
    if isinstance(spec, (str, os.PathLike)):
        path = os.fspath(spec)
        return _file_layer(path, f"file:{path}", "run", find_package=True)
    if isinstance(spec, RunSpec):
        return Layer("spec", spec.model_dump(exclude_unset=True))
    if _is_omegaconf(spec):
        data, prefix = _omegaconf_to_dict(spec)
        return Layer("spec", data, config_key=prefix)
    if isinstance(spec, Mapping):
        return Layer("spec", _copy(spec))
    raise SpecError(
        [
            SpecIssue(
                "",
                "spec must be a path to a YAML/JSON/TOML file, a dict, an OmegaConf "
                f"DictConfig or a RunSpec, not {type(spec).__name__}",
                source="spec",
            )
        ]
    )


def _nest(path: str, value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return out


def kwargs_to_dict(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Map ``et.init`` keyword arguments onto a RunSpec-shaped dict through ``KEYWORDS``.

    ``spans=`` and ``alert=`` take a bool (``spans.enabled``/``alerts.enabled``) or a mapping
    (the whole section, merged deeply); a single string or object given as ``alert_rules``
    or ``span_plugins`` becomes a one-item list. Section-wide arguments apply first, so a
    flat keyword beats the same value inside ``alert={...}``. Pass only the arguments the
    caller actually gave: ``None`` is a value (``max_open_seconds=None`` disables).

    Raises:
        SpecError: listing every unknown keyword, each with close matches.
    """
    issues = []
    pieces: list[tuple[int, dict]] = []
    valid = sorted(set(KEYWORDS) | set(RunSpec.model_fields))
    for key, value in kwargs.items():
        if key == "spans" and isinstance(value, Mapping):
            target = "spans"
        elif key == "alert" and isinstance(value, bool):
            target = "alerts.enabled"
        elif key in KEYWORDS:
            target = KEYWORDS[key]
        elif key in RunSpec.model_fields:
            target = key
        else:
            issues.append(
                SpecIssue(
                    key,
                    "unknown keyword argument of et.init()",
                    suggestion=suggest(key, valid),
                    source="init",
                )
            )
            continue
        if target == "alerts.rules" and isinstance(value, (str, BaseModel)):
            value = [value]
        if target == "spans.plugins" and value is not None and not isinstance(value, (list, tuple)):
            value = [value]
        if isinstance(value, tuple):
            value = list(value)
        pieces.append((target.count("."), _nest(target, value)))
    if issues:
        raise SpecError(issues, title="invalid et.init() arguments")
    pieces.sort(key=lambda piece: piece[0])  # whole sections first, then single values
    return merge(*(p for _, p in pieces))


# --- resolve -------------------------------------------------------------------------------


def _jsonable(value: Any, free_form: bool, depth: int = 0) -> Any:
    if isinstance(value, (SecretStr, SecretBytes)):
        return "***"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if isinstance(value, Mapping) and depth < 64:
        return {
            str(k): _redact_all(v)
            if free_form and str(k).lower() == "headers" and isinstance(v, Mapping)
            else "***"
            if free_form and is_secret_key(k) and v is not None
            else _jsonable(v, free_form, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)) and depth < 64:
        return [_jsonable(v, free_form, depth + 1) for v in value]
    return repr(value)


def _redact_all(headers: Mapping) -> dict[str, Any]:
    """HTTP headers: every value hidden (Authorization, X-Api-Key, cookies ... carry secrets
    under any name)."""
    return {str(k): "***" if v is not None else None for k, v in headers.items()}


@dataclass(frozen=True)
class ResolvedSpec:
    """The validated spec and where each value came from.

    Attributes:
        spec: the frozen ``RunSpec`` (``name`` filled by
            :func:`~expr_tracker.spec.names.default_run_name` when no source gave one: a
            ``YYYYmmdd-HHMMSS-xxxxxx`` timestamp and random suffix, shared by the ranks of
            one ``torchrun`` launch).
        sources: dotted leaf path -> provenance string, for every leaf of ``spec``
            (``"default"`` where no source gave the value).
        locations: dotted path -> ``(file, line, column)`` for values read from YAML.
    """

    spec: RunSpec
    sources: dict[str, str]
    locations: dict[str, Location] = field(default_factory=dict)

    def source_of(self, path: str) -> str:
        """Provenance of ``path`` (a leaf, or the nearest enclosing value that has one)."""
        found = _lookup(self.sources, path)
        return found if found is not None else "default"

    def redacted(self) -> dict[str, Any]:
        """The spec as a JSON-able dict: secrets (``SecretStr`` fields, and keys matching
        password|token|secret|webhook|url|api_key inside ``options`` and ``backends``) are
        ``"***"``; ``config`` is redacted as ``config.json`` is (``redact_config``: credential
        keys, headers, ``user:password@`` of URLs, webhook URLs); callables and plugin
        objects are their ``repr``."""
        dumped = self.spec.model_dump()
        out = {}
        for key, value in dumped.items():
            if key == "config":  # as config.json: credentials hidden, hyper-parameters kept
                out[key] = _jsonable(redact_config(value), free_form=False)
            else:
                out[key] = _jsonable(value, free_form=key == "backends")
        for section in ("spans", "alerts"):
            out[section] = _redact_options(dumped[section], section)
        return out

    def rows(self) -> list[tuple[str, Any, str, Location | None]]:
        """``(path, redacted value, source, location)`` for every leaf, for ``et config show``."""
        redacted = self.redacted()
        rows = []
        for path, value in _leaves("", redacted):
            rows.append((path, value, self.source_of(path), _nearest(self.locations, path)))
        return rows


def _redact_options(value: Any, path: str) -> Any:
    """JSON-able section with free-form ``options`` mappings redacted by key."""
    if isinstance(value, Mapping):
        out = {}
        for key, child in value.items():
            child_path = f"{path}.{key}"
            if key == "options" and isinstance(child, Mapping):
                out[key] = _jsonable(child, free_form=True)
            else:
                out[key] = _redact_options(child, child_path)
        return out
    if isinstance(value, (list, tuple)):
        return [_redact_options(v, path) for v in value]
    return _jsonable(value, free_form=False)


def _validate(
    merged: dict,
    sources: Mapping[str, str],
    locations: Mapping[str, Location],
    layers: Sequence[Layer],
) -> tuple[RunSpec | None, list[SpecIssue]]:
    by_source = {layer.source: layer for layer in layers}

    def source_of(path: str) -> str | None:
        return _lookup(sources, path)

    def location_of(path: str) -> Location | None:
        found = _lookup(locations, path)
        source = source_of(path)
        if found is not None and source and not source.endswith(":" + found[0]):
            return None  # an enclosing value's place in a file this value did not come from
        return found

    try:
        return RunSpec.model_validate(merged), []
    except ValidationError as exc:
        issues = issues_from_validation_error(
            exc,
            merged,
            root=RunSpec,
            item_key=_item_key,
            source_of=source_of,
            location_of=location_of,
        )
    out = []
    for issue in issues:
        layer = by_source.get(issue.source or "")
        if layer is not None and layer.config_key:
            issue = _with(issue, config_key=f"{layer.config_key}.{issue.path}")
        out.append(issue)
    return None, out


def _with(issue: SpecIssue, **changes: Any) -> SpecIssue:
    from dataclasses import replace

    return replace(issue, **changes)


def resolve(
    spec: Any = None,
    *,
    kwargs: Mapping[str, Any] | None = None,
    configure_alert: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ResolvedSpec:
    """Build the run's spec from every source, validate it once, and keep provenance.

    Args:
        spec: ``et.init(spec=...)``: a YAML/JSON/TOML path, a dict, an OmegaConf DictConfig
            (interpolations resolved) or a RunSpec; None for none.
        kwargs: the keyword arguments the caller gave ``et.init`` (flat names per ``KEYWORDS``).
        configure_alert: the values given to ``et.configure_alert()`` (the alerts section).
        environ: environment variables (default ``os.environ``): webhook URLs,
            ``ET_ALERT_CONFIG`` and ``ET_CONFIG``.

    Returns:
        ResolvedSpec.

    Raises:
        SpecError: listing every problem of every source at once, each with its path, the
            value, what is valid, its source, and ``file:line:column`` for YAML.
    """
    environ = os.environ if environ is None else environ
    issues: list[SpecIssue] = []
    layers: list[Layer] = [Layer("default", {})]
    layers += env_layers(environ)

    def add(make, *args: Any) -> None:
        try:
            layer = make(*args)
        except SpecError as exc:
            issues.extend(exc.issues)
            return
        if layer is not None:
            layers.append(layer)

    alert_file = environ.get(ALERT_CONFIG_ENV)
    if alert_file:
        add(alert_config_layer, alert_file)
    config_file = environ.get(CONFIG_ENV)
    if config_file:
        add(config_file_layer, config_file)
    if configure_alert:
        add(configure_alert_layer, configure_alert)
    add(spec_layer, spec)
    if kwargs:
        add(lambda kw: Layer("init", kwargs_to_dict(kw)), kwargs)

    merged, sources, locations = merge_layers(layers)
    model, problems = _validate(merged, sources, locations, layers)
    issues.extend(problems)
    if issues or model is None:
        raise SpecError(issues)
    if model.name is None:
        model = model.model_copy(update={"name": default_run_name(environ)})
    final = {
        path: sources.get(path) or _nearest(sources, path) or "default"
        for path, _ in _leaves("", model.model_dump())
    }
    return ResolvedSpec(model, final, dict(locations))


def validate_file(
    path: str | os.PathLike, kind: str = "run", package: str | None = None
) -> list[SpecIssue]:
    """Check one spec file on its own, for ``et config validate`` and ``et rules check``.

    Args:
        path: a YAML/JSON/TOML file.
        kind: ``"run"`` (a whole RunSpec) or ``"alerts"`` (the alerts section, or a mapping
            with an ``alerts`` key).
        package: a dotted section of the file holding the spec (``"tracker"``), as
            ``load_file``.

    Returns:
        Every problem (empty when valid); YAML problems carry ``location`` (file, line, col).

    Raises:
        ValueError: ``kind`` is neither ``"run"`` nor ``"alerts"``.
    """
    try:
        resolve_file(path, kind, package)
    except SpecError as exc:
        return exc.issues
    return []


def resolve_file(
    path: str | os.PathLike, kind: str = "run", package: str | None = None
) -> ResolvedSpec:
    """One spec file on its own (no environment, no other source) as a ``ResolvedSpec``,
    for ``et config validate`` to run the checks ``et.init`` runs (``build.check``).

    Args:
        path: a YAML/JSON/TOML file.
        kind: ``"run"`` (a whole RunSpec) or ``"alerts"`` (the alerts section, or a mapping
            with an ``alerts`` key).
        package: a dotted section of the file holding the spec (``"tracker"``), as
            ``load_file``.

    Raises:
        SpecError: every problem (YAML problems carry ``location``).
        ValueError: ``kind`` is neither ``"run"`` nor ``"alerts"``.
    """
    if kind not in ("run", "alerts"):
        raise ValueError(f"kind must be 'run' or 'alerts', not {kind!r}")
    file = os.fspath(path)
    layer = _file_layer(file, f"file:{file}", kind, package)
    merged, sources, locations = merge_layers([layer])
    model, issues = _validate(merged, sources, locations, [layer])
    if issues or model is None:
        raise SpecError(issues)
    final = {
        p: sources.get(p) or _nearest(sources, p) or "default"
        for p, _ in _leaves("", model.model_dump())
    }
    return ResolvedSpec(model, final, dict(locations))
