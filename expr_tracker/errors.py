"""Exceptions shared across the packages of expr_tracker."""

from __future__ import annotations

from typing import Any


class ExprTrackerError(Exception):
    """Base class of every error expr_tracker raises on purpose."""


class NoActiveRunError(ExprTrackerError, RuntimeError):
    """A call needed an active run (``et.init()`` was not called, or the run finished)."""


class RunAlreadyActiveError(ExprTrackerError, RuntimeError):
    """``et.init()`` was called while a run is active; call ``et.finish()`` first."""


class ForkedRunError(ExprTrackerError, RuntimeError):
    """A forked child touched a run object it inherited from its parent.

    Raised before any lock is taken, so it can never deadlock on a lock held by a
    parent thread at fork time. Start a new run (or a new stream) in the child.
    """


class RunLockedError(ExprTrackerError, RuntimeError):
    """Another live process is writing the same producer file (stream and rank)."""


class ConfigChangeError(ExprTrackerError, ValueError):
    """A config key was changed to a different value without ``allow_val_change=True``
    (``et.config.update(..., allow_val_change=True)`` or ``et.init(allow_val_change=True)``)."""


class QueryError(ExprTrackerError, ValueError):
    """``et.query`` / ``et query`` could not run the SQL (DuckDB rejected or failed it).

    ``str()`` is DuckDB's message followed by the views and their columns. Attributes:
    ``message`` (DuckDB's message), ``sql`` (the statement), ``views`` (view name ->
    list of (column, DuckDB type)).
    """

    def __init__(self, message: str, sql: str = "", views: dict[str, Any] | None = None) -> None:
        self.message = message
        self.sql = sql
        self.views = dict(views or {})
        super().__init__(format_query_error(message, self.views))


def format_query_error(
    message: str, views: dict[str, Any], *, max_columns: int | None = None
) -> str:
    """DuckDB's ``message``, then one line per view: ``name(col TYPE, ...)``; with
    ``max_columns`` a longer list is cut, saying how many more there are."""
    lines = [message.rstrip(), "", 'views (column TYPE; quote dotted names: "config.lr"):']
    for name, cols in views.items():
        shown = list(cols) if max_columns is None else list(cols)[:max_columns]
        text = ", ".join(f"{c} {t}" for c, t in shown)
        more = len(cols) - len(shown)
        if more:
            text += f", ... {more} more (et query --schema)"
        lines.append(f"  {name}({text})")
    return "\n".join(lines)
