"""Generic webhook: POST a JSON body built from a template.

Options:
    template: any JSON structure (default: ``AlertMessage.to_dict()``). Every string in it
        is filled with ``safe_format`` from ``AlertMessage.values()`` (``{title}``, ``{text}``,
        ``{level}``, ``{LEVEL}``, ``{step}``, ``{project}``, ``{run}``, any field name...);
        a string that is exactly ``"{fields}"``, ``"{tags}"`` or ``"{message}"`` becomes the
        fields mapping, the tag list or the whole message dict. No attribute or index access.
    method: ``POST`` (default), ``PUT`` or ``PATCH``.
    headers: mapping of extra headers (values are secrets: redacted everywhere).
    headers_env: mapping header -> environment variable holding its value.
    content_type: default ``application/json; charset=utf-8``.

Any 2xx answer is success; the body is not interpreted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from expr_tracker.alerts.delivery.channels.base import (
    config_error,
    opt_choice,
    opt_mapping,
    opt_scalar,
    opt_str,
)
from expr_tracker.alerts.delivery.channels.bounded_http import HttpChannel
from expr_tracker.alerts.delivery.message import AlertMessage, safe_format

__all__ = ["WebhookChannel", "render_body"]

_WHOLE = {"{fields}", "{tags}", "{message}", "{mentions}"}


def render_body(template: Any, message: AlertMessage, _depth: int = 0) -> Any:
    """``template`` with its strings filled from ``message`` (see the module docstring)."""
    if _depth > 32:
        return None
    if isinstance(template, str):
        if template in _WHOLE:
            whole = message.to_dict()
            return whole if template == "{message}" else whole[template[1:-1]]
        return safe_format(template, message.values())
    if isinstance(template, Mapping):
        return {str(k): render_body(v, message, _depth + 1) for k, v in template.items()}
    if isinstance(template, (list, tuple)):
        return [render_body(v, message, _depth + 1) for v in template]
    return template


class WebhookChannel(HttpChannel):
    """Any HTTP endpoint taking a JSON body."""

    kind = "webhook"
    option_names = frozenset({"template", "method", "headers", "headers_env", "content_type"})
    option_checks = {
        "method": opt_choice("POST", "PUT", "PATCH", fold_case=True),
        "headers": opt_mapping(opt_scalar),
        "headers_env": opt_mapping(opt_str),
        "content_type": opt_str,
    }

    def __init__(self, *args: Any, environ: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        env = os.environ if environ is None else environ
        # types were checked by Channel.__init__ (option_checks)
        self.method = str(self.options.get("method") or "POST").upper()
        headers = self.options.get("headers") or {}
        headers_env = self.options.get("headers_env") or {}
        self._headers = {str(k): str(v) for k, v in headers.items()}
        for key, var in headers_env.items():
            value = env.get(str(var))
            if value is None:
                raise config_error(
                    self.name,
                    f"options.headers_env.{key}",
                    f"environment variable {var} is not set",
                )
            self._headers[str(key)] = value
        self.template = self.options.get("template")
        self.content_type = str(
            self.options.get("content_type") or "application/json; charset=utf-8"
        )

    def secrets(self) -> tuple[str, ...]:
        return super().secrets() + tuple(v for v in self._headers.values() if v)

    def headers(self) -> dict[str, str]:
        return dict(self._headers)

    def payload(self, message: AlertMessage) -> Any:
        if self.template is None:
            return message.to_dict()
        return render_body(self.template, message)

    def send(self, message, timeout):  # noqa: ANN001 - see HttpChannel.send
        from expr_tracker.alerts.delivery.channels.bounded_http import post_json

        response = post_json(
            self.url,
            self.payload(message),
            timeout=timeout,
            headers=self.headers(),
            method=self.method,
            content_type=self.content_type,
            secrets=self.secrets(),
        )
        return self.check(response)
