"""What every channel shares: ``Channel``, ``SendResult``, ``DeliveryError`` and ``post_json``.

A channel only sends what it is handed (STYLE.md 6): timing, retries, rate limits, dedup and
threads belong to the dispatcher. ``send(message, timeout)`` either returns a ``SendResult``
(the endpoint accepted it) or raises ``DeliveryError`` saying whether a retry may help, the
HTTP status and any ``Retry-After``. Settings are validated in ``__init__`` and raise
``ChannelConfigError`` (a ``ValueError``) at configuration time.

Secrets (URL, signing secret, passwords, tokens in headers) are listed by ``secrets()`` so the
dispatcher can scrub them from every error text; ``repr`` shows only the redacted target.

Timeouts of an HTTP attempt (``post_json``). ``urllib`` alone applies its one ``timeout`` to
each socket operation, so a server trickling a byte just inside it could hold a worker for
ever. Here ``timeout`` is two deadlines:

- **connect**: resolving is left to the system resolver (not bounded here); then TCP connect
  (every address of the host in turn) and the TLS handshake complete within ``timeout`` in
  all (the handshake gets what the TCP connect left; through an HTTPS proxy, the CONNECT
  exchange in between is bounded per socket operation only);
- **exchange**: from the moment connected, sending the request and reading the status line,
  the headers and the start of the body (``BODY_LIMIT`` bytes) complete within ``timeout`` in
  all, however slowly the bytes come (each read waits at most what is left).

So one attempt takes at most ``ATTEMPT_TIMEOUTS * timeout`` (2 x) plus name resolution; the
dispatcher's bounds (``Policy.max_send_seconds``) use the same factor.
"""

from __future__ import annotations

import base64
import email.utils
import http.client
import io
import json
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
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
    "HttpChannel",
    "SendResult",
    "parse_retry_after",
    "post_json",
]

#: bytes of a response body read (a JSON answer is parsed from them)
BODY_LIMIT = 2048
#: characters of a response body kept for reports (logs, records, stats, the CLIs)
EXCERPT_LIMIT = 200
#: one HTTP attempt lasts at most this many ``timeout``s (connect, then exchange)
ATTEMPT_TIMEOUTS = 2


class ChannelConfigError(ValueError):
    """A channel is misconfigured (raised at configuration time, never while sending).

    ``str()`` is the whole message (``alerts.channels.<name>.<field>: <problem>``);
    ``channel`` (the channel's name), ``field`` (dotted, relative to the channel:
    ``options.port``, ``url``, ``type``; "" for the channel as a whole) and ``problem`` (the
    message without its path) are set when the raiser knew them, for ``build.check`` to
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


_URL_HELP = (
    "if it holds user:password, percent-encode the password's / ? # @ (%2F %3F %23 %40); "
    "an @ in the path or query must be written %40"
)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be used as a webhook URL (None when it can); never echoes it."""
    text = str(url)
    if not text.startswith(("http://", "https://")):
        return f"must start with http:// or https:// (got {redact_url(text) or '***'})"
    if ambiguous_authority(text):
        return "the host cannot be told apart from the credentials; " + _URL_HELP
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


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header: delta-seconds or an HTTP date (against the wall
    clock ``now``, default ``time.time()``). None when absent or unreadable; never negative."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A webhook POST is never silently re-sent elsewhere (or turned into a GET)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001
        return None


def _seconds(timeout: Any) -> float | None:
    return float(timeout) if isinstance(timeout, (int, float)) and timeout > 0 else None


def _connect_within(
    address: tuple[str, int], timeout: Any = None, source_address: Any = None
) -> socket.socket:
    """``socket.create_connection`` with one deadline for every address tried (the standard
    one gives each address the whole ``timeout``). The socket returned keeps what is left
    of the deadline as its timeout, which bounds the TLS handshake as a whole."""
    limit = _seconds(timeout)
    if limit is None:
        return socket.create_connection(address, timeout, source_address)
    deadline = time.monotonic() + limit
    host, port = address
    error: OSError | None = None
    for family, kind, proto, _, addr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left)
            if source_address:
                sock.bind(source_address)
            sock.connect(addr)
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            return sock
        except OSError as exc:
            error = exc
            sock.close()
    if error is not None and not isinstance(error, TimeoutError):
        raise error
    raise TimeoutError("timed out")


class _DeadlineReader(io.RawIOBase):
    """The response's raw stream: every read waits at most what is left until the deadline."""

    def __init__(self, raw: Any, sock: socket.socket, deadline: float) -> None:
        self._raw = raw
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._raw.fileno()

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self._sock.settimeout(left)
        return self._raw.readinto(buffer)

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


