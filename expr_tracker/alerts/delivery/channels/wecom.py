"""WeCom (WeChat Work) group robot: markdown message.

The answer is ``{"errcode": 0, "errmsg": "ok"}``; 45009 (API frequency limit) is retried.
``mentions`` are user ids rendered as ``<@id>``.
"""

from __future__ import annotations

from typing import Any

from expr_tracker.alerts.delivery.channels.base import SendResult
from expr_tracker.alerts.delivery.channels.bounded_http import HttpChannel, HttpResponse, check_code
from expr_tracker.alerts.delivery.channels.dingtalk import markdown_text
from expr_tracker.alerts.delivery.message import AlertMessage

__all__ = ["WeComChannel"]


class WeComChannel(HttpChannel):
    """WeCom group robot webhook."""

    kind = "wecom"

    def payload(self, message: AlertMessage) -> dict[str, Any]:
        text = markdown_text(message)
        if message.mentions:
            text += "\n" + " ".join(f"<@{m}>" for m in message.mentions)
        return {"msgtype": "markdown", "markdown": {"content": text[:4000]}}

    def check(self, response: HttpResponse) -> SendResult:
        return check_code(
            response, code_keys=("errcode",), msg_keys=("errmsg",), retry_codes=frozenset({45009})
        )
