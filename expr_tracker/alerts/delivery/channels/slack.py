"""Slack incoming webhook: Block Kit body with a plain-text fallback.

Slack answers ``200 ok``; 429 carries ``Retry-After`` (the dispatcher honours it). User text
is escaped for mrkdwn (``& < >``), so it cannot mention channels or inject links.

Options: ``username``, ``icon_emoji``, ``channel`` (legacy webhooks only).
"""

from __future__ import annotations

from typing import Any

from expr_tracker.alerts.delivery.channels.base import (
    DeliveryError,
    SendResult,
    excerpt,
    fields_list,
    opt_str,
)
from expr_tracker.alerts.delivery.channels.bounded_http import HttpChannel, HttpResponse
from expr_tracker.alerts.delivery.message import AlertMessage

__all__ = ["SlackChannel", "slack_blocks", "slack_escape"]

_EMOJI = {
    "debug": ":grey_question:",
    "info": ":information_source:",
    "warning": ":warning:",
    "error": ":x:",
    "critical": ":rotating_light:",
}


def slack_escape(text: str) -> str:
    """Escape ``& < >`` the way Slack's mrkdwn requires."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_blocks(message: AlertMessage) -> dict[str, Any]:
    """``{"text": fallback, "blocks": [...]}`` for ``message``."""
    title = f"{_EMOJI.get(message.level, '')} {message.title}".strip()
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:150], "emoji": True}}
    ]
    body = "\n".join(p for p in (message.subtitle, message.text) if p)
    if body:
        blocks.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": slack_escape(body)[:3000]}}
        )
    pairs = fields_list(message, limit=10)
    if pairs:
        blocks.append(
            {
                "type": "section",
                "fields": [
                    {"type": "mrkdwn", "text": f"*{slack_escape(k)}*\n{slack_escape(v)}"}
                    for k, v in pairs
                ],
            }
        )
    if message.traceback:
        tb = slack_escape(message.traceback[-2800:]).replace("```", "'''")
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"```{tb}```"}})
    context = f"{message.level.upper()} · {slack_escape(message.source)}"
    if message.tags:
        context += " · " + slack_escape(", ".join(message.tags))
    if message.link:
        context += f" · <{slack_escape(message.link)}|open>"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    fallback = f"[{message.level.upper()}] {message.title}"
    if message.text:
        fallback += f": {message.text}"
    return {"text": slack_escape(fallback)[:3000], "blocks": blocks}


class SlackChannel(HttpChannel):
    """Slack incoming webhook."""

    kind = "slack"
    option_names = frozenset({"username", "icon_emoji", "channel"})
    option_checks = {"username": opt_str, "icon_emoji": opt_str, "channel": opt_str}

    def payload(self, message: AlertMessage) -> dict[str, Any]:
        body = slack_blocks(message)
        for key in ("username", "icon_emoji", "channel"):
            if self.options.get(key):
                body[key] = str(self.options[key])
        return body

    def check(self, response: HttpResponse) -> SendResult:
        text = response.body.strip()
        if text and text != "ok":
            shown = response.excerpt()
            raise DeliveryError(
                f"unexpected answer {excerpt(shown, limit=80)!r}", retryable=False, body=shown
            )
        return SendResult(response.status, "ok")