class _DeadlineResponse(http.client.HTTPResponse):
    def __init__(self, sock: Any, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        raw = self.fp.detach()  # the socket's reader, kept (detach does not close it)
        self.fp = io.BufferedReader(_DeadlineReader(raw, sock, deadline))


class _Bounded:
    """Mixed into ``http.client`` connections: the connect and exchange deadlines."""

    timeout: Any
    sock: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = _connect_within
        self._exchange_deadline: float | None = None

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        limit = _seconds(self.timeout)
        if limit is not None:
            self._exchange_deadline = time.monotonic() + limit

    def _left(self) -> float:
        left = self._exchange_deadline - time.monotonic()  # type: ignore[operator]
        if left <= 0:
            raise TimeoutError("timed out")
        return left

    def send(self, data: Any) -> None:
        if self.sock is None:
            self.connect()
        if self._exchange_deadline is not None:
            self.sock.settimeout(self._left())
        super().send(data)  # type: ignore[misc]

    def getresponse(self) -> http.client.HTTPResponse:
        if self._exchange_deadline is not None:
            deadline = self._exchange_deadline
            self.response_class = lambda sock, *a, **k: _DeadlineResponse(
                sock, *a, deadline=deadline, **k
            )
        return super().getresponse()  # type: ignore[misc]


class _BoundedHTTPConnection(_Bounded, http.client.HTTPConnection):
    pass


class _BoundedHTTPSConnection(_Bounded, http.client.HTTPSConnection):
    pass


class _BoundedHTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req):  # noqa: ANN001, ANN201
        return self.do_open(_BoundedHTTPConnection, req)


class _BoundedHTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):  # noqa: ANN001, ANN201
        kwargs: dict[str, Any] = {"context": self._context}
        if sys.version_info < (3, 12):  # removed from HTTPSConnection in 3.12
            kwargs["check_hostname"] = self._check_hostname
        return self.do_open(_BoundedHTTPSConnection, req, **kwargs)


_OPENER = urllib.request.build_opener(_NoRedirect, _BoundedHTTPHandler, _BoundedHTTPSHandler)


@dataclass(frozen=True)
class HttpResponse:
    """A 2xx answer: ``body`` is the raw start of the body (``BODY_LIMIT`` bytes, for
    parsing); ``excerpt()`` is what may be shown of it."""

    status: int
    body: str
    headers: Mapping[str, str]
    secrets: tuple[str, ...] = ()
    truncated: bool = False

    def excerpt(self, text: str | None = None) -> str:
        """``body`` (or ``text`` taken from it) with secrets removed, one line, cut short."""
        body = self.body if text is None else text
        return excerpt(body, self.secrets, truncated=self.truncated and text is None)


def post_json(
    url: str,
    payload: Any,
    *,
    timeout: float,
    headers: Mapping[str, str] | None = None,
    method: str = "POST",
    content_type: str = "application/json; charset=utf-8",
    secrets: tuple[str, ...] = (),
) -> HttpResponse:
    """Send ``payload`` (JSON-encoded unless ``bytes``/``str``) with ``urllib.request``.

    ``timeout`` (seconds) is two deadlines (module docstring): connecting (TCP to every
    address, TLS handshake) within ``timeout``, then sending the request and
    reading the status, headers and body start within ``timeout``, however slowly the server
    answers. An attempt lasts at most ``ATTEMPT_TIMEOUTS * timeout`` plus name resolution.
    Redirects are not followed.

    Returns:
        ``HttpResponse`` for a 2xx answer (body decoded, at most ``BODY_LIMIT`` bytes).

    Raises:
        DeliveryError: a non-2xx status (with ``status``, ``retry_after``, ``body``), a
            timeout, or a connection failure; its text never holds ``url`` or ``secrets``.
    """
    if isinstance(payload, bytes):
        data = payload
    elif isinstance(payload, str):
        data = payload.encode("utf-8")
    else:
        data = json.dumps(payload, ensure_ascii=False, default=str).encode("utf-8")
    if ambiguous_authority(url):  # urllib would send part of the password as host or path
        raise DeliveryError(
            "invalid URL: the host cannot be told apart from the credentials; " + _URL_HELP,
            retryable=False,
        )
    target, basic = split_userinfo(url)
    hidden = tuple(x for x in (url, target, basic, *secrets) if x)
    request = urllib.request.Request(target, data=data, method=method)
    request.add_header("Content-Type", content_type)
    request.add_header("User-Agent", "expr_tracker-alerts")
    if basic is not None:
        request.add_header("Authorization", basic)
    for key, value in (headers or {}).items():
        request.add_header(str(key), str(value))  # an explicit Authorization header wins
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            raw = response.read(BODY_LIMIT)
            return HttpResponse(
                response.status,
                raw.decode("utf-8", "replace"),
                dict(response.headers.items()),
                secrets=hidden,
                truncated=len(raw) >= BODY_LIMIT,
            )
    except urllib.error.HTTPError as exc:
        try:
            raw = exc.read(BODY_LIMIT)
        except Exception:  # noqa: BLE001 - the body is only informative
            raw = b""
        retry_after = parse_retry_after(exc.headers.get("Retry-After") if exc.headers else None)
        exc.close()
        raise DeliveryError(
            f"HTTP {exc.code}",
            status=exc.code,
            retry_after=retry_after,
            body=excerpt(raw.decode("utf-8", "replace"), hidden, truncated=len(raw) >= BODY_LIMIT),
        ) from None
    except urllib.error.URLError as exc:
        reason = getattr(exc, "reason", exc)
        raise DeliveryError(_cause(reason, hidden)) from None
    except (TimeoutError, OSError, ValueError) as exc:
        raise DeliveryError(_cause(exc, hidden)) from None
    except Exception as exc:  # noqa: BLE001 - http.client raises assorted errors
        raise DeliveryError(_cause(exc, hidden)) from None


