"""A plain spec checked without Pydantic, so that ``et.init`` starts in milliseconds.

Pydantic is the source of truth: importing it and building the spec models costs about
200 ms, which a run that names a project, a folder and its hyper-parameters should not pay
(docs/architecture.md "Cold start"). :func:`quick_check` accepts a merged spec only when
every value in it is one the models are known to accept unchanged (a table of leaves, each
with the same test as its field) and returns what ``RunSpec.model_validate(merged)
.model_dump()`` returns; for anything else, a wrong value included, it returns None and
the caller validates with Pydantic, whose error names the field, the value and what is
valid. Nothing here ever raises on bad input and nothing is cached on disk.

:class:`SpecView` stands for the ``RunSpec`` of such a spec inside the runtime: attribute
access, ``model_dump()``, ``model_copy(update=)``, ``model_fields_set``; anything else
builds the real model (``materialize()``). ``tests/spec/test_spec_quick.py`` keeps the
table, :data:`DEFAULTS` and the models equal.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import PurePath
from typing import Any

from expr_tracker.spec.mirroring import BACKEND_TYPES, backends_as_list
from expr_tracker.spec.plain import check_fs_name, check_stream_name, config_to_dict

__all__ = ["DEFAULTS", "LEAVES", "SECTIONS", "SpecView", "quick_check"]

#: ``RunSpec().model_dump()``: every default of the spec (a test keeps it equal).
DEFAULTS: dict[str, Any] = {
    "project": "default",
    "name": None,
    "dir": "./runs",
    "run_dir": None,
    "group": None,
    "tags": [],
    "notes": None,
    "entity": None,
    "job_type": None,
    "mode": "offline",
    "stream": None,
    "resume": "allow",
    "config": {},
    "history": {
        "step_policy": "monotonic",
        "max_open_seconds": 60.0,
        "rank_aware": True,
        "cache": {"bytes": 1073741824, "rows": 2000000},
        "buffer": {"size": 50, "interval": 1.0, "max_seconds": 5.0, "max_pending_records": 100000},
        "alert_window": 4096,
        "query_cache": True,
    },
    "spans": {
        "enabled": True,
        "metrics": True,
        "count": False,
        "print": None,
        "async_write": True,
        "plugins": [],
        "buffer": {"size": 50, "interval": 1.0, "max_seconds": 5.0, "max_pending_records": 100000},
        "max_record_bytes": 8388608,
        "max_pending_bytes": 67108864,
    },
    "alerts": {
        "enabled": True,
        "rules": [],
        "channels": [],
        "policy": {
            "rate_limit_per_minute": 20.0,
            "dedup_window": 300.0,
            "max_retries": 3,
            "backoff_initial": 0.5,
            "backoff_factor": 2.0,
            "backoff_max": 30.0,
            "jitter": 0.1,
            "timeout": 10.0,
            "queue_size": 1000,
            "on_queue_full": "drop_oldest",
            "on_rate_limited": "coalesce",
            "respect_retry_after": True,
            "retry_on_status": [408, 429, 500, 502, 503, 504],
            "async_send": True,
            "fail_silently": True,
        },
        "on_rank": 0,
        "notify_on": [],
        "watchdog_interval": 30.0,
        "guard_metric": "loss",
    },
    "artifacts": {"mode": "copy"},
    "system": {"enabled": True, "interval": 10.0, "gpu": True},
    "sync": {"url": None, "interval": 60.0, "endpoint_url": None, "finish_timeout": 30.0},
    "backends": [],
    "backend_kwargs": {},
    "backend_on_rank": 0,
    "backend_queue_size": 10000,
    "backend_finish_timeout": 30.0,
}

#: Dotted paths of the spec's sections (the nested models): a view of one is a SpecView.
SECTIONS: frozenset[str] = frozenset(
    {
        "history",
        "history.cache",
        "history.buffer",
        "spans",
        "spans.buffer",
        "alerts",
        "alerts.policy",
        "artifacts",
        "system",
        "sync",
    }
)

#: What a check returns for a value it does not vouch for: Pydantic decides.
_NO: Any = object()

_PLAIN_LEAF = (str, int, float, bool, type(None))


def _str(value: Any) -> Any:
    return value if type(value) is str else _NO


def _opt_str(value: Any) -> Any:
    return value if value is None or type(value) is str else _NO


def _fs_name(value: Any) -> Any:
    if type(value) is not str:
        return _NO
    try:
        check_fs_name(value)
    except ValueError:
        return _NO
    return value


def _opt_fs_name(value: Any) -> Any:
    return None if value is None else _fs_name(value)


def _path(value: Any) -> Any:
    if isinstance(value, PurePath):
        value = os.fspath(value)
    return value if type(value) is str else _NO


def _opt_path(value: Any) -> Any:
    return None if value is None else _path(value)


def _stream(value: Any) -> Any:
    if value is None:
        return None
    if type(value) is not str:
        return _NO
    try:
        check_stream_name(value)
    except ValueError:
        return _NO
    return value


def _str_list(value: Any) -> Any:
    if type(value) is not list or any(type(v) is not str for v in value):
        return _NO
    return list(value)


def _bool(value: Any) -> Any:
    return value if type(value) is bool else _NO


def _int_at_least(low: int) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        return value if type(value) is int and value >= low else _NO

    return check


def _one_of(*words: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        return value if type(value) is str and value in words else _NO

    return check


def _plain(value: Any, depth: int = 0) -> Any:
    """A copy of JSON-like data (dicts with str/int keys, lists, str, int, float, bool,
    None), as ``model_dump()`` gives a value typed ``Any``; ``_NO`` for anything else."""
    kind = type(value)
    if kind in _PLAIN_LEAF:
        return value
    if depth > 32:
        return _NO
    if kind is dict:
        out = {}
        for key, child in value.items():
            if type(key) not in (str, int):
                return _NO
            child = _plain(child, depth + 1)
            if child is _NO:
                return _NO
            out[key] = child
        return out
    if kind is list:
        items = [_plain(child, depth + 1) for child in value]
        return _NO if any(item is _NO for item in items) else items
    return _NO


def _backends(value: Any) -> Any:
    """``backends`` named by their types: the field's own ``backends_as_list`` (None: none;
    one name without the list: a list of one), then each entry a known name, kept as it is
    (what ``check_backend_entry`` does with a name)."""
    value = backends_as_list(value)
    if type(value) is not list or any(type(v) is not str or v not in BACKEND_TYPES for v in value):
        return _NO
    return list(value)


def _rule_texts(value: Any) -> Any:
    """``alerts.rules`` as one-line rule texts: the model keeps a non-empty string as it
    is written (the rule engine parses it when the run builds its rules)."""
    if type(value) is not list or any(type(v) is not str or not v for v in value):
        return _NO
    return list(value)


def _config(value: Any) -> Any:
    value = config_to_dict(value)  # OmegaConf, dataclass, argparse Namespace: as the model
    if type(value) is not dict or any(type(k) is not str for k in value):
        return _NO
    return _plain(value)


#: Leaf path -> check: the value normalised as the field normalises it, or ``_NO``.
LEAVES: dict[str, Callable[[Any], Any]] = {
    "project": _fs_name,
    "name": _opt_fs_name,
    "dir": _path,
    "run_dir": _opt_path,
    "group": _opt_str,
    "tags": _str_list,
    "notes": _opt_str,
    "entity": _opt_str,
    "job_type": _opt_str,
    "mode": _one_of("offline", "online", "disabled"),
    "stream": _stream,
    "resume": _one_of("allow", "never", "must"),
    "config": _config,
    "history.step_policy": _one_of("monotonic", "allow"),
    "history.rank_aware": _bool,
    "history.alert_window": _int_at_least(1),
    "history.query_cache": _bool,
    "history.cache.rows": _int_at_least(0),
    "history.buffer.size": _int_at_least(1),
    "history.buffer.max_pending_records": _int_at_least(1),
    "spans.enabled": _bool,
    "spans.metrics": _bool,
    "spans.count": _bool,
    "spans.async_write": _bool,
    "spans.buffer.size": _int_at_least(1),
    "spans.buffer.max_pending_records": _int_at_least(1),
    "alerts.enabled": _bool,
    "alerts.rules": _rule_texts,
    "artifacts.mode": _one_of("copy", "link"),
    "system.enabled": _bool,
    "backends": _backends,
}


def quick_check(merged: Mapping[str, Any]) -> dict[str, Any] | None:
    """``RunSpec.model_validate(merged).model_dump()`` when every value of ``merged`` is
    one :data:`LEAVES` vouches for, else None (validate with Pydantic). Never raises."""
    out = _plain_copy(DEFAULTS)
    try:
        return out if _overlay(merged, out, "") else None
    except Exception:  # noqa: BLE001 - any doubt: Pydantic decides
        return None


def _overlay(given: Mapping[str, Any], out: dict[str, Any], prefix: str) -> bool:
    if type(given) is not dict:
        return False
    for key, value in given.items():
        if type(key) is not str:
            return False
        path = prefix + key
        if path in SECTIONS:
            if not _overlay(value, out[key], path + "."):
                return False
            continue
        check = LEAVES.get(path)
        if check is None:
            return False
        value = check(value)
        if value is _NO:
            return False
        out[key] = value
    return True


def _plain_copy(value: Any) -> Any:
    if type(value) is dict:
        return {k: _plain_copy(v) for k, v in value.items()}
    if type(value) is list:
        return [_plain_copy(v) for v in value]
    return value


class SpecView:
    """The ``RunSpec`` of a spec :func:`quick_check` accepted, read-only, without Pydantic.

    ``view.history.buffer.size`` reads as on the model (a section is a view too);
    ``model_dump()`` is the model's dump; ``model_copy(update=...)`` replaces top-level
    values as the model's does (unvalidated); ``model_fields_set`` the fields given.
    Anything else (``model_json_schema``, ``repr``, a ``model_dump`` option) is answered
    by the real ``RunSpec``, built once on first need (``materialize()``).

    Attributes are not assignable (the model is frozen).
    """

    __slots__ = ("_data", "_given", "_path", "_root", "_updates", "_model")

    def __init__(
        self,
        data: dict[str, Any],
        given: Mapping[str, Any],
        *,
        updates: Mapping[str, Any] | None = None,
        path: str = "",
        root: SpecView | None = None,
    ) -> None:
        set_ = object.__setattr__
        set_(self, "_data", data)
        set_(self, "_given", given)
        set_(self, "_path", path)
        set_(self, "_root", root)
        set_(self, "_updates", dict(updates or {}))
        set_(self, "_model", None)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        data = object.__getattribute__(self, "_data")
        if name in data:
            path = f"{self._path}.{name}" if self._path else name
            if path in SECTIONS:
                given = self._given.get(name) if isinstance(self._given, Mapping) else None
                return SpecView(
                    data[name],
                    given if isinstance(given, Mapping) else {},
                    path=path,
                    root=self._root or self,
                )
            return data[name]
        return getattr(self.materialize(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the run spec is frozen: {name} cannot be set")

    @property
    def model_fields_set(self) -> set[str]:
        """The fields given (as ``BaseModel.model_fields_set``)."""
        given = set(self._given) if isinstance(self._given, Mapping) else set()
        return given | set(self._updates)

    def model_dump(self, **options: Any) -> dict[str, Any]:
        """The model's ``model_dump()``: a copy; with options, the real model's."""
        if options:
            return self.materialize().model_dump(**options)
        return _plain_copy(self._data)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Any:
        """A view with ``update`` replacing top-level values (not validated, as Pydantic's)."""
        if self._path:
            return self.materialize().model_copy(update=update, deep=deep)
        data = dict(self._data)
        data.update(update or {})
        return SpecView(
            _plain_copy(data) if deep else data,
            self._given,
            updates={**self._updates, **(update or {})},
        )

    def materialize(self) -> Any:
        """The real ``RunSpec`` (or section model) of this spec, built once."""
        model = self._model
        if model is None:
            if self._root is not None:
                model = self._root.materialize()
                for part in self._path.split("."):
                    model = getattr(model, part)
            else:
                from expr_tracker.spec.models import RunSpec

                model = RunSpec.model_validate(self._given)
                if self._updates:
                    model = model.model_copy(update=self._updates)
            object.__setattr__(self, "_model", model)
        return model

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SpecView):
            return self._data == other._data
        if hasattr(other, "model_dump") and type(other).__module__.startswith("expr_tracker"):
            return bool(self.materialize() == other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.materialize())

    def __str__(self) -> str:
        return str(self.materialize())
