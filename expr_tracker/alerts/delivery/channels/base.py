"""What every channel shares: ``Channel``, ``SendResult``, ``DeliveryError`` and ``post_json``.

A channel only sends what it is handed (docs/channels.md "Policy"): timing, retries, rate limits, dedup and
threads belong to the dispatcher. ``send(message, timeout)`` either returns a ``SendResult``
(the endpoint accepted it) or raises ``DeliveryError`` saying whether a retry may help, the
HTTP status and any ``Retry-After``. Settings are validated in ``__init__`` and raise
``ChannelConfigError`` (a ``ValueError``) at configuration time.

Secrets (URL, signing secret, passwords, tokens in headers) are listed by ``secrets()`` so the
dispatcher can scrub them from every error text; ``repr`` shows only the redacted target.

The bounded HTTP client (``post_json``), ``HttpChannel`` and ``check_code`` are in
``channels.http``.
"""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from expr_tracker.alerts.delivery.message import AlertMessage
from expr_tracker.alerts.delivery.scrub import ambiguous_authority, redact_url, scrub

__all__ = [
    "ATTEMPT_TIMEOUTS",
    "Channel",
    "ChannelConfigError",
    "DeliveryError",
    "SendResult",
    "excerpt",
]

#: one HTTP attempt lasts at most this many ``timeout``s (connect, then exchange); here,
#: not in ``bounded_http``, so the dispatcher does not import the HTTP stack (cold start)
ATTEMPT_TIMEOUTS = 2

#: characters of a response body kept for reports (logs, records, stats, the CLIs)
EXCERPT_LIMIT = 200


class ChannelConfigError(ValueError):
    """A channel is misconfigured (raised at configuration time, never while sending).

    ``str()`` is the whole message (``alerts.channels.<name>.<field>: <problem>``);
    ``channel`` (the channel's name), ``field`` (dotted, relative to the channel:
    ``options.port``, ``url``, ``type``; "" for the channel as a whole) and ``problem`` (the
    message without its path) are set when the raiser knew them, for ``assemble.check`` to
    turn into a ``SpecError`` naming the spec path. The text never holds a secret.
    """

    def __init__(
        self,
        message: str,
        *,
        channel: str | None = None,
        field: str | None = None,
        problem: str | None = None,
    ) -> None:
        super().__init__(message)
        self.channel = channel
        self.field = field
        self.problem = problem


def config_error(channel: str, field: str, problem: str) -> ChannelConfigError:
    """``ChannelConfigError`` for ``alerts.channels.<channel>[.<field>]``: ``problem``."""
    where = f"alerts.channels.{channel}" + (f".{field}" if field else "")
    return ChannelConfigError(f"{where}: {problem}", channel=channel, field=field, problem=problem)


