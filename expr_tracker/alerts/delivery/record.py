"""Sinks for alert events: ``ConsoleNotifier`` (rich), a plain callable ``sink(event)`` for
``AlertEngine``; ``AlertLog`` (the run's ``alerts.jsonl``) is re-exported from its one home,
``history/alertlog.py``, which also reads the file.
"""

from __future__ import annotations

from expr_tracker.alerts.rules import LEVEL_STYLE
from expr_tracker.history.alertlog import AlertLog

__all__ = ["AlertLog", "ConsoleNotifier"]


class ConsoleNotifier:
    """Prints deliverable alert events with rich (to stderr by default).

    ``console``: a ``rich.console.Console`` (tests pass one with a fixed width and
    ``record=True``). ``render(event)`` returns the renderable, for tests and reuse.
    """

    def __init__(self, console=None) -> None:
        if console is None:
            from rich.console import Console

            console = Console(stderr=True)
        self.console = console

    def render(self, event):
        from rich.text import Text

        style = LEVEL_STYLE.get(event.level, "")
        text = Text()
        text.append(f" {event.level.upper()} ", style=style)
        text.append(f" {event.title}", style="bold")
        if event.step is not None:
            text.append(f"  step {event.step}", style="dim")
        if event.message:
            text.append("\n  " + event.message)
        return text

    def __call__(self, event) -> None:
        self.console.print(self.render(event))
