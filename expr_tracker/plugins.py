"""Span measurement plugins (public import path).

``from expr_tracker.plugins import CpuTime, GpuStats, TorchMemory``; see
:mod:`expr_tracker.spans.plugins` and docs/spans.md.
"""

from expr_tracker.spans.plugins import CpuTime, GpuStats, TorchMemory

__all__ = ["CpuTime", "GpuStats", "TorchMemory"]
