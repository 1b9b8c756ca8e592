"""A Python callable as a channel: ``fn(message: AlertMessage)``.

Options: ``fn`` (a callable, from Python; ``handler`` is its earlier name, accepted too,
but not both) or ``target`` (``"package.module:function"``, imported at configuration
time). Whatever ``fn`` raises is a failed send (retried like a network error); its return
value is ignored.
"""

from __future__ import annotations

import importlib
from typing import Any

from expr_tracker.alerts.delivery.channels.base import (
    Channel,
    DeliveryError,
    SendResult,
    config_error,
)
from expr_tracker.alerts.delivery.message import AlertMessage

__all__ = ["CallableChannel"]


class CallableChannel(Channel):
    """Calls a function with each message."""

    kind = "callable"
    option_names = frozenset({"fn", "handler", "target"})
    option_checks = {
        "fn": lambda v: None if callable(v) else "must be a callable (from Python)",
        "handler": lambda v: None if callable(v) else "must be a callable (from Python)",
        "target": lambda v: _target_problem(v),
    }

    @classmethod
    def option_problems(cls, options: Any) -> list[tuple[str, str]]:
        out = super().option_problems(options)
        if options.get("fn") is not None and options.get("handler") is not None:
            out.insert(
                0,
                (
                    "options.handler",
                    "give the callable as `fn` or as its earlier name `handler`, not both",
                ),
            )
        return out

    def __init__(self, *args: Any, fn=None, **kwargs: Any) -> None:  # noqa: ANN001
        super().__init__(*args, **kwargs)
        fn = fn or self.options.get("fn") or self.options.get("handler")
        target = self.options.get("target")
        if fn is None and target:
            fn = _import(str(target), self.name)
        if not callable(fn):
            raise config_error(
                self.name,
                "options",
                "a callable channel needs `fn` (a callable; earlier name `handler`) or "
                "`target` ('package.module:function')",
            )
        self.fn = fn

    def send(self, message: AlertMessage, timeout: float) -> SendResult:
        try:
            self.fn(message)
        except Exception as exc:  # noqa: BLE001 - the user's function failed to deliver
            raise DeliveryError(f"{type(exc).__name__}: {exc}"[:200]) from None
        return SendResult(None, "called")

    @property
    def target(self) -> str:
        return getattr(self.fn, "__qualname__", type(self.fn).__name__)


def _target_problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"must be a string 'package.module:function', got {type(value).__name__}"
    module_name, _, attr = value.partition(":")
    if not module_name or not attr:
        return "must look like 'package.module:function'"
    return None


def _import(target: str, name: str) -> Any:
    problem = _target_problem(target)
    if problem:
        raise config_error(name, "options.target", problem)
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise config_error(name, "options.target", f"cannot import {target!r} ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - the module itself fails to import
        raise config_error(
            name, "options.target", f"cannot import {target!r} ({type(exc).__name__}: {exc})"
        ) from None
    if not callable(obj):
        raise config_error(name, "options.target", f"{target!r} is not callable")
    return obj
