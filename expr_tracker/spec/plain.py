"""The parts of the run spec that need no Pydantic: the lists whose entries merge by name,
file-system name checks, OmegaConf containers as plain data, ``config`` as plain data.

``et.init`` reads a plain spec without importing Pydantic (docs/architecture.md "Cold
start"), so merging and the quick check (``spec.quick``) import only this module;
``spec.fields`` builds the Pydantic field types on top of it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from typing import Any

from expr_tracker.ruletext import ACTIONS, split_for, split_rule


def is_model(value: Any) -> bool:
    """Whether ``value`` is a Pydantic model, without importing Pydantic: when it is not
    imported yet, no object can be one."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(value, pydantic.BaseModel)


def is_secret(value: Any) -> bool:
    """Whether ``value`` is a Pydantic ``SecretStr``/``SecretBytes`` (as :func:`is_model`)."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(value, (pydantic.SecretStr, pydantic.SecretBytes))


# --- lists of named things ----------------------------------------------------------------

#: Dotted paths of the lists whose entries merge by name (and may be written as mappings).
NAMED_LISTS: frozenset[str] = frozenset({"alerts.rules", "alerts.channels"})


def entry_name(list_path: str, entry: Any) -> str | None:
    """Name of an entry of a named list: its ``name``; for channels, else its ``type``;
    a string rule is its own name. None when the entry has no name."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, Mapping):
        name = entry.get("name")
        if name is None and list_path.endswith("channels"):
            name = entry.get("type")
        return name if isinstance(name, str) and name else None
    name = getattr(entry, "name", None)
    return name if isinstance(name, str) else None


def named_entries(value: Any) -> Any:
    """Normalise a named list written as a mapping ``{name: entry}`` to a list of entries
    (each as :func:`named_entry` makes it; a ``None`` entry is dropped: how a later source
    removes an entry). Lists and anything else are returned unchanged."""
    if not isinstance(value, Mapping):
        return value
    return [named_entry(key, entry) for key, entry in value.items() if entry is not None]


def named_entry(key: Any, entry: Any) -> Any:
    """One entry of a named list written as a mapping, with its name from ``key``.

    A mapping gets ``name`` filled from the key (an explicit ``name`` wins). A string is a
    rule in the one-line form (``"cond => level: message"``, read as ``et rules check`` and
    ``AlertRule.parse`` read it) and becomes ``{"name": key, "condition": cond, "level":
    level, "message": message}`` (level and message only when written). Anything else is
    returned unchanged.
    """
    if isinstance(entry, str):
        return {"name": key, **_one_line_rule(entry)}
    if isinstance(entry, Mapping):
        return {"name": key, **entry} if entry.get("name") is None else dict(entry)
    return entry


def _one_line_rule(text: str) -> dict[str, Any]:
    cond, level, message = split_rule(text)
    out: dict[str, Any] = {"condition": cond if level is not None else text}
    if level is not None:
        cond, steps = split_for(cond)
        if steps is not None and steps.isdigit():  # else left to the condition's check
            out["condition"], out["for_steps"] = cond, int(steps)
        if level.lower() in ACTIONS:
            out["action"] = level.lower()
        else:
            out["level"] = level
    if message is not None:
        out["message"] = message
    return out


_UNSAFE_NAME = re.compile(r"[/\\\x00-\x1f\x7f]")
_STREAM = re.compile(r"^[A-Za-z0-9_\-]+$")
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_RANK_LIKE = re.compile(r"^rank[0-9]+$", re.IGNORECASE)
#: bound on ``project`` and ``name`` (each one directory name; 255 is the usual file system
#: limit, the rest is room for names built from them, such as Hydra job names)
MAX_NAME_BYTES = 200
#: bound on ``stream``: ``.metrics.<stream>.rank<N>.meta.json.<pid>.<thread>.tmp`` (the
#: sidecar's temporary name, the longest file a producer writes) stays under 255 bytes
MAX_STREAM_CHARS = 64


def check_fs_name(value: Any) -> Any:
    if value is None or not isinstance(value, str):
        return value
    if not value or value.strip() != value or value in (".", "..") or _UNSAFE_NAME.search(value):
        raise ValueError(
            "must be a non-empty name usable as one directory: no '/', '\\', control "
            "characters or surrounding spaces, and not '.' or '..'"
        )
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise ValueError(
            f"must be at most {MAX_NAME_BYTES} bytes in UTF-8 (this one has {size}): it names "
            "a directory, and file systems allow 255 bytes per name, with room kept for the "
            "names made from it"
        )
    return value


