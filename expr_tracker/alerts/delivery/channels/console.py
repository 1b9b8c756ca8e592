"""Console channel: prints each message with rich (stderr by default). Not rate-limited
unless ``rate_limit_per_minute`` is set in the configuration (``policy_defaults``).

Options: ``console`` (a ``rich.console.Console``, from Python; tests pass a fixed-width one
with ``record=True``), ``stream`` (``"stderr"`` or ``"stdout"``).
"""

from __future__ import annotations

from typing import Any

from expr_tracker.alerts.delivery.channels.base import Channel, SendResult, opt_choice
from expr_tracker.alerts.delivery.message import AlertMessage
from expr_tracker.alerts.rules import LEVEL_STYLE
from expr_tracker.history.values import format_value

__all__ = ["ConsoleChannel", "render_console"]


def render_console(message: AlertMessage) -> Any:
    """A rich renderable for ``message`` (markup in user text is not interpreted)."""
    from rich.text import Text

    text = Text()
    text.append(f" {message.level.upper()} ", style=LEVEL_STYLE.get(message.level, ""))
    text.append(f" {message.title}", style="bold")
    if message.step is not None:
        text.append(f"  step {message.step}", style="dim")
    if message.subtitle:
        text.append("\n  " + message.subtitle, style="italic")
    if message.text:
        text.append("\n  " + message.text)
    for key, value in message.fields.items():
        if key in ("step",):
            continue
        text.append(f"\n  {key}: ", style="dim")
        text.append(format_value(value))
    if message.tags:
        text.append("\n  tags: " + ", ".join(message.tags), style="dim")
    if message.traceback:
        text.append("\n" + message.traceback.rstrip()[-4000:], style="dim")
    return text


class ConsoleChannel(Channel):
    """Prints alerts to the terminal."""

    kind = "console"
    option_names = frozenset({"console", "stream"})
    option_checks = {
        "stream": opt_choice("stderr", "stdout"),
        "console": lambda v: (
            None if callable(getattr(v, "print", None)) else "must be a rich Console (from Python)"
        ),
    }
    #: local and free: printing is not rate-limited unless the configuration asks (dedup
    #: still applies); a token bucket here only held critical alerts behind info ones
    policy_defaults = {"rate_limit_per_minute": None}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        stream = self.options.get("stream") or "stderr"  # checked by option_checks
        self._console = self.options.get("console")
        self._stderr = stream == "stderr"

    @property
    def console(self) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=self._stderr)
        return self._console

    def send(self, message: AlertMessage, timeout: float) -> SendResult:
        self.console.print(render_console(message))
        return SendResult(None, "printed")
