"""Warn-once counting (a leaf: imports nothing from expr_tracker).

One :class:`Warner` per owner (a run's store, the span recorder, a dispatcher, a module)
logs each distinct cause once and counts every occurrence, for ``et.info()``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

__all__ = ["Warner"]

log = logging.getLogger("expr_tracker")


class Warner:
    """Emits each distinct warning once (per key) and counts every occurrence.

    ``warn(key, message)`` logs ``message`` the first time ``key`` is seen; ``counts``
    maps each key to how often it happened. Thread-safe.
    """

    __slots__ = ("_seen", "counts", "_lock", "logger")

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._seen: set[Any] = set()
        self.counts: dict[Any, int] = {}
        self._lock = threading.Lock()
        self.logger = logger or log

    def warn(self, key: Any, message: str, *args: Any, level: int = logging.WARNING) -> bool:
        """Count ``key``; log ``message % args`` (at ``level``) the first time. Returns True
        when logged."""
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            if key in self._seen:
                return False
            self._seen.add(key)
        if level == logging.WARNING:
            self.logger.warning(message, *args)
        else:
            self.logger.log(level, message, *args)
        return True