def check_stream_name(value: Any) -> Any:
    if value is None or not isinstance(value, str):
        return value
    if not _STREAM.match(value):
        raise ValueError(
            "must be letters, digits, '_' or '-' only (a stream names files inside the run "
            "directory, so '/', '.' and '..' are not allowed)"
        )
    if len(value) > MAX_STREAM_CHARS:
        raise ValueError(
            f"must be at most {MAX_STREAM_CHARS} characters (this one has {len(value)}): every "
            "file of the stream (metrics.<stream>.rankN.meta.json, its lock and temporary "
            "names) must fit the file system's 255-byte name limit"
        )
    if _RANK_LIKE.match(value):
        raise ValueError(
            f"{value!r} would be read as a rank suffix (metrics.{value}.jsonl is the file of "
            "rank " + value[4:] + " of the main stream): choose another stream name, e.g. "
            f"'w{value}' or 'worker{value[4:]}'"
        )
    return value


def path_str(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def is_omegaconf(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "omegaconf"


def keep_literal(key_path: str, exc: Exception, raw: Any) -> Any:
    import warnings

    reason = str(getattr(exc, "msg", exc)).splitlines()[0]
    warnings.warn(
        f"{key_path}: interpolation {raw!r} could not be resolved ({reason}); kept literally",
        stacklevel=4,
    )
    return raw


def omegaconf_to_plain(
    node: Any, on_error: Any = None, key_path: str = "", skip: Any = None
) -> Any:
    """An OmegaConf DictConfig/ListConfig as plain dicts/lists, each value resolved on its own.

    Args:
        node: the container (anything else is returned unchanged).
        on_error: ``on_error(key_path, exc, raw) -> value`` for a value that cannot be resolved
            (a broken interpolation; ``raw`` is its text) or is missing (``???``; ``raw`` is
            ``"???"``); return ``SKIP`` to leave the key out. Default: keep the raw text,
            with one warning naming the key.
        key_path: dotted key of ``node`` (for messages).
        skip: a container node left out wherever it appears below ``node`` (found by
            identity: the node itself, or an interpolation that resolves to it).
    """
    from omegaconf import DictConfig, ListConfig, OmegaConf

    on_error = on_error or keep_literal
    if isinstance(node, DictConfig):
        if node._is_none():
            return None
        keys: list[Any] = list(node.keys())
        out: Any = {}
    elif isinstance(node, ListConfig):
        if node._is_none():
            return None
        keys = list(range(len(node)))
        out = []
    else:
        return node
    for key in keys:
        child_path = f"{key_path}.{key}" if key_path else str(key)
        if skip is not None and node._get_node(key) is skip:
            continue  # before resolving: nothing of the skipped node is read
        try:
            value = node[key]
        except Exception as exc:  # InterpolationResolutionError, MissingMandatoryValue, ...
            raw = node._get_node(key)._value()
            value = on_error(child_path, exc, raw)
            if value is SKIP:
                continue
        if skip is not None and value is skip:
            continue
        if OmegaConf.is_config(value):
            value = omegaconf_to_plain(value, on_error, child_path, skip)
        if isinstance(out, dict):
            out[key] = value
        else:
            out.append(value)
    return out


SKIP: Any = object()


def config_to_dict(value: Any) -> Any:
    """Accept OmegaConf containers, argparse namespaces, dataclasses and models as ``config``.

    An OmegaConf interpolation that cannot be resolved stays literal, with a warning.
    """
    if value is None:
        return {}
    if is_omegaconf(value):
        return omegaconf_to_plain(value, key_path="config")
    if is_model(value):
        return value.model_dump()
    if hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        import dataclasses

        return dataclasses.asdict(value)
    if type(value).__name__ == "Namespace" and hasattr(value, "__dict__"):
        return dict(vars(value))
    return value


def alerts_data(value: Any) -> Any:
    """Alert configuration as plain data: every pydantic model in ``value`` (``AlertsSpec``,
    ``ChannelSpec``, ``PolicySpec``, ``RuleSpec`` ..., at any depth of dicts and lists)
    becomes the dict of the fields set on it (``model_dump(exclude_unset=True)``: defaults
    it did not set leave lower-precedence sources alone; secrets stay ``SecretStr``).
    Anything else is returned as it is."""
    if is_model(value):
        return value.model_dump(exclude_unset=True)
    if isinstance(value, Mapping):
        return {k: alerts_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [alerts_data(v) for v in value]
    return value
