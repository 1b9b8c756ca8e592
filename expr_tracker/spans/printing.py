"""The lines a span prints when it has a ``print_fn``.

::

    -> step  16:41:38
      -> forward  16:41:38
      <- forward  16:41:38  5.481ms  cpu_time_ms=5.312 cpu_percent=96.9
    <- step  16:41:38  9.641ms  !ValueError

Two spaces per level, relative to the span that started printing (spaces, not tabs, so the
tree survives a log prefix). Times are local wall-clock ``HH:MM:SS``; durations in ms with
three decimals; the span's plugin measurements follow as ``key=value`` (numbers with at most
three decimals); a failed span ends with ``!`` and the exception type name.
"""

from __future__ import annotations

import time
from typing import Any

_localtime = time.localtime
_strftime = time.strftime


def _hms(wall: float) -> str:
    return _strftime("%H:%M:%S", _localtime(wall))


def _number(value: Any) -> str:
    """A measurement as printed: floats with at most three decimals (``41.4``, ``0.125``)."""
    if type(value) is float:
        text = f"{value:.3f}".rstrip("0").rstrip(".")
        return text if text not in ("", "-0") else "0"
    return str(value)


def enter_line(span: Any, wall: float) -> str:
    """``-> name  HH:MM:SS``, indented by the span's print depth."""
    return f"{'  ' * span._pdepth}-> {span.name}  {_hms(wall)}"


def exit_line(span: Any, wall: float) -> str:
    """``<- name  HH:MM:SS  3.074ms`` (plus ``  key=value`` for each plugin measurement and
    ``  !ErrorType`` for a failed span)."""
    line = f"{'  ' * span._pdepth}<- {span.name}  {_hms(wall)}  {span.duration_ms:.3f}ms"
    pm = span._pm
    if pm:
        line += "  " + " ".join(f"{k}={_number(v)}" for k, v in pm.items())
    if span.error:
        line += f"  !{span.error}"
    return line
