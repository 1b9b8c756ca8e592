"""Channel types and their registry.

Built in: ``lark``, ``slack``, ``dingtalk``, ``wecom``, ``webhook``, ``email``, ``callable``,
``console`` (and ``memory``, the test double in ``expr_tracker.testing``). Each lives in its
own module, imported on first use. ``register_backend(kind, cls)`` (alias
``register_channel``) adds a type: ``cls`` is a ``Channel`` subclass (or any class taking
``(name, *, url, secret, options)`` with ``send(message, timeout)``).

``create_channel(spec, environ=None)`` turns a ``ChannelSpec`` into a channel, reading the URL
from ``url_env`` when given; every problem raises ``ChannelConfigError`` at configuration
time, naming the ``alerts.channels.<name>`` path.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Mapping
from typing import Any

from expr_tracker.alerts.channels.base import (
    Channel,
    ChannelConfigError,
    DeliveryError,
    SendResult,
)

__all__ = [
    "Channel",
    "ChannelConfigError",
    "DeliveryError",
    "SendResult",
    "channel_class",
    "channel_kinds",
    "create_channel",
    "register_backend",
    "register_channel",
]

_BUILTIN = {
    "lark": "expr_tracker.alerts.channels.lark:LarkChannel",
    "feishu": "expr_tracker.alerts.channels.lark:LarkChannel",
    "slack": "expr_tracker.alerts.channels.slack:SlackChannel",
    "dingtalk": "expr_tracker.alerts.channels.dingtalk:DingTalkChannel",
    "wecom": "expr_tracker.alerts.channels.wecom:WeComChannel",
    "webhook": "expr_tracker.alerts.channels.webhook:WebhookChannel",
    "email": "expr_tracker.alerts.channels.email:EmailChannel",
    "callable": "expr_tracker.alerts.channels.callable:CallableChannel",
    "console": "expr_tracker.alerts.channels.console:ConsoleChannel",
    "memory": "expr_tracker.testing:InMemoryChannel",
}
_registry: dict[str, Any] = {}
_lock = threading.Lock()


def register_backend(kind: str, cls: type) -> type:
    """Register channel class ``cls`` under ``kind`` (replacing any earlier one).

    Returns ``cls`` (usable as ``@functools.partial(register_backend, "x")``).

    Raises:
        TypeError: ``cls`` is not a class with a ``send`` method.
        ValueError: ``kind`` is not a non-empty identifier.
    """
    if not isinstance(kind, str) or not kind.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"channel kind must be an identifier, got {kind!r}")
    if not isinstance(cls, type) or not callable(getattr(cls, "send", None)):
        raise TypeError(
            "register_backend(kind, cls): cls must be a class with send(message, timeout)"
        )
    with _lock:
        _registry[kind] = cls
    return cls


register_channel = register_backend


def channel_kinds() -> list[str]:
    """Every registered channel type, sorted."""
    return sorted(set(_BUILTIN) | set(_registry))


def channel_class(kind: str) -> type:
    """The class registered for ``kind``.

    Raises:
        ChannelConfigError: an unknown kind (the message lists the valid ones).
    """
    cls = _registry.get(kind)
    if cls is not None:
        return cls
    path = _BUILTIN.get(kind)
    if path is None:
        raise ChannelConfigError(
            f"unknown channel type {kind!r}: expected one of {', '.join(channel_kinds())} "
            "(or register one with expr_tracker.register_backend)"
        )
    module, _, name = path.partition(":")
    cls = getattr(importlib.import_module(module), name)
    with _lock:
        _registry.setdefault(kind, cls)
    return cls


def create_channel(spec: Any, environ: Mapping[str, str] | None = None) -> Channel:
    """Build the channel a ``ChannelSpec`` (or a plain mapping of its fields) describes.

    Raises:
        ChannelConfigError: unknown type, ``url_env`` naming an unset variable, a missing
            URL, or options the type rejects.
    """
    env = os.environ if environ is None else environ
    get = spec.get if isinstance(spec, Mapping) else (lambda k, d=None: getattr(spec, k, d))
    kind = get("type")
    name = get("name") or kind
    url = _reveal(get("url"))
    url_env = get("url_env")
    if url_env:
        value = env.get(url_env)
        if value and value.strip():
            url = value.strip()
        elif not url:
            raise ChannelConfigError(
                f"alerts.channels.{name}.url_env: environment variable {url_env} is not set"
            )
    cls = channel_class(kind)
    kwargs: dict[str, Any] = {
        "url": url,
        "secret": _reveal(get("secret")),
        "options": dict(get("options") or {}),
    }
    if "environ" in _init_params(cls):
        kwargs["environ"] = env
    try:
        return cls(name, **kwargs)
    except ChannelConfigError:
        raise
    except (TypeError, ValueError) as exc:
        from expr_tracker.alerts.message import scrub

        raise ChannelConfigError(
            scrub(f"alerts.channels.{name}: {exc}", (url, kwargs["secret"]))
        ) from None


def _reveal(value: Any) -> Any:
    getter = getattr(value, "get_secret_value", None)
    return getter() if getter is not None else value


def _init_params(cls: type) -> set[str]:
    import inspect

    params: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params |= set(inspect.signature(init).parameters)
        except (TypeError, ValueError):
            continue
    return params
