"""Merging RunSpec-shaped layers, later wins, remembering where every leaf came from.

``merge_layers()`` folds ``Layer`` objects into ``(data, sources, locations)``; ``merge()``
folds plain dicts. Mappings merge deeply; ``alerts.rules`` and ``alerts.channels`` merge by
entry name; every other value is replaced (docs/configuration.md "Configuration reference").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from expr_tracker.spec.errors import join_path
from expr_tracker.spec.plain import (
    NAMED_LISTS,
    entry_name,
    is_model,
    is_omegaconf,
    named_entry,
    omegaconf_to_plain,
)

__all__ = ["Layer", "Location", "item_key", "leaves", "lookup", "merge", "merge_layers", "nearest"]

#: ``(file, line, column)``, 1-based, of a value read from YAML.
Location = tuple[str, int, int]


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


def item_key(list_path: str, item: Any, index: int) -> Any:
    if list_path in NAMED_LISTS:
        name = entry_name(list_path, item)
        if name is not None:
            return name
    return index


def leaves(path: str, value: Any) -> Iterator[tuple[str, Any]]:
    """(path, value) of every leaf: mappings recurse, named lists recurse by entry name,
    other lists and empty mappings are leaves."""
    if isinstance(value, Mapping) and value and not is_model(value):
        for key, child in value.items():
            yield from leaves(join_path(path, key), child)
    elif isinstance(value, (list, tuple)) and path in NAMED_LISTS and value:
        for i, item in enumerate(value):
            yield from leaves(join_path(path, item_key(path, item, i)), item)
    else:
        yield path, value


def copy_plain(value: Any) -> Any:
    """Copy the containers of a plain-data value; leave every other object as it is."""
    if is_omegaconf(value):
        return omegaconf_to_plain(value)
    if isinstance(value, Mapping) and not is_model(value):
        return {k: copy_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_plain(v) for v in value]
    return value


def named_items(list_path: str, value: Any) -> list[tuple[Any, Any]]:
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
        for leaf, _ in leaves(path, value):
            self.sources[leaf] = layer.source
            location = nearest(layer.locations, leaf)
            if location is not None:
                self.locations[leaf] = location

    def _merge(self, dst: dict, src: Mapping, path: str, layer: Layer) -> None:
        for key, value in src.items():
            p = join_path(path, key)
            if is_omegaconf(value):
                value = omegaconf_to_plain(value, key_path=p)
            if p in NAMED_LISTS and isinstance(value, (list, tuple, Mapping)):
                current = dst.get(key)
                if not isinstance(current, list):
                    if key in dst:
                        self._forget(p)
                    current = dst[key] = []
                self._merge_named(current, value, p, layer)
            elif isinstance(value, Mapping) and not is_model(value):
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
                dst[key] = copy_plain(value)
                self._record(p, dst[key], layer)
            if p in layer.locations:
                self.locations[p] = layer.locations[p]

    def _merge_named(self, current: list, value: Any, path: str, layer: Layer) -> None:
        earlier: dict[str, Any] = {}
        for i, entry in enumerate(current):
            name = entry_name(path, entry)
            if name is not None:
                earlier.setdefault(name, i)
        removed: list[int] = []
        for position, (name, entry) in enumerate(named_items(path, value)):
            index = earlier.get(name) if name is not None else None
            if name is not None and join_path(path, name) in layer.locations:
                self.locations[join_path(path, name)] = layer.locations[join_path(path, name)]
            if entry is None:  # a mapping entry set to null removes it
                if index is not None:
                    removed.append(index)
                    self._forget(join_path(path, name))
                continue
            if index is None:  # entries within one layer never merge with each other
                current.append(copy_plain(entry))
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
                current[index] = copy_plain(entry)
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
        Layer(f"layer{i}", nest_path(at, d) if at else dict(d))
        for i, d in enumerate(layers)
        if d is not None
    ]
    out: Any = merge_layers(wrapped)[0]
    for part in at.split(".") if at else ():
        out = out.get(part, {})
    return out


def nearest(table: Mapping[str, Any], path: str) -> Any:
    """``table[path]``, else the entry of the nearest ancestor path, else None."""
    if path in table:
        return table[path]
    best = None
    for key in table:
        if path.startswith((key + ".", key + "[")) and (best is None or len(key) > len(best)):
            best = key
    return table[best] if best is not None else None


def lookup(table: Mapping[str, Any], path: str) -> Any:
    """Like ``nearest``, then falling back to the first descendant of ``path``."""
    found = nearest(table, path)
    if found is None and path:
        for key, value in table.items():
            if key.startswith((path + ".", path + "[")):
                return value
    return found


def nest_path(path: str, value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return out
