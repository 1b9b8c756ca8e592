"""Sizes and durations written with units, for the run spec.

``parse_size("64MiB") -> 67108864`` (bytes) and ``parse_duration("500ms") -> 0.5``
(seconds). Numbers pass through: a number is bytes or seconds. SI prefixes are powers of
1000 (``KB``, ``MB``, ``GB``, ``TB``), IEC prefixes powers of 1024 (``KiB``, ``MiB``,
``GiB``, ``TiB``); unit names are case-insensitive, so ``64mib`` is 64 MiB.

``Size``, ``Duration`` and ``OptionalDuration`` are the Pydantic field types built on these;
their JSON Schema accepts a number or a string with a unit.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, WithJsonSchema

__all__ = [
    "DURATION_UNITS",
    "SIZE_UNITS",
    "Duration",
    "OptionalDuration",
    "Size",
    "parse_duration",
    "parse_size",
]

#: Unit name (lower case) -> bytes.
SIZE_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}

#: Unit name (lower case) -> seconds.
DURATION_UNITS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}

_NUMBER_UNIT = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-zµ]*)\s*$")

_SIZE_FORMS = "a number of bytes or a string such as '500KB', '64MiB', '1.5GB' (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
_DURATION_FORMS = (
    "a number of seconds or a string such as '250us', '500ms', '30s', '5m', '2h', '1d'"
)


def _split(value: str) -> tuple[float, str] | None:
    match = _NUMBER_UNIT.match(value)
    if match is None:
        return None
    return float(match.group(1)), match.group(2).lower()


def _parse(value: Any, kind: str, units: dict[str, float], default: str, forms: str) -> float:
    """``value`` (a number in ``default`` units, or ``"<number><unit>"``) times its unit."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{value!r} is not a {kind}: expected {forms}")
    if isinstance(value, str):
        parts = _split(value)
        if parts is None or (parts[1] or default) not in units:
            raise ValueError(f"{value!r} is not a {kind}: expected {forms}")
        number, unit = parts[0], parts[1] or default
    else:
        number, unit = float(value), default
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{value!r} is not a {kind}: it must be finite and >= 0")
    return number * units[unit]


def parse_size(value: Any) -> int:
    """Return a size in bytes (an ``int >= 0``).

    Accepts an int or float (bytes; a fraction is rounded to the nearest byte) or a
    string such as ``"64MiB"``, ``"1GiB"``, ``"500KB"``, ``"1.5GB"``, ``"100B"`` or ``"4096"``.

    Raises:
        ValueError: naming the value and the valid forms, for anything else, a negative
            size, or a value that is not finite.
    """
    size = _parse(value, "size", SIZE_UNITS, "b", _SIZE_FORMS)
    return value if type(value) is int else int(round(size))


def parse_duration(value: Any) -> float:
    """Return a duration in seconds (a ``float >= 0``).

    Accepts an int or float (seconds) or a string such as ``"250us"``, ``"500ms"``,
    ``"30s"``, ``"5m"``, ``"2h"``, ``"1d"`` or ``"1.5"`` (seconds). ``ns`` and ``µs`` work too.

    Raises:
        ValueError: naming the value and the valid forms, for anything else, a negative
            duration, or a value that is not finite.
    """
    return _parse(value, "duration", DURATION_UNITS, "s", _DURATION_FORMS)


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
