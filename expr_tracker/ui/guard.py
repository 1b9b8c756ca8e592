"""Who may talk to ``et ui`` (docs/ui.md "Security"): an ASGI middleware in front of the app.

1. **Host names.** A request whose ``Host`` header is not one of the server's own names
   (``localhost``, ``127.0.0.1``, ``[::1]``, the ``--host`` value; with or without a port)
   is answered 403. A web page elsewhere that points its own name at 127.0.0.1 (DNS
   rebinding) sends its own name as ``Host``, so it never reaches the data.
2. **The token.** With a token set (``et ui``'s default: a random one), everything but the
   static files (the page's code, no data) needs it: the cookie the page got at its first
   visit, an ``Authorization: token X`` header or a ``?token=X`` query parameter, compared
   with :func:`hmac.compare_digest`. Anything else is 401.
3. **The login.** ``GET /?token=X`` with the right token sets the cookie (``HttpOnly``,
   ``SameSite=Strict``, ``Path=/``) and redirects to the same address without the token (so
   it is not left in the address bar or the history). It is the only request that changes
   anything, and a cross-origin one never does: a request with an ``Origin`` other than the
   server's own, or that the browser marks as coming from another site
   (``Sec-Fetch-Site: cross-site`` or ``same-site``, e.g. a link on another port's page), is
   refused with 403.

Plain ASGI, no web framework imported here (``expr_tracker.ui.server`` wires it up).
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import secrets
import socket
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlencode

__all__ = [
    "LOOPBACK_NAMES",
    "Guard",
    "allowed_hosts",
    "check_token",
    "cookie_name",
    "host_name",
    "new_token",
]

#: the names a browser on this machine uses for the loopback interface
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
#: the token's query parameter, header scheme and cookie prefix
TOKEN_PARAM = "token"
COOKIE_PREFIX = "et_ui_token"
#: static files need no token: the page's code and plotly.js, no run data
PUBLIC_PREFIX = "/static/"

_WILDCARDS = ("0.0.0.0", "::", "")
#: what a token may hold: it travels in a URL, a cookie and a header unescaped
TOKEN_RE = re.compile(r"^[A-Za-z0-9._~-]{1,512}$")


def new_token() -> str:
    """A random token (32 bytes, URL-safe base64: 43 characters)."""
    return secrets.token_urlsafe(32)


def check_token(token: str) -> str:
    """``token`` if usable, else ``ValueError`` saying what a token may hold."""
    if not TOKEN_RE.match(token):
        raise ValueError(
            "a token is 1 to 512 characters of A-Z, a-z, 0-9 and - . _ ~ (it travels in the "
            "URL, a cookie and a header as it is)"
        )
    return token


def cookie_name(port: int | None) -> str:
    """The cookie of the server on ``port``: browsers share cookies between the ports of
    one host, so two dashboards on one machine keep two cookies."""
    return COOKIE_PREFIX if port is None else f"{COOKIE_PREFIX}_{port}"


def host_name(value: str) -> str | None:
    """The host of a ``Host`` header (``name``, ``name:port``, ``[v6]``, ``[v6]:port``),
    lower-cased and without brackets; None when it is not of that form."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1 :]
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return None
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
        return name
    name, sep, port = value.partition(":")
    if sep and not port.isdigit():
        return None  # an IPv6 address without brackets, or a bad port
    return name or None


def allowed_hosts(bind: str | None, extra: Iterable[str] = ()) -> frozenset[str]:
    """The host names the server answers to: the loopback names, the address it binds
    (``bind``: the ``--host`` value, brackets optional) and ``extra``. A wildcard bind
    (``0.0.0.0``, ``::``) adds this machine's host name (``socket.gethostname()``)."""
    names = set(LOOPBACK_NAMES)
    for v in (bind, *extra):
        if v is None:
            continue
        v = v.strip().lower()
        if v.startswith("[") and v.endswith("]"):
            v = v[1:-1]
        if v in _WILDCARDS:
            names.add(socket.gethostname().lower())
            if v:
                names.add(v)
        else:
            names.add(v)
    return frozenset(names)


def _headers(scope: dict[str, Any]) -> dict[str, str]:
    """The request's headers by lower-case name; repeated ones joined (``;`` for cookies)."""
    seen: dict[str, list[str]] = {}
    for k, v in scope.get("headers", ()):
        seen.setdefault(k.decode("latin-1").lower(), []).append(v.decode("latin-1"))
    return {k: ("; " if k == "cookie" else ",").join(vs) for k, vs in seen.items()}


