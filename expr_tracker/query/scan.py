"""Decoding blocks of JSONL lines into Arrow tables (the parts of the query cache).

Metrics (LONG: one row per (line, metric))::

    step BIGINT, time DOUBLE, metric VARCHAR, value DOUBLE, text VARCHAR, line BIGINT

- keys starting with ``_`` (``_step``, ``_time`` ...) are not metrics; a line holding only
  those (a ``log({})`` commit) gives no row;
- ``float`` -> ``value`` (NaN and ±inf kept bit-for-bit as IEEE doubles), ``text`` NULL;
- ``int`` -> ``value`` as a double, ``text`` NULL — except an int a double cannot hold
  exactly (beyond 2**53): ``value`` is the nearest double and ``text`` the exact decimal
  digits, so nothing is lost;
- ``bool`` -> 1.0 / 0.0; ``str`` -> ``text`` (``value`` NULL); ``None``, lists and dicts ->
  ``text`` holding compact JSON (``null``, ``[1,2]``; NaN inside written as ``NaN``),
  ``value`` NULL;
- ``step`` is ``_step`` (NULL when absent or not an int64), ``time`` is ``_time`` (NULL when
  absent); ``line`` the 0-based line number in the source.

Spans: ``step, name, depth, start, dur_ms, id, parent, pid, tid, thread, task, error, args,
metrics, line`` (``args``/``metrics`` compact JSON or NULL; a field of the wrong type reads
NULL, a non-string ``error`` its compact JSON).

An int beyond 64 bits (which orjson reads as a float) is read exactly: a block holding a run
of 20 digits decodes those lines with ``json``.

A line that is not JSON or not an object gives no row (it keeps its line number). Lines are
decoded with orjson, falling back to the standard ``json`` module for a line holding
``NaN`` / ``Infinity`` tokens (:func:`expr_tracker.history.codec.decode_line`).
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from expr_tracker.history.codec import decode_line

__all__ = [
    "METRICS_FIELDS",
    "SPANS_FIELDS",
    "decode_metrics",
    "decode_spans",
    "schema",
]

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_EXACT = 2**53

METRICS_FIELDS = (
    ("step", "int64"),
    ("time", "float64"),
    ("metric", "string"),
    ("value", "float64"),
    ("text", "string"),
    ("line", "int64"),
)
SPANS_FIELDS = (
    ("step", "int64"),
    ("name", "string"),
    ("depth", "int32"),
    ("start", "float64"),
    ("dur_ms", "float64"),
    ("id", "int64"),
    ("parent", "int64"),
    ("pid", "int64"),
    ("tid", "int64"),
    ("thread", "string"),
    ("task", "string"),
    ("error", "string"),
    ("args", "string"),
    ("metrics", "string"),
    ("line", "int64"),
)


def schema(kind: str) -> Any:
    """The ``pyarrow.Schema`` of a ``"metrics"`` or ``"spans"`` part."""
    import pyarrow as pa

    fields = METRICS_FIELDS if kind == "metrics" else SPANS_FIELDS
    return pa.schema([(n, getattr(pa, t)()) for n, t in fields])


def _compact(v: Any) -> str:
    try:
        return orjson.dumps(v).decode("utf-8")
    except TypeError:  # pragma: no cover - JSON data is always encodable
        return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _compact_json(v: Any) -> str:
    """Compact JSON of decoded JSON data, NaN/Infinity written as Python's json does."""
    if v is None:
        return "null"
    if _all_finite(v):
        return _compact(v)
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _all_finite(v: Any) -> bool:
    t = type(v)
    if t is float:
        return v - v == 0.0
    if t is list:
        return all(_all_finite(x) for x in v)
    if t is dict:
        return all(_all_finite(x) for x in v.values())
    return True


def _int64(v: Any) -> int | None:
    if type(v) is int and _I64_MIN <= v <= _I64_MAX:
        return v
    return None


def _float(v: Any) -> float | None:
    t = type(v)
    if t is float:
        return v
    if t is int:
        return float(v)
    return None


def _decode(raw: bytes) -> Any:
    try:
        return decode_line(raw)
    except ValueError:
        return None


