"""A Python callable as a channel: ``fn(message: AlertMessage)``.

Options: ``fn`` (a callable, from Python) or ``target`` (``"package.module:function"``,
imported at configuration time). Whatever ``fn`` raises is a failed send (retried like a
network error); its return value is ignored.
"""

from __future__ import annotations

import importlib
from typing import Any

from expr_tracker.alerts.channels.base import Channel, ChannelConfigError, DeliveryError, SendResult
from expr_tracker.alerts.message import AlertMessage

__all__ = ["CallableChannel"]


class CallableChannel(Channel):
    """Calls a function with each message."""

    kind = "callable"
    option_names = frozenset({"fn", "target"})

    def __init__(self, *args: Any, fn=None, **kwargs: Any) -> None:  # noqa: ANN001
        super().__init__(*args, **kwargs)
        fn = fn or self.options.get("fn")
        target = self.options.get("target")
        if fn is None and target:
            fn = _import(str(target), self.name)
        if not callable(fn):
            raise ChannelConfigError(
                f"alerts.channels.{self.name}.options: a callable channel needs `fn` (a "
                "callable) or `target` ('package.module:function')"
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


def _import(target: str, name: str) -> Any:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ChannelConfigError(
            f"alerts.channels.{name}.options.target: must look like 'package.module:function'"
        )
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ChannelConfigError(
            f"alerts.channels.{name}.options.target: cannot import {target!r} ({exc})"
        ) from None
    return obj
