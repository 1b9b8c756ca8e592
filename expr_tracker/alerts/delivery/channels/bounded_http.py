"""The bounded HTTP client every webhook channel uses (``post_json``), its answer
(``HttpResponse``, ``decode_json``, ``check_code``, ``parse_retry_after``) and
``HttpChannel``, the base of the channels that POST one JSON body.

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
from typing import Any

from expr_tracker.alerts.delivery.channels.base import (
    ATTEMPT_TIMEOUTS,
    URL_HELP,
    Channel,
    DeliveryError,
    SendResult,
    excerpt,
    split_userinfo,
)
from expr_tracker.alerts.delivery.message import AlertMessage
from expr_tracker.alerts.delivery.scrub import ambiguous_authority, scrub

__all__ = [
    "ATTEMPT_TIMEOUTS",
    "BODY_LIMIT",
    "HttpChannel",
    "HttpResponse",
    "check_code",
    "decode_json",
    "parse_retry_after",
    "post_json",
]

#: bytes of a response body read (a JSON answer is parsed from them)
BODY_LIMIT = 2048


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
            "invalid URL: the host cannot be told apart from the credentials; " + URL_HELP,
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
