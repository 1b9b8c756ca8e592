"""``run.config`` / ``et.config``: the run's configuration (hyper-parameters), as wandb's.

A mapping with attribute access (``config.lr``, ``config["lr"]``, ``config.lr = 3e-4``),
``update(d, allow_val_change=False)``, ``setdefaults(d)``, ``keys/items/as_dict`` and
``in``. Values are stored as JSON-able data (the same conversion as ``log()``). Every
change is written to ``config[.S].json`` atomically (a temporary file renamed over it, so
a process killed at any moment leaves the old or the new file, never half of one) by the
process that wrote it at start (rank 0), then handed to the run's listeners as the
``"config"`` event ``{"changes": {key: value}}`` (mirrors).

Changing a key to a different value raises :class:`~expr_tracker.errors.ConfigChangeError`
unless ``allow_val_change`` (per call, or for the run: ``et.init(allow_val_change=True)``),
as in wandb: a hyper-parameter that silently changes mid-run makes the record lie.

A forked child that inherited the run (a DataLoader worker) reads the config; a change
there raises :class:`~expr_tracker.errors.ForkedRunError` (it would rewrite the parent's
``config.json``). A pickled or copied config is a detached snapshot: the same keys and
values, bound to no file and no run.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from expr_tracker._current import FORK_MESSAGE, fork_generation
from expr_tracker.errors import ConfigChangeError, ForkedRunError
from expr_tracker.history.codec import dumps_pretty, normalize_value
from expr_tracker.history.paths import atomic_write

__all__ = ["RunConfig", "config_mapping"]

_MISSING = object()
_OWN = frozenset({"_data", "_lock", "_path", "_redact", "_emit", "_allow", "_warn", "_gen"})


def config_mapping(value: Any) -> dict[str, Any]:
    """The top-level keys of a config given in any form wandb or we accept: a mapping
    (an OmegaConf DictConfig too, a run's config: ``run.config``, ``et.config``), an
    ``argparse.Namespace``, a dataclass, a pydantic model, or any object with
    ``__dict__``; values are kept as given.

    Raises:
        TypeError: another type (naming the accepted ones).
    """
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): value[k] for k in value}
    if hasattr(type(value), "__dataclass_fields__"):
        return {f: getattr(value, f) for f in type(value).__dataclass_fields__}
    fields = getattr(type(value), "model_fields", None)
    if isinstance(fields, Mapping):  # a pydantic model
        return {f: getattr(value, f) for f in fields}
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {k: v for k, v in vars(value).items() if not k.startswith("_")}
    raise TypeError(
        f"a config must be a mapping, an argparse.Namespace, a dataclass or a pydantic model, "
        f"not {type(value).__name__}"
    )


def _same(old: Any, new: Any) -> bool:
    """Equal JSON data; NaN equals NaN (``update(args)`` again with a NaN default is no
    change)."""
    if old == new:
        return True
    try:
        return json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True)
    except (TypeError, ValueError):
        return False


def _detached(data: dict[str, Any], allow_val_change: bool) -> RunConfig:
    """A config bound to no file and no run (what a pickled config becomes)."""
    return RunConfig(data, allow_val_change=allow_val_change)


def _plain(value: Any) -> Any:
    """JSON-able data; OmegaConf containers resolved first."""
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        value = OmegaConf.to_container(value, resolve=True)
    return normalize_value(value)


class RunConfig:
    """The run's config; see the module docstring.

    Args:
        data: the initial config (already JSON-able: what ``config.json`` holds).
        path: ``config[.S].json`` to keep in step, or None (another rank, a disabled run).
        redact: applied to the data before it is written (credentials hidden on disk).
        emit: ``emit(event, payload)`` of the run (the ``"config"`` event).
        allow_val_change: the run-wide default of ``update(allow_val_change=)``.
        warn: ``warn(key, message, *args)`` once per cause, for a file that cannot be written.
    """

    def __init__(
        self,
        data: Mapping[str, Any] | None = None,
        *,
        path: Path | None = None,
        redact: Callable[[Any], Any] | None = None,
        emit: Callable[[str, dict[str, Any]], Any] | None = None,
        allow_val_change: bool = False,
        warn: Callable[..., Any] | None = None,
    ) -> None:
        set_ = object.__setattr__
        set_(self, "_data", dict(data or {}))
        set_(self, "_lock", threading.Lock())
        set_(self, "_path", path)
        set_(self, "_redact", redact)
        set_(self, "_emit", emit)
        set_(self, "_allow", bool(allow_val_change))
        set_(self, "_warn", warn)
        set_(self, "_gen", fork_generation())

    def __reduce__(self) -> Any:
        # pickle / copy / deepcopy: a detached snapshot (no file, no run, a fresh lock)
        return (_detached, (self.as_dict(), self._allow))

    def _check_not_forked(self) -> None:
        if self._gen != fork_generation() and (self._path is not None or self._emit is not None):
            raise ForkedRunError(FORK_MESSAGE)

    def connect(self, emit: Callable[[str, dict[str, Any]], Any]) -> None:
        """Send the ``"config"`` events to ``emit`` (the run's), unless already connected."""
        if self._emit is None:
            object.__setattr__(self, "_emit", emit)

    def allow_changes(self, allow: bool = True) -> None:
        """The run-wide default of ``update(allow_val_change=)`` (``et.init(allow_val_change=)``)."""
        object.__setattr__(self, "_allow", bool(allow))

    # -------------------------------------------------------------- changes

    def update(self, d: Any = None, allow_val_change: bool | None = None, **kwargs: Any) -> None:
        """Set several keys at once (one write, one ``"config"`` event).

        ``d``: a mapping, ``argparse.Namespace``, dataclass or pydantic model; ``kwargs``
        are more keys. Unchanged values are not events.

        Raises:
            ConfigChangeError: a key already holds a different value and neither this call
                nor the run allows changes; nothing of the call is applied then.
            TypeError: ``d`` is of another type.
        """
        given = config_mapping(d)
        given.update(kwargs)
        self._apply(given, self._allow if allow_val_change is None else allow_val_change)

    def setdefaults(self, d: Any = None, **kwargs: Any) -> None:
        """Set the keys of ``d`` that the config does not hold yet (others are left)."""
        given = config_mapping(d)
        given.update(kwargs)
        with self._lock:
            missing = {k: v for k, v in given.items() if k not in self._data}
        self._apply(missing, False, only_new=True)

    def _apply(self, given: dict[str, Any], allow: bool, only_new: bool = False) -> None:
        self._check_not_forked()
        if not given:
            return
        plain = {str(k): _plain(v) for k, v in given.items()}
        with self._lock:
            changes = {}
            for k, v in plain.items():
                old = self._data.get(k, _MISSING)
                if old is _MISSING:
                    changes[k] = v
                elif only_new or _same(old, v):
                    continue
                elif not allow:
                    raise ConfigChangeError(
                        f"config key {k!r} already holds {old!r}; refusing to change it to "
                        f"{v!r}. Pass allow_val_change=True (config.update(..., "
                        "allow_val_change=True), or et.init(allow_val_change=True) for the "
                        "run) to change it"
                    )
                else:
                    changes[k] = v
            if not changes:
                return
            self._data.update(changes)
            self._save_locked()
        emit = self._emit
        if emit is not None:
            emit("config", {"changes": changes})

    def _save_locked(self) -> None:
        path = self._path
        if path is None:
            return
        data = self._data if self._redact is None else self._redact(dict(self._data))
        try:
            atomic_write(path, dumps_pretty(data))
        except OSError as exc:
            warn = self._warn
            if warn is not None:
                warn(("write", path.name), "expr_tracker: cannot write %s (%s)", path, exc)

    # -------------------------------------------------------------- mapping

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def __delitem__(self, key: str) -> None:
        self._check_not_forked()
        with self._lock:
            del self._data[key]
            self._save_locked()

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RunConfig):
            return self.as_dict() == other.as_dict()
        if isinstance(other, Mapping):
            return self.as_dict() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def keys(self) -> Any:
        return self.as_dict().keys()

    def items(self) -> Any:
        return self.as_dict().items()

    def values(self) -> Any:
        return self.as_dict().values()

    def as_dict(self) -> dict[str, Any]:
        """A copy of the config as a plain dict."""
        with self._lock:
            return dict(self._data)

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        try:
            return self._data[key]
        except KeyError:
            raise AttributeError(
                f"config has no key {key!r} (keys: {', '.join(self._data) or 'none'})"
            ) from None

    def __setattr__(self, key: str, value: Any) -> None:
        if key in _OWN:
            object.__setattr__(self, key, value)
        else:
            self.update({key: value})

    def __repr__(self) -> str:
        return f"RunConfig({self.as_dict()!r})"


# a Mapping to every consumer: config=run.config, config.update(other.config)
Mapping.register(RunConfig)
