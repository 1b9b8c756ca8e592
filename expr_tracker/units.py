"""Sizes and durations written with units, and the alert level table (a leaf: no Pydantic,
no project imports).

``parse_size("64MiB") -> 67108864`` (bytes) and ``parse_duration("500ms") -> 0.5``
(seconds). Numbers pass through: a number is bytes or seconds. SI prefixes are powers of
1000 (``KB``, ``MB``, ``GB``, ``TB``), IEC prefixes powers of 1024 (``KiB``, ``MiB``,
``GiB``, ``TiB``); unit names are case-insensitive, so ``64mib`` is 64 MiB.

``format_duration(90) -> "90s"`` writes a duration back the way the rule DSL reads it.
The Pydantic field types over these parsers (``Size``, ``Duration``, ``OptionalDuration``)
live in ``expr_tracker.spec.units``.

Levels: debug < info < warning < error < critical, aliases warn/err/fatal/crit, any case
(``normalize_level``, ``level_rank``); the spec and the alerts share this one table, and
``AlertLevel`` (public as ``et.AlertLevel``) is the enum over it.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DURATION_UNITS",
    "AlertLevel",
    "LEVELS",
    "LEVEL_ALIASES",
    "LEVEL_RANK",
    "SIZE_UNITS",
    "format_duration",
    "level_error",
    "level_rank",
    "normalize_level",
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


def _parse(value: Any, kind: str, units: Mapping[str, float], default: str, forms: str) -> float:
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


_DSL_UNITS = (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0))


def format_duration(seconds: float) -> str:
    """Canonical DSL text of a duration in seconds (``90 -> "90s"``, ``3600 -> "1h"``,
    ``2.5 -> "2500ms"``) that :func:`parse_duration` reads back as exactly ``seconds``
    (``255.069`` is ``"255.069s"``: ``255069ms`` would read back as ``255.06900000000002``).

    Raises:
        ValueError: a duration the DSL cannot spell (an exponent, NaN, an infinity).
    """
    for unit, size in _DSL_UNITS:
        q = seconds / size
        if q >= 1 and q == int(q) and int(q) * size == seconds:
            return f"{int(q)}{unit}"
    ms = seconds * 1000.0
    if ms == int(ms) and int(ms) * DURATION_UNITS["ms"] == seconds:
        return f"{int(ms)}ms"
    text = repr(float(seconds))
    if "e" in text or "inf" in text or "nan" in text:
        raise ValueError(f"duration {seconds!r} s has no DSL spelling")
    return f"{text}s"


# --- levels -------------------------------------------------------------------------------

#: Alert levels, least to most severe.
LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error", "critical")
#: Accepted aliases -> canonical level name.
LEVEL_ALIASES: dict[str, str] = {
    "warn": "warning",
    "err": "error",
    "fatal": "critical",
    "crit": "critical",
}
#: Canonical level name -> severity (debug 0 ... critical 4).
LEVEL_RANK: dict[str, int] = {name: i for i, name in enumerate(LEVELS)}


def normalize_level(value: Any) -> Any:
    """Canonical level name for a level or alias, case-insensitive (``"WARN"`` -> ``"warning"``).

    Values that are not strings are returned unchanged (validation then rejects them).
    """
    if isinstance(value, str):
        key = value.strip().lower()
        return LEVEL_ALIASES.get(key, key)
    return value


def level_error(name: Any) -> str:
    """The message for ``name`` that is not a level or alias."""
    valid = ", ".join(LEVELS) + " (aliases " + ", ".join(LEVEL_ALIASES) + ")"
    return f"{name!r} is not an alert level: expected one of {valid}"


def level_rank(name: str) -> int:
    """Severity of a level or alias: debug 0, info 1, warning 2, error 3, critical 4.

    Raises:
        ValueError: for a name that is not a level or alias.
    """
    key = normalize_level(name)
    try:
        return LEVEL_RANK[key]
    except (KeyError, TypeError):
        raise ValueError(level_error(name)) from None


class AlertLevel(str, enum.Enum):
    """An alert level, ordered by severity: DEBUG < INFO < WARNING < ERROR < CRITICAL.

    Members are strings equal to their canonical name (``AlertLevel.ERROR == "error"``), so
    one is accepted wherever a level string is (``et.alert(level=et.AlertLevel.ERROR)``, a
    rule's ``level``, a channel's ``min_level``) and is written as that name in files.
    ``WARN``, ``ERR``, ``FATAL`` and ``CRIT`` are aliases of ``WARNING``, ``ERROR``,
    ``CRITICAL`` (the same members). ``AlertLevel("WARN")`` and ``AlertLevel.parse(...)``
    accept a member, a level name or an alias in any case.

    ``<``, ``<=``, ``>``, ``>=`` compare by severity, against a member or a level string
    (``AlertLevel.CRITICAL > "warn"``, ``rule.level >= AlertLevel.ERROR``); a string that is
    no level raises ``ValueError``. ``==`` is string equality with the canonical name
    (``AlertLevel.WARNING == "warning"``; compare parsed values to match aliases).
    """

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"
    # aliases (the same members), as LEVEL_ALIASES; wandb users write AlertLevel.WARN
    WARN = "warning"
    ERR = "error"
    FATAL = "critical"
    CRIT = "critical"

    @classmethod
    def _missing_(cls, value: object) -> AlertLevel:
        key = normalize_level(value)
        if isinstance(key, str) and key in LEVEL_RANK:
            return cls(key)
        raise ValueError(level_error(value))

    @classmethod
    def parse(cls, value: Any) -> AlertLevel:
        """The member for ``value``: a member, a level name or alias in any case
        (``"WARN"`` -> ``AlertLevel.WARNING``).

        Raises:
            ValueError: naming the value and the valid levels and aliases.
        """
        if isinstance(value, cls):
            return value
        key = normalize_level(value)
        if not isinstance(key, str) or key not in LEVEL_RANK:
            raise ValueError(level_error(value))
        return cls(key)

    @property
    def rank(self) -> int:
        """Severity: debug 0, info 1, warning 2, error 3, critical 4."""
        return LEVEL_RANK[self.value]

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def _other_rank(self, other: Any) -> int | None:
        if isinstance(other, AlertLevel):
            return other.rank
        if isinstance(other, str):
            return level_rank(other)  # ValueError for a string that is no level
        return None

    def __lt__(self, other: Any) -> bool:
        rank = self._other_rank(other)
        return NotImplemented if rank is None else self.rank < rank

    def __le__(self, other: Any) -> bool:
        rank = self._other_rank(other)
        return NotImplemented if rank is None else self.rank <= rank

    def __gt__(self, other: Any) -> bool:
        rank = self._other_rank(other)
        return NotImplemented if rank is None else self.rank > rank

    def __ge__(self, other: Any) -> bool:
        rank = self._other_rank(other)
        return NotImplemented if rank is None else self.rank >= rank

    __hash__ = str.__hash__
