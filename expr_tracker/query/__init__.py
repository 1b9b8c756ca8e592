"""SQL across runs: DuckDB views over the run directories, a per-run columnar cache, export.

Reads files only, through :mod:`expr_tracker.history`'s readers; never imports the write
path. Needs the ``[query]`` extra (``duckdb``, ``pyarrow``).

``expr_tracker.query`` is both this package and the function ``et.query(sql, dir=...)``
(:func:`expr_tracker.query.api.query`): the module object is callable, as
``et.history`` is, so ``from expr_tracker.query.views import connect`` keeps working. Nothing
heavy is imported here.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _QueryModule(types.ModuleType):
    """This package, callable as ``et.query(sql, dir="runs", ...)``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from expr_tracker.query.api import query

        return query(*args, **kwargs)

    @property
    def __signature__(self) -> Any:  # help() and IDEs show et.query's own signature
        import inspect

        from expr_tracker.query.api import query

        return inspect.signature(query)


sys.modules[__name__].__class__ = _QueryModule
