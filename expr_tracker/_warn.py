"""Warn-once counting (a leaf: imports nothing from expr_tracker).

One :class:`Warner` per owner (a run's store, the span recorder, a dispatcher, a module)
logs each distinct cause once and counts every occurrence, for ``et.info()``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

__all__ = ["Warner", "warning_label"]

log = logging.getLogger("expr_tracker")


class Warner:
    """Emits each distinct warning once (per key) and counts every occurrence.

    ``warn(key, message)`` logs ``message`` the first time ``key`` is seen; ``counts``
    maps each key's label to how often it happened (what ``et.info()["warnings"]``
    shows): a tuple key ``("repr", "BadRepr")`` is counted as ``"repr: BadRepr"``, any
    other key as ``str(key)``. Thread-safe.
    """

    __slots__ = ("_seen", "counts", "_lock", "logger")

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._seen: dict[Any, str] = {}  # key -> its label
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.logger = logger or log

    def warn(self, key: Any, message: str, *args: Any, level: int = logging.WARNING) -> bool:
        """Count ``key``; log ``message % args`` (at ``level``) the first time. Returns True
        when logged."""
        with self._lock:
            label = self._seen.get(key)
            if label is not None:
                self.counts[label] += 1
                return False
            label = self._seen[key] = warning_label(key)
            self.counts[label] = self.counts.get(label, 0) + 1
        if level == logging.WARNING:
            self.logger.warning(message, *args)
        else:
            self.logger.log(level, message, *args)
        return True


def warning_label(key: Any) -> str:
    """The readable name of a warning key: ``("drop", "disk")`` -> ``"drop: disk"``."""
    if type(key) is tuple:
        return ": ".join(map(str, key))
    return str(key)
