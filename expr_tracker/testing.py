"""Test doubles for users' own tests (docs/channels.md "Testing your alerts").

- ``InMemoryChannel``: a channel (type ``memory``) that keeps every message it is sent;
  scriptable to fail (``fail_times``, ``status``) so retry and failure paths can be tested.
  Configure it like any channel (``{"type": "memory", "name": "mem"}``) and find the
  instance with ``InMemoryChannel.get("mem")`` or ``run.dispatcher.lanes["mem"].channel``.
- ``capture_alerts()``: a context manager collecting every alert any dispatcher takes
  (direct ``et.alert()`` calls, rule alerts, finish messages), routed or not::

      with capture_alerts() as alerts:
          train()
      alerts.assert_alerted("loss spike", level="error")

- ``WebhookServer``: a real HTTP server on 127.0.0.1 (ephemeral port, threaded) standing in
  for a webhook service, scripted to answer 200, 429 with ``Retry-After``, 500, malformed
  bodies, or to hang; it records every request.
- ``FakeClock``: a monotonic clock with ``sleep``/``advance`` for ``Dispatcher(clock=...,
  sleep=..., start=False)``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from expr_tracker.alerts.delivery.channels.base import (
    Channel,
    DeliveryError,
    SendResult,
    opt_int,
    opt_number,
)
from expr_tracker.alerts.delivery.message import AlertMessage

__all__ = ["AlertCapture", "FakeClock", "InMemoryChannel", "WebhookServer", "capture_alerts"]


class InMemoryChannel(Channel):
    """Keeps what it is sent in ``messages``.

    Options: ``fail_times`` (the first N sends fail), ``status`` (HTTP status of those
    failures, default 500; None: a network error), ``retry_after`` (seconds, on failures).
    """

    kind = "memory"
    option_names = frozenset({"fail_times", "status", "retry_after"})
    option_checks = {
        "fail_times": opt_int(0),
        "status": opt_int(100, 599),
        "retry_after": opt_number(0.0),
    }
    _instances: weakref.WeakValueDictionary[str, InMemoryChannel] = weakref.WeakValueDictionary()

    def __init__(self, name: str | None = "memory", **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.messages: list[AlertMessage] = []
        self.attempts = 0
        self.fail_times = int(self.options.get("fail_times", 0))
        self.status = self.options.get("status", 500)
        self.retry_after = self.options.get("retry_after")
        self._lock = threading.Lock()
        InMemoryChannel._instances[self.name] = self

    @classmethod
    def get(cls, name: str = "memory") -> InMemoryChannel | None:
        """The most recent live instance named ``name``."""
        return cls._instances.get(name)

    def send(self, message: AlertMessage, timeout: float) -> SendResult:
        with self._lock:
            self.attempts += 1
            if self.fail_times > 0:
                self.fail_times -= 1
                status = self.status
                reason = f"HTTP {status}" if status is not None else "connection refused"
                raise DeliveryError(reason, status=status, retry_after=self.retry_after)
            self.messages.append(message)
        return SendResult(200, "ok")

    @property
    def titles(self) -> list[str]:
        return [m.title for m in self.messages]

    def clear(self) -> None:
        with self._lock:
            self.messages.clear()


class AlertCapture:
    """Messages seen by ``capture_alerts()``; ``routes[i]`` lists the channels message ``i``
    was routed to."""

    def __init__(self) -> None:
        self.messages: list[AlertMessage] = []
        self.routes: list[list[str]] = []
        self._lock = threading.Lock()

    def _tap(self, message: AlertMessage, routed: list[str]) -> None:
        with self._lock:
            self.messages.append(message)
            self.routes.append(list(routed))

    @property
    def titles(self) -> list[str]:
        return [m.title for m in self.messages]

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self) -> Iterator[AlertMessage]:
        return iter(list(self.messages))

    def clear(self) -> None:
        with self._lock:
            self.messages.clear()
            self.routes.clear()

    def find(
        self, title: str | None = None, *, level: str | None = None, rule: str | None = None
    ) -> list[AlertMessage]:
        """Messages whose title contains ``title``, with ``level`` and ``rule`` when given."""
        return [
            m
            for m in self.messages
            if (title is None or title in m.title)
            and (level is None or m.level == level)
            and (rule is None or m.rule == rule)
        ]

    def assert_alerted(
        self, title: str | None = None, *, level: str | None = None, rule: str | None = None
    ) -> AlertMessage:
        """The first matching message. Raises ``AssertionError`` listing what was seen."""
        found = self.find(title, level=level, rule=rule)
        if not found:
            seen = ", ".join(f"[{m.level}] {m.title!r}" for m in self.messages) or "nothing"
            raise AssertionError(
                f"no alert matching title={title!r} level={level!r} rule={rule!r}; saw: {seen}"
            )
        return found[0]

    def assert_quiet(self) -> None:
        """Raises ``AssertionError`` when any alert was captured."""
        if self.messages:
            raise AssertionError(f"expected no alerts, saw {self.titles}")


@contextmanager
def capture_alerts() -> Iterator[AlertCapture]:
    """Collect every alert message any dispatcher takes while the block runs."""
    from expr_tracker.alerts.delivery.dispatcher import add_tap, remove_tap

    capture = AlertCapture()
    add_tap(capture._tap)
    try:
        yield capture
    finally:
        remove_tap(capture._tap)


class FakeClock:
    """Monotonic seconds that only move when told: ``clock()``, ``sleep(s)`` (advances and
    records ``sleeps``), ``advance(s)``."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = float(start)
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(0.0, seconds)

    def advance(self, seconds: float) -> None:
        self.now += seconds


class WebhookServer:
    """A scripted webhook endpoint on ``127.0.0.1`` (use as a context manager).

    ``script``: answers used in order, the last one repeated; each is
    ``(status, body)`` or ``(status, body, headers)``, or the string ``"hang"`` (hold the
    request until the server stops). Default: ``(200, "ok")``.
    ``requests``: ``(method, path, headers, body_bytes)`` per request received;
    ``json(i)`` decodes the body of request ``i``. ``url`` is the base URL plus ``path``.
    """

    def __init__(self, script: Any = None, path: str = "/hook/T0KEN-s3cr3t") -> None:
        import http.server

        self.script = list(script or [(200, "ok")])
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self._index = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with outer._lock:
                    outer.requests.append((self.command, self.path, dict(self.headers), body))
                    step = outer.script[min(outer._index, len(outer.script) - 1)]
                    outer._index += 1
                if step == "hang":
                    outer._stop.wait(60)
                    return
                status, text, *rest = step
                headers = rest[0] if rest else {}
                data = text.encode() if isinstance(text, str) else bytes(text)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, str(value))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_PUT = do_PATCH = _answer

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}{path}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()

    def json(self, index: int = -1) -> Any:
        import json

        return json.loads(self.requests[index][3])