#: a run of 20 digits: maybe an int beyond 64 bits, which orjson reads as a float
_LONG_DIGITS = re.compile(rb"[0-9]{20}")


def _decode_exact(raw: bytes) -> Any:
    """Decode with the standard ``json`` module (exact big ints) when the line may hold an
    int orjson would read as a float."""
    if _LONG_DIGITS.search(raw):
        try:
            return json.loads(raw.decode("utf-8", errors="replace"))
        except ValueError:
            return None
    return _decode(raw)


def decode_metrics(lines: list[bytes], first_line: int) -> tuple[Any, list[int | None]]:
    """Decode complete metrics lines (without their newline) numbered from ``first_line``.

    Returns ``(table, steps)``: the LONG ``pyarrow.Table`` (see the module docstring) and,
    per line, its ``_step`` when the line gave at least one row (None otherwise).
    """
    import pyarrow as pa

    steps: list[Any] = []
    times: list[Any] = []
    metrics: list[str] = []
    values: list[Any] = []
    texts: list[Any] = []
    lines_out: list[int] = []
    line_steps: list[int | None] = []
    decode = _decode_exact if _LONG_DIGITS.search(b"\n".join(lines)) else _decode
    m_extend = metrics.extend
    v_append = values.append
    t_append = texts.append
    for i, raw in enumerate(lines, first_line):
        d = decode(raw)
        if type(d) is not dict:
            line_steps.append(None)
            continue
        n = 0
        for k, v in d.items():
            if k[:1] == "_":
                continue
            n += 1
            t = type(v)
            if t is float:
                v_append(v)
                t_append(None)
            elif t is int:
                f = float(v)
                v_append(f)
                t_append(None if -_EXACT <= v <= _EXACT or int(f) == v else str(v))
            elif t is str:
                v_append(None)
                t_append(v)
            elif t is bool:
                v_append(1.0 if v else 0.0)
                t_append(None)
            else:
                v_append(None)
                t_append(_compact_json(v))
        if n:
            if n == len(d):
                m_extend(d)
            else:
                m_extend([k for k in d if k[:1] != "_"])
            step = _int64(d.get("_step"))
            tm = _float(d.get("_time"))
            if n == 1:
                steps.append(step)
                times.append(tm)
                lines_out.append(i)
            else:
                steps.extend([step] * n)
                times.extend([tm] * n)
                lines_out.extend([i] * n)
            line_steps.append(step)
        else:
            line_steps.append(None)
    table = pa.table(
        {
            "step": pa.array(steps, type=pa.int64()),
            "time": pa.array(times, type=pa.float64()),
            "metric": pa.array(metrics, type=pa.string()),
            "value": pa.array(values, type=pa.float64()),
            "text": pa.array(texts, type=pa.string()),
            "line": pa.array(lines_out, type=pa.int64()),
        },
        schema=schema("metrics"),
    )
    return table, line_steps


def decode_spans(lines: list[bytes], first_line: int) -> Any:
    """Decode complete span lines numbered from ``first_line`` into a spans
    ``pyarrow.Table`` (see the module docstring)."""
    import pyarrow as pa

    cols: dict[str, list[Any]] = {n: [] for n, _ in SPANS_FIELDS}
    for i, raw in enumerate(lines):
        d = _decode(raw)
        if type(d) is not dict:
            continue
        cols["step"].append(_int64(d.get("_step")))
        name = d.get("name")
        cols["name"].append(name if type(name) is str else None)
        depth = d.get("depth")
        cols["depth"].append(depth if type(depth) is int and -(2**31) <= depth < 2**31 else None)
        cols["start"].append(_float(d.get("start")))
        cols["dur_ms"].append(_float(d.get("dur_ms")))
        for k in ("id", "parent", "pid", "tid"):
            cols[k].append(_int64(d.get(k)))
        for k in ("thread", "task"):
            v = d.get(k)
            cols[k].append(v if type(v) is str else None)
        err = d.get("error")
        cols["error"].append(err if err is None or type(err) is str else _compact_json(err))
        for k in ("args", "metrics"):
            v = d.get(k)
            cols[k].append(None if v is None else _compact_json(v))
        cols["line"].append(first_line + i)
    return pa.table(cols, schema=schema("spans"))
