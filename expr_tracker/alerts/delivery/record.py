"""Sinks for alert events until the delivery issue lands: ``AlertLog`` (alerts.jsonl) and
``ConsoleNotifier`` (rich). Both are plain callables ``sink(event)`` for ``AlertEngine``.

``AlertLog(path)`` appends one JSON line per transition (``AlertEvent.to_record()``:
``kind: "transition"``, rule, event, level, state, step, time, title, message, metrics)
and ``write(record)`` appends any other record (delivery outcomes later). The file is
created on the first record and flushed after each (alerts are rare). A failing disk is
warned about once and never raises (DESIGN.md "Rules that keep it honest").
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from expr_tracker.alerts.rules import LEVEL_STYLE

__all__ = ["AlertLog", "ConsoleNotifier"]

log = logging.getLogger("expr_tracker.alerts")


class AlertLog:
    """Append-only JSONL of alert records at ``path`` (e.g. ``<run>/alerts.rank1.jsonl``)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file = None
        self._failed = False
        self.records = 0

    def __call__(self, event) -> None:
        self.write(event.to_record())

    def write(self, record: dict) -> None:
        """Append one record (NaN/inf written as ``NaN``/``Infinity``, like metrics.jsonl)."""
        line = json.dumps(record, default=str, ensure_ascii=False) + "\n"
        with self._lock:
            try:
                if self._file is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
                self._file.write(line)
                self._file.flush()
                self.records += 1
            except OSError as exc:
                if not self._failed:
                    self._failed = True
                    log.warning("cannot write alert log %s: %s", self.path, exc)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                except OSError:
                    pass
                self._file = None


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
