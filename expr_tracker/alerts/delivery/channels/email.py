"""E-mail through ``smtplib``: STARTTLS (default) or implicit SSL, an HTML part with a plain
text fallback. Everything placed into the HTML is escaped with ``html.escape``.

Options:
    host (required), port (default 587 with STARTTLS, 465 with SSL, 25 when neither),
    ssl (bool, implicit TLS), starttls (bool, default True unless ``ssl``),
    username, password or password_env (environment variable), from_addr (required),
    to (an address or a list, required), cc, subject_prefix (default ``"[expr_tracker]"``),
    ca_file (a CA bundle to trust, e.g. a private relay), verify (bool, default True).

A refused recipient, an authentication failure or a protocol error is not retried; a
connection failure or timeout is. Passwords never appear in errors, stats or ``repr``.
"""

from __future__ import annotations

import html
import os
import smtplib
import ssl
from collections.abc import Mapping
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import Any

from expr_tracker.alerts.delivery.channels.base import (
    Channel,
    DeliveryError,
    SendResult,
    config_error,
    fields_list,
    opt_bool,
    opt_str,
)
from expr_tracker.alerts.delivery.message import AlertMessage
from expr_tracker.alerts.delivery.scrub import scrub

__all__ = ["EmailChannel", "render_html"]

_COLOUR = {
    "debug": "#777777",
    "info": "#1f6feb",
    "warning": "#d29922",
    "error": "#cf222e",
    "critical": "#8b0000",
}


def render_html(message: AlertMessage) -> str:
    """The HTML body: every piece of message text escaped."""
    e = html.escape
    colour = _COLOUR.get(message.level, "#333333")
    parts = [
        '<html><body style="font-family:sans-serif">',
        f'<h2 style="color:{colour}">[{e(message.level.upper())}] {e(message.title)}</h2>',
    ]
    if message.subtitle:
        parts.append(f"<p><em>{e(message.subtitle)}</em></p>")
    if message.text:
        parts.append("<p>" + e(message.text).replace("\n", "<br>") + "</p>")
    pairs = fields_list(message, limit=50)
    if pairs:
        parts.append('<table cellpadding="4" style="border-collapse:collapse">')
        for k, v in pairs:
            parts.append(f'<tr><th align="left">{e(k)}</th><td>{e(v)}</td></tr>')
        parts.append("</table>")
    if message.tags:
        parts.append(f"<p>tags: {e(', '.join(message.tags))}</p>")
    if message.link and message.link.startswith(("http://", "https://")):
        parts.append(f'<p><a href="{e(message.link, quote=True)}">{e(message.link)}</a></p>')
    if message.traceback:
        parts.append(f"<pre>{e(message.traceback[-8000:])}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _split_addresses(value: Any) -> Any:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def _address_problem(value: Any) -> str | None:
    value = _split_addresses(value)
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, str) and "@" in v for v in value
    ):
        return "must be an e-mail address or a list of them"
    return None


def _one_address(value: Any) -> str | None:
    if not isinstance(value, str) or "@" not in value:
        return "must be an e-mail address"
    return None


def _port_problem(value: Any) -> str | None:
    # a digit string is accepted: Hydra's ${oc.env:SMTP_PORT} gives one
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        shown = value if isinstance(value, int) else type(value).__name__
        return f"must be an integer from 1 to 65535, got {shown}"
    return None


def _addresses(value: Any) -> list[str]:
    return [] if value is None else list(_split_addresses(value))


