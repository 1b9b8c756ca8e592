"""The value encoding spans share with ``et.log()``.

Uses :mod:`expr_tracker.history.codec` (``normalize_value`` / ``encode_row``) so a span
attribute or plugin result is written exactly as a logged value would be. A minimal local
fallback keeps ``expr_tracker.spans`` importable on its own (tests of this package, and a
tree where the history package is mid-change).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import orjson

log = logging.getLogger("expr_tracker.spans")

try:  # pragma: no branch - the real codec is the normal case
    from expr_tracker.history.codec import Warner, encode_row, normalize_value
except ImportError:  # pragma: no cover - fallback only used while history/ is absent

    class Warner:  # type: ignore[no-redef]
        """Logs each key's warning once."""

        def __init__(self, logger: logging.Logger | None = None) -> None:
            self._seen: set[Any] = set()
            self.logger = logger or log

        def warn(self, key: Any, message: str, *args: Any) -> bool:
            if key in self._seen:
                return False
            self._seen.add(key)
            self.logger.warning(message, *args)
            return True

    def normalize_value(value: Any, warner: Any = None, _depth: int = 0) -> Any:  # type: ignore[misc]
        t = type(value)
        if t in (float, int, str, bool, type(None)):
            return value
        if hasattr(value, "tolist"):
            return normalize_value(value.tolist(), warner, _depth + 1)
        if isinstance(value, dict):
            return {str(k): normalize_value(v, warner, _depth + 1) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [normalize_value(v, warner, _depth + 1) for v in value]
        return repr(value)

    def encode_row(row: dict[str, Any], nonfinite: bool | None = None) -> bytes:  # type: ignore[misc]
        try:
            if not nonfinite and not has_nonfinite(row):
                return orjson.dumps(row)
        except TypeError:
            pass
        return json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode()


def has_nonfinite(value: Any) -> bool:
    """True when ``value`` (a normalised scalar, list or dict) holds NaN or ±inf."""
    t = type(value)
    if t is float:
        return not math.isfinite(value)
    if t is list:
        return any(has_nonfinite(v) for v in value)
    if t is dict:
        return any(has_nonfinite(v) for v in value.values())
    return False


__all__ = ["Warner", "encode_row", "has_nonfinite", "normalize_value"]
