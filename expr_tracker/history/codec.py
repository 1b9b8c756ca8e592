"""Values -> JSON-able data, rows -> one JSON line, and back.

Encoding rules (docs/logging.md "What a row holds", docs/architecture.md "The hot path"):

- ``float``/``int``/``str``/``bool``/``None`` pass through untouched (the fast path);
- NumPy scalars and arrays, torch tensors (0-d -> number, else nested lists), ``datetime``
  / ``date`` (ISO 8601), ``Path`` (str), ``Enum`` (its value), pydantic models
  (``model_dump(mode="json")``), dataclasses, mappings, sequences and sets (sorted when
  sortable) are converted recursively;
- anything else becomes ``repr(value)``, with one warning per type (:class:`Warner`).

Rows are encoded with orjson when every float is finite (~0.7 µs for a small row) and with
the standard ``json`` module otherwise, which writes ``NaN`` / ``Infinity`` / ``-Infinity``
the way Python reads them back. Lines are decoded with orjson, falling back to ``json``
per line for those tokens.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import json
import logging
import math
import re
import reprlib
import sys
from pathlib import PurePath
from typing import Any, TypeGuard

import orjson

from expr_tracker._warn import Warner

log = logging.getLogger("expr_tracker")

#: types written as they are, checked before anything else on the hot path
SCALAR_TYPES = (float, int, str, bool, type(None))
_SCALARS = frozenset(SCALAR_TYPES)

_orjson_dumps = orjson.dumps
_orjson_loads = orjson.loads
_json_dumps = json.dumps
_JSONDecodeError = orjson.JSONDecodeError


#: module-level warner for conversions that happen without a run (trace, config helpers)
DEFAULT_WARNER = Warner()


def is_finite_number(v: Any) -> bool:
    """True for ints and finite floats (bools excluded)."""
    t = type(v)
    if t is int:
        return True
    if t is float:
        return math.isfinite(v)
    return False


#: the last step there is: a step is an int in [0, MAX_STEP] (int64 in the file, the row
#: cache and the query cache; docs/logging.md "The commit table")
MAX_STEP = (1 << 63) - 1


def is_step(v: Any) -> TypeGuard[int]:
    """True for a ``_step`` as the writer writes one: an ``int`` (not a bool) in
    [0, :data:`MAX_STEP`]. A line of a file whose ``_step`` is anything else (a float, a
    string, -7, 2**64) is not a row to any reader (docs/logging.md "The commit table")."""
    return type(v) is int and 0 <= v <= MAX_STEP


#: the largest int a float can hold (an int beyond it cannot be written as a number that
#: readers other than Python take: it is dropped, see ``fix_int``)
FLOAT_MAX_INT = int(sys.float_info.max)
#: containers nested deeper than this are written as a bounded repr
MAX_DEPTH = 32

_short_repr = reprlib.Repr()
_short_repr.maxlevel = 3
_short_repr.maxstring = _short_repr.maxother = 80


def _name_of(t: Any) -> str:
    """``module.qualname`` of a class, even one without ``__module__`` or ``__qualname__``."""
    mod = getattr(t, "__module__", None)
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or "?"
    if type(mod) is not str or not mod:
        return str(name)
    return f"{mod}.{name}"


def safe_repr(value: Any, warner: Warner | None = None, *, short: bool = False) -> str:
    """``repr(value)`` (``short``: bounded in depth and length); a ``repr`` that raises
    (a hostile ``__repr__``, RecursionError) gives ``<TYPE object (repr() failed)>`` with
    one warning per type. Never raises."""
    try:
        return _short_repr.repr(value) if short else repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__
        name = _name_of(type(value))
        (warner or DEFAULT_WARNER).warn(
            ("repr_failed", name),
            "expr_tracker: repr() of a %s value raised; written as a placeholder "
            "(warned once per type)",
            name,
        )
        return f"<{name} object (repr() failed)>"


def fix_int(value: int, warner: Warner | None = None) -> Any:
    """An int a float can hold passes; a larger one becomes None with one warning."""
    if -FLOAT_MAX_INT <= value <= FLOAT_MAX_INT:
        return value
    (warner or DEFAULT_WARNER).warn(
        ("int_too_large",),
        "expr_tracker: an int too large for a float (%d bits) cannot be written as a number; "
        "dropped (warned once, counted in et.info())",
        value.bit_length(),
    )
    return None


def normalize_value(value: Any, warner: Warner | None = None, _depth: int = 0) -> Any:
    """Convert ``value`` into data ``json`` can write; see the module docstring.

    Never raises: an unsupported value becomes ``repr(value)`` with one warning per type; a
    value whose conversion or ``repr`` raises becomes a placeholder string, a container
    nested deeper than ``MAX_DEPTH`` its bounded repr, an int too large for a float None
    (each with one warning per cause).
    """
    t = type(value)
    if t in _SCALARS:
        if t is int and not -FLOAT_MAX_INT <= value <= FLOAT_MAX_INT:
            return fix_int(value, warner)
        return value
    try:
        return _normalize(value, t, warner, _depth)
    except Exception as exc:  # noqa: BLE001 - RecursionError, a raising property ...
        name = _name_of(t)
        (warner or DEFAULT_WARNER).warn(
            ("unencodable", name),
            "expr_tracker: a %s value could not be converted (%s); written as a placeholder "
            "(warned once per type)",
            name,
            type(exc).__name__,
        )
        return f"<unencodable {name}>"


def _normalize(value: Any, t: type, warner: Warner | None, _depth: int) -> Any:
    if _depth > MAX_DEPTH:
        (warner or DEFAULT_WARNER).warn(
            ("too_deep",),
            "expr_tracker: a value nested deeper than %d levels was written as a shortened "
            "repr() (warned once)",
            MAX_DEPTH,
        )
        return safe_repr(value, warner, short=True)
    d = _depth + 1
    # numpy / torch without importing either
    mod = getattr(t, "__module__", None)
    if type(mod) is not str:  # a class built without a module
        mod = ""
    if isinstance(value, type):  # a class (np.float32, torch.nn.Linear ...): its name
        return _name_of(value)
    if mod == "numpy" or mod.startswith("numpy."):
        if t.__name__.endswith("DType") or t.__name__ == "dtype":
            return str(value)  # np.dtype("float32") -> "float32"
        if hasattr(value, "tolist"):
            return normalize_value(value.tolist(), warner, d)
        if hasattr(value, "item"):
            return normalize_value(value.item(), warner, d)
    if mod.startswith("torch"):
        if hasattr(value, "detach") and hasattr(value, "dim"):
            try:
                v = value.detach()
                if v.dim() == 0:
                    return normalize_value(v.item(), warner, d)
                return normalize_value(v.cpu().tolist(), warner, d)
            except Exception:  # noqa: BLE001 - fall back to repr below
                pass
        elif t.__name__ in ("dtype", "device", "Size"):
            return str(value) if t.__name__ != "Size" else list(value)
    if mod.startswith("omegaconf"):
        try:
            from omegaconf import OmegaConf

            try:
                return normalize_value(OmegaConf.to_container(value, resolve=True), warner, d)
            except Exception:  # noqa: BLE001 - an unresolvable interpolation stays literal
                return normalize_value(OmegaConf.to_container(value, resolve=False), warner, d)
        except Exception:  # noqa: BLE001
            pass
    if isinstance(value, bool):  # numpy.bool_ handled above; subclasses of bool here
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict) or (hasattr(value, "keys") and hasattr(value, "__getitem__")):
        try:
            return {str(k): normalize_value(value[k], warner, d) for k in value.keys()}
        except Exception:  # noqa: BLE001
            pass
    if isinstance(value, (list, tuple)):
        return [normalize_value(v, warner, d) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [normalize_value(v, warner, d) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    if isinstance(value, enum.Enum):
        return normalize_value(value.value, warner, d)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            (warner or DEFAULT_WARNER).warn(
                ("bytes",),
                "expr_tracker: bytes that are not UTF-8 are written as their repr() (warned once)",
            )
            return repr(bytes(value))
    if hasattr(value, "model_dump") and callable(value.model_dump):
        try:
            return normalize_value(value.model_dump(mode="json"), warner, d)
        except Exception:  # noqa: BLE001
            pass
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: normalize_value(getattr(value, f.name), warner, d)
            for f in dataclasses.fields(value)
        }
    if hasattr(value, "tolist") and hasattr(value, "shape"):  # array-likes (jax, cupy ...)
        try:
            return normalize_value(value.tolist(), warner, d)
        except Exception:  # noqa: BLE001
            pass
    w = warner or DEFAULT_WARNER
    name = _name_of(t)
    w.warn(
        ("repr", getattr(t, "__qualname__", name)),
        "expr_tracker: cannot encode a value of type %s; writing repr() instead "
        "(warned once per type)",
        name,
    )
    return safe_repr(value, w)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _fix_str(value: str, warner: Warner | None) -> str:
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        (warner or DEFAULT_WARNER).warn(
            ("lone_surrogate",),
            "expr_tracker: a string holding a lone surrogate (not valid Unicode text) was "
            "written with U+FFFD in its place (warned once)",
        )
        return _SURROGATE.sub("\ufffd", value)


def _sanitize(value: Any, warner: Warner | None, depth: int = 0) -> Any:
    """A normalised value with what JSON cannot hold fixed (the slow path of a row)."""
    t = type(value)
    if t is str:
        return _fix_str(value, warner)
    if t is int:
        return fix_int(value, warner)
    if t is list:
        return [_sanitize(v, warner, depth + 1) for v in value]
    if t is dict:
        return {_fix_str(str(k), warner): _sanitize(v, warner, depth + 1) for k, v in value.items()}
    if t in _SCALARS:
        return value
    return _sanitize(normalize_value(value, warner, depth), warner, depth + 1)


def sanitize_row(row: dict[str, Any], warner: Warner | None = None) -> int:
    """Fix, in place, the values of ``row`` that JSON cannot hold (lone surrogates in keys
    or strings, ints too large for a float, anything not normalised), one warning per cause;
    a metric that still cannot be encoded is removed. Returns the number removed.

    The slow path of :func:`encode_row` (called once it raised); never raises.
    """
    dropped = 0
    for k in list(row):
        v = row.pop(k)
        try:
            key = _fix_str(k, warner) if type(k) is str else str(k)
            v = _sanitize(v, warner)
            encode_row({key: v})
        except Exception:  # noqa: BLE001 - whatever is left: drop this metric only
            (warner or DEFAULT_WARNER).warn(
                ("unencodable_metric",),
                "expr_tracker: a metric value that cannot be encoded as JSON was dropped "
                "(warned once, counted in et.info())",
            )
            dropped += 1
            continue
        row[key] = v
    return dropped


def has_nonfinite(value: Any) -> bool:
    """True when ``value`` (a normalised scalar, list or dict) holds NaN or ±inf."""
    t = type(value)
    if t is float:
        return value - value != 0.0  # type: ignore[no-any-return]  # value is a float
    if t is list:
        return any(has_nonfinite(v) for v in value)
    if t is dict:
        return any(has_nonfinite(v) for v in value.values())
    return False


#: the value types a row can hold as they are (no conversion): the store's one-call path
#: (``HistoryStore.ingest``) takes a row whose values are all of these types, encodes it
#: with :data:`encode_plain` and keeps the line unless it holds ``null`` (a NaN or ±inf,
#: which orjson writes as null, or a None: both go through :func:`encode_row` instead)
PLAIN_TYPES = frozenset({float, int, str, bool, type(None)})
#: orjson's ``dumps``: raises ``TypeError`` (an ``orjson.JSONEncodeError``) for a key that is
#: not exactly ``str`` and for an int beyond 64 bits, so such rows take the general path
encode_plain = _orjson_dumps


def encode_row(row: dict[str, Any], nonfinite: bool | None = None) -> bytes:
    """Encode one normalised row as JSON bytes (no trailing newline).

    ``nonfinite`` says whether the row holds NaN/±inf somewhere (None: scan it). Such rows,
    and rows orjson cannot write (ints beyond 64 bits), go through the standard module.
    """
    if nonfinite is None:
        nonfinite = any(has_nonfinite(v) for v in row.values())
    if not nonfinite:
        try:
            return _orjson_dumps(row)
        except (TypeError, orjson.JSONEncodeError):
            pass
    return _json_dumps(row, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


#: the deepest nesting a decoded line may hold: our writers write at most ``MAX_DEPTH``
#: levels (deeper values become a bounded repr), so a deeper line came from elsewhere; the
#: printers and encoders that handle a row recurse once per level, so such a line is refused
#: here, as one bad line (docs/history.md "Where the answer comes from")
MAX_LINE_DEPTH = 128
_DEEP_LEN = 2 * MAX_LINE_DEPTH
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _too_deep(value: Any, limit: int) -> bool:
    """True when ``value`` nests containers more than ``limit`` levels (no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        if type(v) is dict:
            stack.extend((x, depth + 1) for x in v.values() if type(x) in (dict, list))
        elif type(v) is list:
            stack.extend((x, depth + 1) for x in v if type(x) in (dict, list))
    return False


def _brackets(line: str | bytes | bytearray | memoryview) -> int:
    """How many ``[`` and ``{`` ``line`` holds (a bound on its nesting depth)."""
    if isinstance(line, str):
        return line.count("[") + line.count("{")
    if not isinstance(line, (bytes, bytearray)):
        line = bytes(line)
    return line.count(b"[") + line.count(b"{")


def decode_line(line: bytes | str) -> Any:
    """Decode one JSON line; ``NaN``/``Infinity`` tokens are accepted.

    Raises ``ValueError`` when the line is not JSON, and for a line that is JSON but that no
    reader should hand on: nested deeper than :data:`MAX_LINE_DEPTH` (20,000 brackets
    included: never a ``RecursionError``) or holding a lone surrogate escape (``"\\ud800"``,
    which no terminal or UTF-8 file can take). Never raises anything else.
    """
    try:
        value = _orjson_loads(line)
    except _JSONDecodeError:
        value = _decode_fallback(line)
    # nesting N levels takes 2N brackets: a short line (most rows) cannot be too deep
    if len(line) > _DEEP_LEN and _brackets(line) > MAX_LINE_DEPTH:
        if _too_deep(value, MAX_LINE_DEPTH):
            raise ValueError(f"nested deeper than {MAX_LINE_DEPTH} levels")
    return value


def _decode_fallback(line: Any) -> Any:
    """The standard module's decoding (``NaN``/``Infinity`` tokens, numbers orjson refuses),
    made safe: ``RecursionError`` and lone surrogate escapes become ``ValueError``."""
    if isinstance(line, (bytes, bytearray, memoryview)):
        line = bytes(line).decode("utf-8", errors="replace")
    try:
        value = json.loads(line)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if _SURROGATE_ESCAPE.search(line):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except (UnicodeEncodeError, RecursionError):
            raise ValueError("holds a lone surrogate escape") from None
    return value


def dumps_pretty(data: Any) -> str:
    """JSON text for the small sidecar files (``run.json``, ``summary.json`` ...)."""
    return json.dumps(data, indent=2, ensure_ascii=False, sort_keys=False, default=repr) + "\n"
