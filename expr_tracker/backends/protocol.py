"""What a backend is: any object with ``init``, ``log`` and ``finish``.

The protocol (docs/mirrors.md "Your own backend"), every method called on the mirror's
background thread, never on the thread that logs:

- ``init(**info)``: once, before any row. ``info`` holds ``project``, ``name`` (the backend
  run's name: ``<run>``, ``<run>.<stream>``, ``<run>.rank<N>``), ``group`` (the run name),
  ``config`` (dict), ``tags`` (list), ``notes``, ``entity``, ``job_type``, ``run_name``,
  ``stream`` (str or None), ``rank`` (int), ``run_dir`` (str), ``resumed`` (bool), ``id`` (a stable id for this
  stream and rank of this run: 16 hex digits). A method that takes no ``**kwargs`` is handed
  only the keywords it names.
- ``log(metrics, step=N)``: once per committed row, in commit order. ``metrics`` is the row
  without ``_step`` and ``_time`` (a fresh dict the backend may keep); ``step`` its ``_step``.
  When ``log`` has a ``commit`` parameter it is passed ``commit=True`` (each row is complete).
- ``finish()``: once, at the end; passed ``exit_code=`` (0 finished, non-zero failed) when
  it has such a parameter.
- optional ``on_event(event, payload)``: the run events (``"config"``, ``"summary"``,
  ``"define_metric"``, ``"artifact"``; payloads as ``Run.subscribe`` documents) and, at
  finish, ``"summary"`` with the whole final summary (``{"changes": {...}, "final": True}``).

Signatures are inspected once, when the backend is adapted (:func:`adapt`), never per row.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

__all__ = ["INFO_KEYS", "Adapted", "Backend", "adapt", "is_backend", "label_of"]


@runtime_checkable
class Backend(Protocol):
    """The three methods a mirror calls (see the module docstring for their arguments)."""

    def init(self, **info: Any) -> Any: ...

    def log(self, metrics: dict[str, Any], step: int) -> Any: ...

    def finish(self) -> Any: ...


def is_backend(obj: Any) -> bool:
    """True when ``obj`` has callable ``init``, ``log`` and ``finish`` (a class is not one:
    pass an instance)."""
    if isinstance(obj, type):
        return False
    return all(callable(getattr(obj, m, None)) for m in ("init", "log", "finish"))


def label_of(obj: Any) -> str:
    """The name a backend is counted under in ``et.info()["backends"]``: its ``name``
    attribute when it is a string, else its class name."""
    name = getattr(obj, "name", None)
    if isinstance(name, str) and name:
        return name
    return type(obj).__name__


def _params(fn: Callable[..., Any]) -> tuple[frozenset[str], bool]:
    """(keyword parameter names, takes **kwargs?); a signature that cannot be read is taken
    as accepting anything."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return frozenset(), True
    names = set()
    var_kw = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            var_kw = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            names.add(p.name)
    return frozenset(names), var_kw


#: the keywords a backend's ``init`` may name (see the module docstring)
INFO_KEYS = (
    "project name group config tags notes entity job_type run_name stream rank run_dir resumed id"
).split()


def _check_call(fn: Callable[..., Any], what: str, how: str, *args: Any, **kwargs: Any) -> None:
    """Raise TypeError when ``fn`` cannot be called the way the mirror will call it."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # unreadable (a builtin): taken as accepting anything
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(
            f"a backend's {what} must accept being called as {how}; {what}{sig} cannot ({exc})"
        ) from None


class Adapted:
    """A backend object with the calls a mirror makes, its signatures read once.

    ``init(info)``, ``log(metrics, step)``, ``event(event, payload)``, ``finish(exit_code)``:
    each calls the object's method the way its signature allows.
    """

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.label = label_of(obj)
        init_names, init_any = _params(obj.init)
        self._init_names = None if init_any else init_names
        log_names, log_any = _params(obj.log)
        self._log_commit = log_any or "commit" in log_names
        self._log_step = log_any or "step" in log_names
        fin_names, fin_any = _params(obj.finish)
        self._finish_code = fin_any or "exit_code" in fin_names
        on_event = getattr(obj, "on_event", None)
        self._on_event = on_event if callable(on_event) else None
        self._log = obj.log
        self._check()

    def _check(self) -> None:
        """Each method callable as the mirror will call it (TypeError naming what is not)."""
        obj, label = self.obj, type(self.obj).__name__
        names = INFO_KEYS if self._init_names is None else self._init_names & set(INFO_KEYS)
        _check_call(
            obj.init,
            f"{label}.init",
            f"init(**info) with info keys among {', '.join(INFO_KEYS)}",
            **dict.fromkeys(names),
        )
        if self._log_commit:
            _check_call(self._log, f"{label}.log", "log(metrics, step=N)", {}, step=0, commit=True)
        elif self._log_step:
            _check_call(self._log, f"{label}.log", "log(metrics, step=N)", {}, step=0)
        else:
            _check_call(self._log, f"{label}.log", "log(metrics, step=N)", {})
        if self._finish_code:
            _check_call(
                obj.finish, f"{label}.finish", "finish(exit_code=N) or finish()", exit_code=0
            )
        else:
            _check_call(obj.finish, f"{label}.finish", "finish(exit_code=N) or finish()")
        if self._on_event is not None:
            _check_call(self._on_event, f"{label}.on_event", "on_event(event, payload)", "", {})

    def init(self, info: dict[str, Any]) -> None:
        if self._init_names is not None:
            info = {k: v for k, v in info.items() if k in self._init_names}
        self.obj.init(**info)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self._log_commit:
            self._log(metrics, step=step, commit=True)
        elif self._log_step:
            self._log(metrics, step=step)
        else:
            self._log(metrics)

    def event(self, event: str, payload: dict[str, Any]) -> None:
        if self._on_event is not None:
            self._on_event(event, payload)

    def finish(self, exit_code: int) -> None:
        if self._finish_code:
            self.obj.finish(exit_code=exit_code)
        else:
            self.obj.finish()


def adapt(obj: Any) -> Adapted:
    """``obj`` (anything :func:`is_backend` accepts) ready for a mirror.

    Raises:
        TypeError: ``obj`` lacks one of ``init``, ``log``, ``finish``.
    """
    if not is_backend(obj):
        missing = [m for m in ("init", "log", "finish") if not callable(getattr(obj, m, None))]
        if isinstance(obj, type):
            raise TypeError(f"backends: the class {obj.__name__} was given; pass an instance")
        raise TypeError(
            f"backends: {repr(obj)[:80]} ({type(obj).__name__}) lacks {', '.join(missing)}; an "
            "entry is a backend name (jsonl, trackio, wandb) or an object with init, log and "
            "finish methods"
        )
    return Adapted(obj)
