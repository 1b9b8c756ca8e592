"""Lark (Feishu) custom bot: an interactive card built as plain JSON, optionally signed.

Signature (when ``secret`` is set): ``sign = base64(HMAC-SHA256(key=f"{timestamp}\\n{secret}",
msg=b""))`` with ``timestamp`` in epoch seconds, sent as ``timestamp``/``sign`` in the body.
The answer is ``{"code": 0, ...}`` (older bots: ``{"StatusCode": 0}``); code 11232 (rate
limited) is retried. User text goes into ``plain_text`` elements (no markup interpreted);
field names and values into ``lark_md`` are escaped.

Options: ``header_template`` (card colour, a string; default by level).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Any

from expr_tracker.alerts.delivery.channels.base import SendResult, fields_list, opt_str
from expr_tracker.alerts.delivery.channels.bounded_http import HttpChannel, HttpResponse, check_code
from expr_tracker.alerts.delivery.message import AlertMessage

__all__ = ["LarkChannel", "lark_card", "lark_sign", "md_escape"]

_COLOUR = {
    "debug": "grey",
    "info": "blue",
    "warning": "orange",
    "error": "red",
    "critical": "carmine",
}


def lark_sign(timestamp: int, secret: str) -> str:
    """The Lark bot signature of ``timestamp`` (epoch seconds) with ``secret``."""
    key = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def md_escape(text: str) -> str:
    """Escape text for lark_md: HTML entities for ``& < >`` and a backslash before markdown
    punctuation, so user text can neither mention people nor inject links."""
    text = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for ch in "\\*_~`[]()#":
        text = text.replace(ch, "\\" + ch)
    return text


def lark_card(message: AlertMessage, template: str | None = None) -> dict[str, Any]:
    """The ``msg_type: interactive`` body for ``message`` (plain dicts)."""
    elements: list[dict[str, Any]] = []
    if message.subtitle:
        elements.append({"tag": "div", "text": {"tag": "plain_text", "content": message.subtitle}})
    if message.text:
        elements.append({"tag": "div", "text": {"tag": "plain_text", "content": message.text}})
    pairs = fields_list(message)
    if pairs:
        elements.append(
            {
                "tag": "div",
                "fields": [
                    {
                        "is_short": True,
                        "text": {
                            "tag": "lark_md",
                            "content": f"**{md_escape(k)}**\n{md_escape(v)}",
                        },
                    }
                    for k, v in pairs
                ],
            }
        )
    if message.traceback:
        elements.append({"tag": "hr"})
        elements.append(
            {"tag": "div", "text": {"tag": "plain_text", "content": message.traceback[-3000:]}}
        )
    if message.link:
        elements.append(
            {
                "tag": "action",
                "actions": [
                    {
                        "tag": "button",
                        "text": {"tag": "plain_text", "content": "Open"},
                        "type": "default",
                        "url": message.link,
                    }
                ],
            }
        )
    note = f"{message.level.upper()} · {message.source}"
    if message.tags:
        note += " · " + ", ".join(message.tags)
    elements.append({"tag": "note", "elements": [{"tag": "plain_text", "content": note}]})
    return {
        "msg_type": "interactive",
        "card": {
            "config": {"wide_screen_mode": True},
            "header": {
                "title": {"tag": "plain_text", "content": message.title[:200]},
                "template": template or _COLOUR.get(message.level, "blue"),
            },
            "elements": elements,
        },
    }


class LarkChannel(HttpChannel):
    """Lark / Feishu custom bot webhook (interactive card, signed when ``secret`` is set)."""

    kind = "lark"
    option_names = frozenset({"header_template"})
    option_checks = {"header_template": opt_str}

    def __init__(self, *args: Any, clock=time.time, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clock = clock

    def payload(self, message: AlertMessage) -> dict[str, Any]:
        body = lark_card(message, self.options.get("header_template"))
        if self.secret:
            ts = int(self._clock())
            body = {"timestamp": str(ts), "sign": lark_sign(ts, self.secret), **body}
        return body

    def check(self, response: HttpResponse) -> SendResult:
        return check_code(
            response,
            code_keys=("code", "StatusCode"),
            msg_keys=("msg", "StatusMessage"),
            retry_codes=frozenset({11232, 9499}),
        )
