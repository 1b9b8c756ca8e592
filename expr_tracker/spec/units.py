"""Pydantic field types for sizes and durations written with units, over the parsers of
``expr_tracker.units`` (re-exported here for the spec's callers).

``Size``, ``Duration`` and ``OptionalDuration`` accept a number or a string with a unit
(``"64MiB"``, ``"500ms"``); their JSON Schema says so.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, WithJsonSchema

from expr_tracker.units import DURATION_UNITS, SIZE_UNITS, parse_duration, parse_size

__all__ = [
    "DURATION_UNITS",
    "SIZE_UNITS",
    "Duration",
    "OptionalDuration",
    "Size",
    "parse_duration",
    "parse_size",
]


def _optional_duration(value: Any) -> float | None:
    return None if value is None else parse_duration(value)


_SIZE_SCHEMA = {
    "anyOf": [
        {"type": "integer", "minimum": 0},
        {"type": "string", "pattern": r"^\s*\d+(\.\d*)?\s*(([KkMmGgTt][Ii]?)?[Bb])?\s*$"},
    ],
    "description": "bytes, or a size with a unit: 500KB, 64MiB, 1.5GB",
}
_DURATION_SCHEMA = {
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": r"^\s*\d+(\.\d*)?\s*(ns|us|µs|ms|s|m|h|d)?\s*$"},
    ],
    "description": "seconds, or a duration with a unit: 250us, 500ms, 30s, 5m, 2h, 1d",
}
_OPTIONAL_DURATION_SCHEMA = {
    "anyOf": [*_DURATION_SCHEMA["anyOf"], {"type": "null"}],
    "description": "seconds, a duration with a unit (500ms, 30s, 5m), or null to disable",
}

#: Bytes; accepts a number or a string with a unit ("64MiB").
Size = Annotated[int, BeforeValidator(parse_size), WithJsonSchema(_SIZE_SCHEMA)]
#: Seconds; accepts a number or a string with a unit ("500ms").
Duration = Annotated[float, BeforeValidator(parse_duration), WithJsonSchema(_DURATION_SCHEMA)]
#: Seconds, or None (disabled).
OptionalDuration = Annotated[
    float | None, BeforeValidator(_optional_duration), WithJsonSchema(_OPTIONAL_DURATION_SCHEMA)
]
