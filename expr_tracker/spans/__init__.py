"""Spans: timing the parts of a step (see docs/spans.md).

``span`` / ``start_span`` open spans; the run installs a :class:`SpanRecorder` with
:func:`set_active_recorder`. Importing this package imports neither torch nor pynvml;
the plugin classes (``CpuTime``, ``GpuStats``, ``TorchMemory``) load on first use
(docs/architecture.md "Cold start").
"""

from typing import TYPE_CHECKING, Any

from expr_tracker.spans.core import (
    Span,
    current_span,
    get_active_recorder,
    set_active_recorder,
    span,
    start_span,
)
from expr_tracker.spans.recorder import SpanRecorder

if TYPE_CHECKING:
    from expr_tracker.spans.plugins import CpuTime, GpuStats, TorchMemory

__all__ = [
    "CpuTime",
    "GpuStats",
    "Span",
    "SpanRecorder",
    "TorchMemory",
    "current_span",
    "get_active_recorder",
    "set_active_recorder",
    "span",
    "start_span",
]


def __getattr__(name: str) -> Any:  # PEP 562: the plugin classes on first use
    if name in ("CpuTime", "GpuStats", "TorchMemory"):
        from expr_tracker.spans import plugins

        value = getattr(plugins, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