class EmailChannel(Channel):
    """SMTP e-mail channel."""

    kind = "email"
    option_names = frozenset(
        {
            "host",
            "port",
            "ssl",
            "starttls",
            "username",
            "password",
            "password_env",
            "from_addr",
            "to",
            "cc",
            "subject_prefix",
            "ca_file",
            "verify",
        }
    )
    option_checks = {
        "host": opt_str,
        "port": _port_problem,
        "ssl": opt_bool,
        "starttls": opt_bool,
        "username": opt_str,
        "password": opt_str,
        "password_env": opt_str,
        "from_addr": _one_address,
        "to": _address_problem,
        "cc": _address_problem,
        "subject_prefix": opt_str,
        "ca_file": opt_str,
        "verify": opt_bool,
    }

    def __init__(self, *args: Any, environ: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        env = os.environ if environ is None else environ
        # types were checked by Channel.__init__ (option_checks); what is required here
        self.host = o.get("host")
        if not self.host:
            raise config_error(self.name, "options.host", "is required")
        self.ssl = bool(o.get("ssl") or False)
        starttls = o.get("starttls")
        self.starttls = (not self.ssl) if starttls is None else bool(starttls)
        if self.ssl and self.starttls:
            raise config_error(self.name, "options", "choose ssl or starttls, not both")
        default_port = 465 if self.ssl else (587 if self.starttls else 25)
        port = o.get("port")
        self.port = default_port if port is None else int(port)
        self.username = o.get("username")
        self._password = o.get("password")
        if o.get("password_env"):
            self._password = env.get(str(o["password_env"]))
            if self._password is None:
                raise config_error(
                    self.name,
                    "options.password_env",
                    f"environment variable {o['password_env']} is not set",
                )
        self.from_addr = o.get("from_addr")
        if not self.from_addr:
            raise config_error(self.name, "options.from_addr", "an e-mail address is required")
        self.to = _addresses(o.get("to"))
        self.cc = _addresses(o.get("cc"))
        if not self.to:
            raise config_error(self.name, "options.to", "is required")
        self.subject_prefix = str(o.get("subject_prefix") or "[expr_tracker]")
        self.ca_file = o.get("ca_file")
        verify = o.get("verify")
        self.verify = True if verify is None else bool(verify)

    def secrets(self) -> tuple[str, ...]:
        return super().secrets() + ((str(self._password),) if self._password else ())

    @property
    def target(self) -> str:
        return f"smtp{'s' if self.ssl else ''}://{self.host}:{self.port}"

    def _context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def build(self, message: AlertMessage) -> EmailMessage:
        """The MIME message: text/plain with a text/html alternative."""
        msg = EmailMessage()
        subject = f"{self.subject_prefix} [{message.level.upper()}] {message.title}".strip()
        msg["Subject"] = " ".join(subject.split())[:250]
        msg["From"] = self.from_addr
        msg["To"] = ", ".join(self.to)
        if self.cc:
            msg["Cc"] = ", ".join(self.cc)
        msg["Date"] = formatdate(message.timestamp, localtime=True)
        msg["Message-ID"] = make_msgid(domain=self.from_addr.rsplit("@", 1)[-1])
        msg.set_content(message.plain_text())
        msg.add_alternative(render_html(message), subtype="html")
        return msg

    def send(self, message: AlertMessage, timeout: float) -> SendResult:
        msg = self.build(message)
        hidden = self.secrets()
        try:
            if self.ssl:
                client = smtplib.SMTP_SSL(
                    self.host, self.port, timeout=timeout, context=self._context()
                )
            else:
                client = smtplib.SMTP(self.host, self.port, timeout=timeout)
            with client:
                if self.starttls:
                    client.starttls(context=self._context())
                if self.username:
                    client.login(str(self.username), str(self._password or ""))
                refused = client.send_message(msg, to_addrs=self.to + self.cc)
        except smtplib.SMTPAuthenticationError as exc:
            raise DeliveryError(
                f"SMTP authentication failed ({exc.smtp_code})", retryable=False
            ) from None
        except smtplib.SMTPRecipientsRefused:
            raise DeliveryError("SMTP recipients refused", retryable=False) from None
        except smtplib.SMTPResponseException as exc:
            retry = 400 <= int(exc.smtp_code) < 500
            raise DeliveryError(
                scrub(f"SMTP {exc.smtp_code}", hidden), status=None, retryable=retry
            ) from None
        except (smtplib.SMTPException, ssl.SSLError) as exc:
            raise DeliveryError(scrub(f"SMTP error: {type(exc).__name__}", hidden)) from None
        except (TimeoutError, OSError) as exc:
            cause = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
            raise DeliveryError(f"SMTP connection failed: {cause}") from None
        if refused:
            return SendResult(None, f"accepted; refused: {', '.join(sorted(refused))}")
        return SendResult(None, f"accepted by {self.host}")