def _cookie_values(header: str, name: str) -> list[str]:
    """Every value of the cookie ``name`` in a ``Cookie`` header, read as browsers write it
    (``a=1; b=2``), leniently: the header holds the cookies of every port of this host, so
    another app's cookie may hold a space, a quote, JSON or no ``=`` at all, and none of
    that may hide ours (``http.cookies.SimpleCookie`` drops every cookie after such a one).
    All values are returned: a second cookie of our name (set by a page on another port,
    with a longer ``Path``, so sent first) must not shadow the right one."""
    values = []
    for part in header.split(";"):
        key, sep, value = part.partition("=")
        if sep and key.strip() == name:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            values.append(value)
    return values


def _equal(given: str | None, token: bytes) -> bool:
    return given is not None and hmac.compare_digest(given.encode("utf-8"), token)


LOGIN_PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>expr_tracker: token needed</title></head>
<body style="font-family: system-ui, sans-serif; margin: 2em">
<h2>This dashboard needs its token</h2>
<p>Open the link <code>et ui</code> printed when it started
(<code>http://127.0.0.1:PORT/?token=...</code>), or paste the token here:</p>
<form method="get" action="/"><input type="password" name="token" size="50" autofocus>
<button type="submit">Open</button></form>
<p>Another user of this machine cannot read your runs through the port without it.</p>
</body></html>
"""


class Guard:
    """The ASGI middleware: ``Host`` check always, the token and login when ``token`` is
    set (None: no token, ``--no-token``)."""

    def __init__(
        self,
        app: Any,
        *,
        hosts: Iterable[str],
        token: str | None,
        cookie: str = COOKIE_PREFIX,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.app = app
        self.hosts = frozenset(h.lower() for h in hosts)
        self.token = check_token(token).encode("ascii") if token is not None else None
        self.cookie = cookie
        self.extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":  # the dashboard has none
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        h = _headers(scope)
        host = host_name(h.get("host", ""))
        if host is None or host not in self.hosts:
            await self._plain(
                send, 403, "forbidden: this dashboard answers only to its own host names"
            )
            return
        if self.token is None or scope.get("path", "").startswith(PUBLIC_PREFIX):
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        from_query = [v for k, v in query if k == TOKEN_PARAM]
        if from_query and scope.get("path") == "/":
            await self._login(scope, h, query, from_query[-1], send)
            return
        if self._authorized(h, from_query):
            await self.app(scope, receive, send)
            return
        if scope.get("path") == "/":
            await self._send(send, 401, "text/html; charset=utf-8", LOGIN_PAGE)
        else:
            await self._plain(
                send,
                401,
                "a token is needed: open the link et ui printed (http://HOST:PORT/?token=...), "
                "or send the header 'Authorization: token TOKEN'",
                json=True,
            )

    def _authorized(self, h: dict[str, str], from_query: list[str]) -> bool:
        assert self.token is not None
        auth = h.get("authorization", "")
        scheme, _, value = auth.strip().partition(" ")
        if scheme.lower() == "token" and _equal(value.strip(), self.token):
            return True
        if from_query and _equal(from_query[-1], self.token):
            return True
        return any(_equal(v, self.token) for v in _cookie_values(h.get("cookie", ""), self.cookie))

    async def _login(
        self,
        scope: dict[str, Any],
        h: dict[str, str],
        query: list[tuple[str, str]],
        given: str,
        send: Any,
    ) -> None:
        assert self.token is not None
        own = f"{scope.get('scheme', 'http')}://{h.get('host', '')}".lower()
        origin = h.get("origin")
        site = h.get("sec-fetch-site", "").lower()
        if (origin is not None and origin.lower() != own) or site in ("cross-site", "same-site"):
            await self._plain(
                send,
                403,
                "forbidden: a link from another site cannot log in; paste the link et ui "
                "printed into the address bar",
            )
            return
        if not _equal(given, self.token):
            await self._send(send, 401, "text/html; charset=utf-8", LOGIN_PAGE)
            return
        rest = [(k, v) for k, v in query if k != TOKEN_PARAM]
        location = "/" + (f"?{urlencode(rest)}" if rest else "")
        cookie = f"{self.cookie}={self.token.decode('utf-8')}; HttpOnly; SameSite=Strict; Path=/"
        await self._send(
            send,
            303,
            "text/plain; charset=utf-8",
            b"",
            [("location", location), ("set-cookie", cookie)],
        )

    async def _plain(self, send: Any, status: int, text: str, json: bool = False) -> None:
        if json:
            import json as _json

            body = _json.dumps({"error": text}).encode("utf-8")
            await self._send(send, status, "application/json", body)
        else:
            await self._send(send, status, "text/plain; charset=utf-8", text.encode("utf-8"))

    async def _send(
        self,
        send: Any,
        status: int,
        media: str,
        body: bytes,
        more: list[tuple[str, str]] | None = None,
    ) -> None:
        headers = [
            (b"content-type", media.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
            *self.extra,
            *((k.encode(), v.encode("latin-1")) for k, v in (more or [])),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
