"""What a dashboard request fails with, and why a run file could not be read.

:class:`NotFound` (HTTP 404), :class:`BadRequest` (400) and :class:`Unreadable` (422) are
raised by the pages (``ui/runs.py``, ``ui/series.py``, ``ui/spans.py``, ``ui/compare.py``,
``ui/runpage.py``) and turned into answers by ``ui/server.py``; :func:`why` is the short
reason, without traceback or path, that a table line or an answer names.
"""

from __future__ import annotations

from expr_tracker.history.untrusted import UnsafeFileError

__all__ = ["BadRequest", "NotFound", "Unreadable", "why"]


class NotFound(LookupError):
    """A run, metric or file the request names does not exist (HTTP 404)."""


class BadRequest(ValueError):
    """A malformed query parameter (HTTP 400)."""


class Unreadable(Exception):
    """A run file the request needs cannot be read: permissions, not a regular file, outside
    the served folder, damaged (HTTP 422); ``str()`` names the file and why."""


def why(exc: BaseException) -> str:
    """A short reason for a file that could not be read (no traceback, no path)."""
    if isinstance(exc, UnsafeFileError):
        return exc.reason
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, ValueError):
        return f"not valid JSON ({exc})"[:200]
    return f"{type(exc).__name__}: {exc}"[:200]
