"""DingTalk custom robot: markdown message, signed when ``secret`` is set.

Signature: ``sign = urlencode(base64(HMAC-SHA256(key=secret, msg=f"{timestamp}\\n{secret}")))``
with ``timestamp`` in epoch milliseconds, appended to the URL as ``&timestamp=..&sign=..``.
The answer is ``{"errcode": 0, "errmsg": "ok"}``; 130101 (sending too fast) is retried.
``mentions`` are phone numbers (``at.atMobiles``).

Options: ``at_all`` (bool).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import urllib.parse
from typing import Any

from expr_tracker.alerts.delivery.channels.base import SendResult, fields_list, opt_bool
from expr_tracker.alerts.delivery.channels.bounded_http import HttpChannel, HttpResponse, check_code
from expr_tracker.alerts.delivery.message import AlertMessage

__all__ = ["DingTalkChannel", "dingtalk_sign", "markdown_text"]


def dingtalk_sign(timestamp_ms: int, secret: str) -> str:
    """The DingTalk robot signature (base64, not yet URL-encoded)."""
    msg = f"{timestamp_ms}\n{secret}".encode()
    return base64.b64encode(hmac.new(secret.encode(), msg, hashlib.sha256).digest()).decode()


def _md(text: str) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def markdown_text(message: AlertMessage) -> str:
    """Markdown body shared by DingTalk and WeCom (user text HTML-escaped)."""
    lines = [f"### [{message.level.upper()}] {_md(message.title)}"]
    if message.subtitle:
        lines.append(_md(message.subtitle))
    if message.text:
        lines.append(_md(message.text))
    for k, v in fields_list(message):
        lines.append(f"- **{_md(k)}**: {_md(v)}")
    if message.tags:
        lines.append("tags: " + _md(", ".join(message.tags)))
    if message.traceback:
        lines.append("```\n" + _md(message.traceback[-2000:]) + "\n```")
    if message.link:
        lines.append(f"[open]({message.link})")
    return "\n\n".join(lines)


class DingTalkChannel(HttpChannel):
    """DingTalk custom robot webhook."""

    kind = "dingtalk"
    option_names = frozenset({"at_all"})
    option_checks = {"at_all": opt_bool}

    def __init__(self, *args: Any, clock=time.time, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clock = clock

    def request_url(self) -> str:
        if not self.secret:
            return self.url  # type: ignore[return-value]
        ts = int(self._clock() * 1000)
        sign = urllib.parse.quote_plus(dingtalk_sign(ts, self.secret))
        sep = "&" if "?" in self.url else "?"  # type: ignore[operator]
        return f"{self.url}{sep}timestamp={ts}&sign={sign}"

    def payload(self, message: AlertMessage) -> dict[str, Any]:
        text = markdown_text(message)
        if message.mentions:
            text += "\n\n" + " ".join(f"@{m}" for m in message.mentions)
        return {
            "msgtype": "markdown",
            "markdown": {"title": message.title[:100], "text": text},
            "at": {
                "atMobiles": list(message.mentions),
                "isAtAll": bool(self.options.get("at_all")),
            },
        }

    def check(self, response: HttpResponse) -> SendResult:
        return check_code(
            response, code_keys=("errcode",), msg_keys=("errmsg",), retry_codes=frozenset({130101})
        )
