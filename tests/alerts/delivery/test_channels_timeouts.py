"""What ``timeout`` bounds for HTTP channels, against real servers on 127.0.0.1 that trickle
their answer a byte at a time (each byte well inside ``timeout``, so a per-read timeout never
fires): an attempt ends within ``ATTEMPT_TIMEOUTS * timeout``."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from expr_tracker.alerts.delivery import Dispatcher, Policy
from expr_tracker.alerts.delivery.channels import DeliveryError, create_channel
from expr_tracker.alerts.delivery.channels.bounded_http import ATTEMPT_TIMEOUTS, post_json
from expr_tracker.alerts.delivery.message import AlertMessage

TIMEOUT = 0.4
BYTE_EVERY = 0.05


pytestmark = pytest.mark.usefixtures("no_proxy")


class Trickler:
    """A raw TCP server on 127.0.0.1: reads the request, writes ``head`` at once, then one
    byte of ``tail`` every ``every`` seconds (repeating ``tail`` for ever when ``forever``)."""

    def __init__(self, head: bytes, tail: bytes, every: float = BYTE_EVERY, forever=True):
        self.head, self.tail, self.every, self.forever = head, tail, every, forever
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook/T0KEN"
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn):
        with conn:
            try:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                conn.sendall(self.head)
                while not self.stop.is_set():
                    for byte in self.tail:
                        if self.stop.wait(self.every):
                            return
                        conn.sendall(bytes([byte]))
                    if not self.forever:
                        return
            except OSError:
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


def timed_post(url, timeout=TIMEOUT, limit=10.0):
    """post_json in a thread (so a test fails, not hangs, when nothing bounds it)."""
    out = {}

    def go():
        t0 = time.monotonic()
        try:
            out["response"] = post_json(url, {"a": 1}, timeout=timeout)
        except DeliveryError as exc:
            out["error"] = exc
        out["elapsed"] = time.monotonic() - t0

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), f"post_json still running after {limit} s"
    return out


def test_trickled_headers_end_within_the_timeout():
    head = b"HTTP/1.1 200 OK\r\nX-Slow: "
    with Trickler(head, b"a") as server:
        out = timed_post(server.url)
    assert out["error"].reason == "timed out" and out["error"].retryable
    assert TIMEOUT * 0.9 <= out["elapsed"] < ATTEMPT_TIMEOUTS * TIMEOUT + 0.5


def test_trickled_body_ends_within_the_timeout():
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"
    with Trickler(head, b"x") as server:
        out = timed_post(server.url)
    assert out["error"].reason == "timed out"
    assert out["elapsed"] < ATTEMPT_TIMEOUTS * TIMEOUT + 0.5


def test_trickled_error_status_body_ends_within_the_timeout():
    head = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 100000\r\n\r\n"
    with Trickler(head, b"x") as server:
        out = timed_post(server.url)
    # the body is only informative: the status is reported, within the bound
    assert out["error"].status == 500
    assert out["elapsed"] < ATTEMPT_TIMEOUTS * TIMEOUT + 0.5


def test_slow_answer_inside_the_timeout_is_delivered():
    body = b'{"ok": 1}'
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    with Trickler(head, body, every=0.01, forever=False) as server:
        out = timed_post(server.url, timeout=2.0)
    assert out["response"].status == 200 and out["response"].body == '{"ok": 1}'


def test_channel_send_through_the_dispatcher_is_bounded():
    """A worker sending to a trickling endpoint is free again within the policy's bound
    (``Policy.max_send_seconds``), every attempt counted."""
    head = b"HTTP/1.1 200 OK\r\nX-Slow: "
    with Trickler(head, b"a") as server:
        ch = create_channel({"type": "webhook", "name": "slow", "url": server.url})
        d = Dispatcher()
        policy = Policy(
            timeout=0.3, max_retries=1, backoff_initial=0.05, jitter=0.0, rate_limit_per_minute=None
        )
        d.add_channel(ch, policy=policy)
        t0 = time.monotonic()
        result = d.submit(AlertMessage("trickle"), wait=True)
        elapsed = time.monotonic() - t0
        d.close(1.0)
    assert result.delivered == {"slow": False} and "timed out" in result.detail["slow"]
    assert "T0KEN" not in result.detail["slow"]
    assert elapsed < ATTEMPT_TIMEOUTS * 0.3 * 2 + 0.05 + 0.5
    assert d.stats()["slow"]["retries"] == 1 and d.stats()["slow"]["failed"] == 1
