"""Exceptions shared across the packages of expr_tracker."""

from __future__ import annotations


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
