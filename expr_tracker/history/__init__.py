"""The history subsystem: one JSON line per step, cached, queryable while the run is live.

Public: :class:`HistoryStore`, :class:`JsonlWriter`, :func:`read_history`,
:func:`resolve_run_path`, :func:`list_streams`.

``expr_tracker.history`` is both this package and the query function ``et.history(...)``
(docs/history.md, "Querying history"): the module object is callable and forwards to
:func:`expr_tracker.history.live.history`, so ``et.history(50)``, ``import expr_tracker.history``
and ``from expr_tracker.history import read_history`` all work.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

from expr_tracker.history.paths import list_streams, resolve_run_path
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


class _HistoryModule(types.ModuleType):
    """This package, callable as ``et.history(n=50, ...)``."""

    _fn: Any = None  # expr_tracker.history.live.history, bound on the first call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = _HistoryModule._fn
        if fn is None:
            from expr_tracker.history.live import history as fn

            _HistoryModule._fn = fn
        return fn(*args, **kwargs)

    @property
    def __signature__(self) -> Any:  # help() and IDEs show et.history's own signature
        import inspect

        from expr_tracker.history.live import history

        return inspect.signature(history)


sys.modules[__name__].__class__ = _HistoryModule

__all__ = ["HistoryStore", "JsonlWriter", "list_streams", "read_history", "resolve_run_path"]