def _cause(exc: Any, hidden: tuple[str, ...]) -> str:
    if isinstance(exc, TimeoutError) or "timed out" in str(exc):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, BaseException):
        text = str(exc) or type(exc).__name__
        return scrub(f"{type(exc).__name__}: {text}", hidden)[:200]
    return scrub(str(exc), hidden)[:200]


def decode_json(body: Any) -> Any:
    """``json.loads`` of a body (a ``str``, or an ``HttpResponse`` whose body it parses);
    raises ``DeliveryError`` (not retryable) for a malformed body, with a scrubbed
    excerpt of it."""
    text = body.body if isinstance(body, HttpResponse) else body
    try:
        return json.loads(text)
    except ValueError:
        shown = body.excerpt() if isinstance(body, HttpResponse) else excerpt(text)
        raise DeliveryError("malformed response (not JSON)", retryable=False, body=shown) from None


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
        ``build.check`` reports them all, also for a channel that is off."""
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


class HttpChannel(Channel):
    """A channel that POSTs one JSON body to a webhook URL.

    Subclasses implement ``payload(message) -> dict`` and may override ``check(response)``
    (service-level error codes in a 200 answer) and ``request_url()`` (signing).
    """

    needs_url = True

    def payload(self, message: AlertMessage) -> Any:
        raise NotImplementedError

    def request_url(self) -> str:
        return self.url  # type: ignore[return-value]

    def headers(self) -> dict[str, str]:
        return {}

    def check(self, response: HttpResponse) -> SendResult:
        return SendResult(response.status, response.excerpt())

    def send(self, message: AlertMessage, timeout: float) -> SendResult:
        response = post_json(
            self.request_url(),
            self.payload(message),
            timeout=timeout,
            headers=self.headers(),
            secrets=self.secrets(),
        )
        return self.check(response)


def check_code(
    response: HttpResponse,
    *,
    code_keys: tuple[str, ...],
    msg_keys: tuple[str, ...],
    retry_codes: frozenset[int] = frozenset(),
) -> SendResult:
    """Check a JSON answer whose first present key of ``code_keys`` must be 0.

    Raises:
        DeliveryError: malformed body (not retried) or a non-zero code (retried only when in
            ``retry_codes``, the service's own rate-limit codes).
    """
    data = decode_json(response)
    if not isinstance(data, dict):
        raise DeliveryError("malformed response (not an object)", retryable=False)
    code = None
    for key in code_keys:
        if key in data:
            code = data[key]
            break
    msg = next((str(data[k]) for k in msg_keys if k in data), "")
    msg = excerpt(msg, response.secrets, limit=120)
    if code is None:
        raise DeliveryError(
            "malformed response (no status code)", retryable=False, body=response.excerpt()
        )
    if code != 0:
        raise DeliveryError(
            excerpt(f"service error {code}: {msg}", response.secrets),
            status=response.status,
            retryable=code in retry_codes,
            body=response.excerpt(),
        )
    return SendResult(response.status, f"code 0 {msg}".strip())


def fields_list(message: AlertMessage, limit: int = 20) -> list[tuple[str, str]]:
    """``(name, value)`` display pairs of ``message.fields`` (at most ``limit``)."""
    from expr_tracker.alerts.delivery.message import format_value

    return [(str(k), format_value(v)) for k, v in list(message.fields.items())[:limit]]
