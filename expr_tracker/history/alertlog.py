"""The alert log, ``alerts[.S][.rankN].jsonl``: the one module that writes and reads it.

Writing (``AlertLog(path)``, made by the composition root for a run): one JSON line per
record, appended and flushed as it comes (alerts are rare), the file created on the first
record. A rule transition is ``AlertEvent.to_record()`` (``kind: "transition"``: rule, event,
level, state, step, time, title, message, metrics); a delivery outcome is
``{"kind": "delivery", ...}`` (docs/channels.md "Outcomes, stats, finish"). Non-finite floats are
written as ``NaN``/``Infinity``, as in ``metrics.jsonl``. A failing disk is warned about once
and never raises: an alert must not stop the training that raised it.

Reading (``read_alert_log(path)``: ``et alerts``, the ``alerts`` view of ``et query``, the run
page of ``et ui``), one rule for all of them: the file is untrusted input
(``history/untrusted.py``: a regular file only, inside ``root``, at most ``max_bytes`` read);
a line is a record once its newline is written and it decodes to a JSON object
(``history.codec.decode_line``: ``NaN``/``Infinity`` accepted, depth-limited); a complete
line that does not is counted in ``bad`` (with the first one's line number and reason); a
last line without its newline yet is ``torn`` (being written, or cut by a crash) and is not
a record. A missing file reads as no records: a run that never alerted has none.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expr_tracker.history.codec import decode_line
from expr_tracker.history.untrusted import read_regular

__all__ = ["MAX_BYTES", "AlertLines", "AlertLog", "AlertRecord", "read_alert_log"]

log = logging.getLogger("expr_tracker.alerts")

#: the most bytes of an alert log read (whole: the file is small, a line per alert)
MAX_BYTES = 256 << 20


class AlertLog:
    """Append-only JSONL of alert records at ``path`` (e.g. ``<run>/alerts.rank1.jsonl``);
    a callable ``sink(event)`` for ``AlertEngine`` (``event.to_record()``), and ``write(record)``
    for any other record (delivery outcomes)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file: Any = None
        self._failed = False
        self.records = 0

    def __call__(self, event: Any) -> None:
        self.write(event.to_record())

    def write(self, record: dict[str, Any]) -> None:
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


@dataclass(frozen=True)
class AlertRecord:
    """One record of the log: ``line`` (0-based), the decoded ``record``, the line's ``text``."""

    line: int
    record: dict[str, Any]
    text: str


@dataclass
class AlertLines:
    """What :func:`read_alert_log` read: the ``records`` in file order; ``bad``: complete
    lines that are not records, ``first_bad``: ``(line, 0-based; reason)`` of the first;
    ``torn``: whether a last line without its newline was left out."""

    records: list[AlertRecord] = field(default_factory=list)
    bad: int = 0
    first_bad: tuple[int, str] | None = None
    torn: bool = False


def read_alert_log(
    path: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    max_bytes: int = MAX_BYTES,
) -> AlertLines:
    """The records of the alert log at ``path`` (see the module docstring for the rule).

    Raises:
        OSError: the file cannot be read (``history.untrusted.UnsafeFileError`` for one that
            is not a regular file, outside ``root`` or larger than ``max_bytes``); a missing
            file is no error (no records).
    """
    try:
        data = read_regular(path, root=root, max_bytes=max_bytes)
    except FileNotFoundError:
        return AlertLines()
    out = AlertLines()
    end = data.rfind(b"\n") + 1
    out.torn = bool(data[end:].strip())
    for i, raw in enumerate(data[:end].split(b"\n")[:-1]):
        if not raw.strip():
            continue
        try:
            record = decode_line(raw)
            why = None if isinstance(record, dict) else "not a JSON object"
        except ValueError as exc:
            why = _reason(exc)
        if why is None:
            out.records.append(AlertRecord(i, record, raw.decode("utf-8", errors="replace")))
        else:
            out.bad += 1
            if out.first_bad is None:
                out.first_bad = (i, why)
    return out


def _reason(exc: BaseException) -> str:
    text = str(exc).split("\n")[0].strip()
    if "deeper" in text or "depth" in text or "recursion" in text.lower():
        return "nested too deeply"
    return (text[:77] + "...") if len(text) > 80 else (text or type(exc).__name__)
