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

import builtins
import importlib
import os
import threading
from collections.abc import Mapping
from typing import Any

from expr_tracker.alerts.delivery.channels.base import (
    Channel,
    ChannelConfigError,
    DeliveryError,
    SendResult,
    config_error,
    url_problem,
)

__all__ = [
    "Channel",
    "ChannelConfigError",
    "DeliveryError",
    "SendResult",
    "channel_class",
    "channel_kinds",
    "channel_problems",
    "create_channel",
    "register_backend",
    "register_channel",
]

_BUILTIN = {
    "lark": "expr_tracker.alerts.delivery.channels.lark_channel:LarkChannel",
    "feishu": "expr_tracker.alerts.delivery.channels.lark_channel:LarkChannel",
    "slack": "expr_tracker.alerts.delivery.channels.slack:SlackChannel",
    "dingtalk": "expr_tracker.alerts.delivery.channels.dingtalk:DingTalkChannel",
    "wecom": "expr_tracker.alerts.delivery.channels.wecom:WeComChannel",
    "webhook": "expr_tracker.alerts.delivery.channels.webhook:WebhookChannel",
    "email": "expr_tracker.alerts.delivery.channels.email:EmailChannel",
    "callable": "expr_tracker.alerts.delivery.channels.callable:CallableChannel",
    "console": "expr_tracker.alerts.delivery.channels.console:ConsoleChannel",
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
    # builtins.callable: once the `callable` channel module is imported, the package's
    # global `callable` is that submodule
    if not isinstance(cls, type) or not builtins.callable(getattr(cls, "send", None)):
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
        ChannelConfigError: an unknown kind (the message lists the valid ones; ``field`` is
            ``type``).
    """
    cls = _registry.get(kind)
    if cls is not None:
        return cls
    path = _BUILTIN.get(kind)
    if path is None:
        import difflib

        close = difflib.get_close_matches(str(kind), channel_kinds(), n=1)
        hint = f"; did you mean `{close[0]}`?" if close else ""
        problem = (
            f"unknown channel type {kind!r}: expected one of {', '.join(channel_kinds())} "
            f"(or register one with expr_tracker.register_backend){hint}"
        )
        raise ChannelConfigError(problem, field="type", problem=problem)
    module, _, name = path.partition(":")
    cls = getattr(importlib.import_module(module), name)
    with _lock:
        _registry.setdefault(kind, cls)
    return cls


def create_channel(spec: Any, environ: Mapping[str, str] | None = None) -> Channel:
    """Build the channel a ``ChannelSpec`` (or a plain mapping of its fields) describes.

    Raises:
        ChannelConfigError: unknown type, ``url_env`` naming an unset variable, a missing
            or unusable URL, or options the type rejects; ``channel`` and ``field`` say
            where (``field`` is ``url_env`` when the URL read from it is unusable).
    """
    env = os.environ if environ is None else environ
    get = spec.get if isinstance(spec, Mapping) else (lambda k, d=None: getattr(spec, k, d))
    kind = get("type")
    name = get("name") or kind
    url = _reveal(get("url"))
    url_env = get("url_env")
    from_env = False
    if url_env:
        value = env.get(url_env)
        if value and value.strip():
            url, from_env = value.strip(), True
        elif not url:
            raise config_error(name, "url_env", f"environment variable {url_env} is not set")
    try:
        cls = channel_class(kind)
    except ChannelConfigError as exc:
        raise config_error(name, "type", exc.problem or str(exc)) from None
    kwargs: dict[str, Any] = {
        "url": url,
        "secret": _reveal(get("secret")),
        "options": dict(get("options") or {}),
    }
    if "environ" in _init_params(cls):
        kwargs["environ"] = env
    try:
        return cls(name, **kwargs)
    except ChannelConfigError as exc:
        if from_env and exc.field == "url":
            raise config_error(
                name, "url_env", f"the URL in environment variable {url_env} {exc.problem}"
            ) from None
        raise
    except (TypeError, ValueError) as exc:
        from expr_tracker.alerts.delivery.scrub import scrub

        problem = scrub(str(exc), (url, kwargs["secret"], *_option_secrets(kwargs["options"])))
        raise config_error(name, "", problem) from None


def channel_problems(
    spec: Any, environ: Mapping[str, str] | None = None
) -> list[ChannelConfigError]:
    """Every configuration problem of one channel (a ``ChannelSpec``), built as the run
    would build it but never started: an unknown type; then every option of the wrong
    name or type and an unusable ``url`` (checked even when the channel is disabled or off
    because its ``url_env`` is unset, so a checked-in channel cannot hide a typo); then, for
    a channel that is on, what building it with ``environ`` finds (``*_env`` variables
    unset, a bad URL in ``url_env``, a ``target`` that cannot be imported). Each error has
    ``channel`` and ``field`` set; none holds a secret."""
    env = os.environ if environ is None else environ
    kind = getattr(spec, "type", None)
    name = getattr(spec, "name", None) or kind
    try:
        cls = channel_class(kind)
    except ChannelConfigError as exc:
        return [config_error(name, "type", exc.problem or str(exc))]
    found: list[ChannelConfigError] = []
    option_problems = getattr(cls, "option_problems", None)
    if builtins.callable(option_problems):
        for field, problem in option_problems(dict(getattr(spec, "options", None) or {})):
            found.append(config_error(name, field, problem))
    url = _reveal(getattr(spec, "url", None))
    if url and getattr(cls, "needs_url", False):
        problem = url_problem(url)
        if problem:
            found.append(config_error(name, "url", problem))
    if found:
        return found
    url_env = getattr(spec, "url_env", None)
    off = url_env and not url and not (env.get(url_env) or "").strip()
    if getattr(spec, "enabled", True) and not off:
        try:
            create_channel(spec, env).close()
        except ChannelConfigError as exc:
            if exc.channel is None:
                exc = config_error(name, exc.field or "", exc.problem or str(exc))
            found.append(exc)
    return found


def _option_secrets(options: Mapping[str, Any]) -> list[str]:
    """Option values that may be secrets (passwords, header values), for scrubbing."""
    out = []
    for key, value in options.items():
        if isinstance(value, str) and any(
            w in str(key).lower() for w in ("pass", "secret", "token")
        ):
            out.append(value)
        if isinstance(value, Mapping) and str(key).lower().startswith("headers"):
            out.extend(str(v) for v in value.values() if v is not None)
    return out


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
