"""Spans: timing the parts of a step (see docs/spans.md).

``span`` / ``start_span`` open spans; the run installs a :class:`SpanRecorder` with
:func:`set_active_recorder`. Importing this package imports neither torch nor pynvml.
"""

from expr_tracker.spans.core import (
    Span,
    current_span,
    get_active_recorder,
    set_active_recorder,
    span,
    start_span,
)
from expr_tracker.spans.plugins import CpuTime, GpuStats, TorchMemory
from expr_tracker.spans.recorder import SpanRecorder

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
