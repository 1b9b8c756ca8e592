"""The history subsystem: one JSON line per step, cached, queryable while the run is live.

Public: :class:`HistoryStore`, :class:`JsonlWriter`, :func:`read_history`,
:func:`resolve_run_path`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from expr_tracker.history.paths import resolve_run_path
from expr_tracker.history.store import HistoryStore
from expr_tracker.history.writer import JsonlWriter


def read_history(
    run: str | Path,
    n: int | None = None,
    *,
    stream: str | None = None,
    **kwargs: Any,
) -> Any:
    """Read a run directory or metrics file offline (no ``et.init``); all steps by default.

    Takes the keyword arguments of :func:`expr_tracker.history` (``output_type``,
    ``metrics``, ``step_range``, ``include_meta``, ``fill_missing``, ``dropna``).
    """
    from expr_tracker.history.query import query_history

    return query_history(Path(run), n=n, stream=stream, **kwargs)


__all__ = ["HistoryStore", "JsonlWriter", "read_history", "resolve_run_path"]