URL_HELP = (
    "if it holds user:password, percent-encode the password's / ? # @ (%2F %3F %23 %40); "
    "an @ in the path or query must be written %40"
)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be used as a webhook URL (None when it can); never echoes it."""
    text = str(url)
    if not text.startswith(("http://", "https://")):
        return f"must start with http:// or https:// (got {redact_url(text) or '***'})"
    if ambiguous_authority(text):
        return "the host cannot be told apart from the credentials; " + URL_HELP
    try:
        host = urllib.parse.urlsplit(text).hostname
    except ValueError:
        host = None
    if not host:
        return "has no host name"
    return None


class DeliveryError(Exception):
    """A send failed.

    Attributes:
        reason: short cause, secrets removed (``"HTTP 500"``, ``"timed out"``, ...).
        status: HTTP status when the endpoint answered, else None.
        retry_after: seconds the endpoint asked to wait (``Retry-After``), else None.
        retryable: whether trying again may succeed (the dispatcher also consults
            ``retry_on_status`` for HTTP statuses).
        body: the start of the response body, if any.
    """

    def __init__(
        self,
        reason: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        retryable: bool = True,
        body: str = "",
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after = retry_after
        self.retryable = retryable
        self.body = body

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class SendResult:
    """What an endpoint answered to a successful send: HTTP ``status`` (None for non-HTTP
    channels) and the start of the response ``body`` (``detail`` for others)."""

    status: int | None = None
    body: str = ""

    def describe(self) -> str:
        if self.status is None:
            return self.body or "ok"
        return f"HTTP {self.status} {self.body}".strip()


def excerpt(
    text: Any, secrets: tuple[str | None, ...] = (), *, truncated: bool = False, limit: int = 0
) -> str:
    """What may be shown of a response body: secrets removed first (``scrub``: the URL, its
    token and ``user:password``, header values, signing secrets), then on one line, control
    characters replaced, cut to ``limit`` characters (default ``EXCERPT_LIMIT``).

    ``truncated``: the body was cut when read, so its end may hold the start of a secret
    that ``scrub`` cannot recognise; as many characters as the longest secret are dropped
    from the end first."""
    out = str(text or "")
    if truncated:
        longest = max((len(str(x)) for x in secrets if x), default=0)
        out = out[: max(0, len(out) - longest)]
    out = scrub(out, secrets)
    out = "".join(ch if ch.isprintable() or ch.isspace() else "?" for ch in out)
    out = " ".join(out.split())
    limit = limit or EXCERPT_LIMIT
    return out if len(out) <= limit else out[: limit - 1].rstrip() + "\u2026"


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``(url without user:password@, Authorization header value or None)``: credentials in
    a URL go as HTTP Basic auth (``urllib`` would take them for part of the host name)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url, None
    if "@" not in parts.netloc or ambiguous_authority(url):
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    raw = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()
    clean = urllib.parse.urlunsplit(parts._replace(netloc=hostport))
    return clean, "Basic " + base64.b64encode(raw).decode("ascii")


# -- option checks: each returns what is wrong with a value, or None; a value is shown only by
# -- its type (an option may hold a secret), except for the words of a fixed choice


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def opt_str(value: Any) -> str | None:
    """A string."""
    return None if isinstance(value, str) else f"must be a string, got {_type_name(value)}"


def opt_bool(value: Any) -> str | None:
    """true or false (a quoted "false" is a string, and a non-empty string is true)."""
    return None if isinstance(value, bool) else f"must be true or false, got {_type_name(value)}"


def opt_int(low: int | None = None, high: int | None = None) -> Any:
    """An integer (not a bool) within ``[low, high]``."""

    def check(value: Any) -> str | None:
        bounds = (
            f" from {low} to {high}"
            if low is not None and high is not None
            else f" >= {low}"
            if low is not None
            else ""
        )
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer{bounds}, got {_type_name(value)}"
        if (low is not None and value < low) or (high is not None and value > high):
            return f"must be an integer{bounds}, got {value}"
        return None

    return check


def opt_number(minimum: float = 0.0) -> Any:
    """A finite number (not a bool) >= ``minimum``."""

    def check(value: Any) -> str | None:
        import math

        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number >= {minimum:g}, got {_type_name(value)}"
        if not math.isfinite(value) or value < minimum:
            return f"must be a number >= {minimum:g}, got {value!r}"
        return None

    return check


def opt_choice(*choices: str, fold_case: bool = False) -> Any:
    """One of ``choices`` (compared case-insensitively with ``fold_case``)."""

    def check(value: Any) -> str | None:
        text = value.lower() if fold_case and isinstance(value, str) else value
        valid = {c.lower() for c in choices} if fold_case else set(choices)
        if isinstance(text, str) and text in valid:
            return None
        shown = repr(value) if isinstance(value, str) and len(value) <= 40 else _type_name(value)
        return f"must be one of {', '.join(choices)}, got {shown}"

    return check


def opt_mapping(values: Any = None) -> Any:
    """A mapping with string keys, each value passing ``values`` (a check) when given."""

    def check(value: Any) -> str | None:
        if not isinstance(value, Mapping):
            return f"must be a mapping name -> value, got {_type_name(value)}"
        for key, item in value.items():
            if not isinstance(key, str) or not key:
                return f"keys must be non-empty strings, got {_type_name(key)}"
            problem = values(item) if values is not None else None
            if problem:
                return f"{key}: {problem}"
        return None

    return check


def opt_scalar(value: Any) -> str | None:
    """A string or a number (a header value)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return f"must be a string or a number, got {_type_name(value)}"
    return None


class Channel:
    """Base of every channel type.

    Args:
        name: the channel's name (unique within a run).
        url: the endpoint (webhook URL), already read from ``url_env`` if that was given.
        secret: signing secret (Lark, DingTalk).
        options: type-specific settings (validated by the subclass; unknown keys raise).

    Subclasses set ``kind``, ``option_names`` (accepted option keys), ``needs_url``,
    optionally ``policy_defaults``, and implement ``send(message, timeout) -> SendResult``.
    """

    kind: ClassVar[str] = "base"
    option_names: ClassVar[frozenset[str]] = frozenset()
    needs_url: ClassVar[bool] = False
    #: policy fields this type runs with unless the configuration sets them (in
    #: ``alerts.policy`` or the channel's ``policy``), e.g. no rate limit for a local channel
    policy_defaults: ClassVar[Mapping[str, Any]] = {}
    #: option -> ``check(value) -> problem or None`` (type and range; see ``option_checks``
    #: helpers ``is_str``, ``is_bool``...); a None value is not checked (it means "default")
    option_checks: ClassVar[Mapping[str, Any]] = {}

    def __init__(
        self,
        name: str | None = None,
        *,
        url: str | None = None,
        secret: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name or self.kind
        self.url = url or None
        self.secret = secret or None
        self.options = dict(options or {})
        problems = self.option_problems(self.options)
        if problems:
            field, problem = problems[0]
            raise config_error(self.name, field, problem)
        if self.needs_url and not self.url:
            raise config_error(
                self.name,
                "",
                f"a {self.kind} channel needs `url` (or `url_env` naming a set environment "
                "variable)",
            )
        if self.url and self.needs_url:
            problem = url_problem(self.url)
            if problem is not None:
                raise config_error(self.name, "url", problem)

    @classmethod
    def option_problems(cls, options: Mapping[str, Any]) -> list[tuple[str, str]]:
        """Every problem of ``options`` that needs no environment and no network, as
        ``(field, problem)`` pairs (``("options.port", "must be an integer, got 'x'")``):
        unknown keys, then the checks of ``option_checks``. ``__init__`` raises the first;
        ``assemble.check`` reports them all, also for a channel that is off."""
        out: list[tuple[str, str]] = []
        unknown = sorted(str(k) for k in set(options) - set(cls.option_names))
        if unknown:
            import difflib

            valid = ", ".join(sorted(cls.option_names)) or "none"
            for key in unknown:
                close = difflib.get_close_matches(key, sorted(cls.option_names), n=1)
                hint = f"; did you mean `{close[0]}`?" if close else ""
                out.append(
                    (
                        f"options.{key}",
                        f"unknown option for a {cls.kind} channel (valid: {valid}){hint}",
                    )
                )
        for key, check in cls.option_checks.items():
            if key in options and options[key] is not None:
                problem = check(options[key])
                if problem:
                    out.append((f"options.{key}", problem))
        return out

    # ---------------------------------------------------------------- contract

    def send(self, message: AlertMessage, timeout: float) -> SendResult:
        """Deliver ``message`` once, within ``timeout`` seconds per network operation.

        Raises:
            DeliveryError: the endpoint refused it or could not be reached.
        """
        raise NotImplementedError

    def secrets(self) -> tuple[str, ...]:
        """Every secret this channel holds (scrubbed from error texts): the URL (with any
        ``user:password@``, and the Basic auth header made from it), the signing secret."""
        out = [self.url, self.secret]
        if self.url:
            out.append(split_userinfo(self.url)[1])
        return tuple(s for s in out if s)

    @property
    def target(self) -> str:
        """Where it sends, redacted (safe to print)."""
        return redact_url(self.url) if self.url else self.kind

    def close(self) -> None:
        """Release resources (nothing by default)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, target={self.target!r})"


def fields_list(message: AlertMessage, limit: int = 20) -> list[tuple[str, str]]:
    """``(name, value)`` display pairs of ``message.fields`` (at most ``limit``)."""
    from expr_tracker.history.values import format_value

    return [(str(k), format_value(v)) for k, v in list(message.fields.items())[:limit]]
