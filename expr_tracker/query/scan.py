"""Decoding blocks of JSONL lines into Arrow tables (the parts of the query cache).

Metrics (LONG: one row per (line, metric))::

    step BIGINT, time DOUBLE, metric VARCHAR, value DOUBLE, text VARCHAR, line BIGINT

- keys starting with ``_`` (``_step``, ``_time`` ...) are not metrics; a line holding only
  those (a ``log({})`` commit) gives no row; metric names are kept exactly (quotes, unicode,
  newlines, any length);
- ``float`` -> ``value`` (NaN and ±inf kept as IEEE doubles), ``text`` NULL;
- ``int`` -> ``value`` as a double, ``text`` NULL — except an int a double cannot hold
  exactly (beyond 2**53): ``value`` is the nearest double and ``text`` the exact decimal
  digits, so nothing is lost;
- ``bool`` -> 1.0 / 0.0; ``str`` -> ``text`` (``value`` NULL); ``None``, lists and dicts ->
  ``text`` holding compact JSON (``null``, ``[1,2]``; NaN/±inf inside written ``NaN`` /
  ``Infinity``), ``value`` NULL;
- ``step`` is ``_step`` (NULL when absent or not an int64), ``time`` is ``_time`` (NULL when
  absent or not a number); ``line`` the 0-based line number in the source (every
  newline-terminated line counts, blank or broken ones included).

Spans: ``step, name, depth, start, dur_ms, id, parent, pid, tid, thread, task, error, args,
metrics, line`` (``step`` from ``_step``; ``args``/``metrics`` compact JSON or NULL; an int
``start``/``dur_ms`` reads as a double; any other field of the wrong type reads NULL, a
non-string ``error`` its compact JSON).

A line that is not JSON or not an object gives no row (it keeps its line number) and is
counted as unreadable (:class:`BadLines`: how many, and the first one with its reason), so a
reader can say which lines it skipped. Every line is untrusted input: JSON nested deeper than
1,024 levels, a lone surrogate escape (``"\\ud800"``) or invalid UTF-8 make the line
unreadable, never an exception (:func:`expr_tracker.history.untrusted.load_json_bytes`);
``pyarrow.json`` (which a line of 20,000 nested brackets crashes) only ever sees blocks whose
lines are flat objects (:func:`_flat_objects`). A blank line is neither a row nor unreadable.

Three decoders give the same rows (tests check it on random blocks and a table of the cases
where JSON readers differ: ``tests/query/test_decoders_differential.py``):

- polars (:func:`_polars_dense`), when installed, for a dense block (every line the first
  line's keys, each a number, an int ``_step``; no backslash in the block): polars' NDJSON
  reader with an explicit schema, ~35 % less CPU than ``pyarrow.json`` for a 4 MiB block of
  5-float lines (~20 ms against ~30 ms here, under load); imported (~0.25 s of CPU) only for
  a block of :data:`POLARS_MIN_BYTES` or more;
- vectorised (:func:`decode_metrics_block`, :func:`decode_spans_block`): the block is parsed
  by ``pyarrow.json`` (C++, full-precision doubles, NaN/Infinity accepted) when it is plain:
  every line one flat object (no ``[`` and one ``{`` per line outside strings), metrics lines
  of numbers, bools and strings only, an int ``_step`` in every line, no ``null`` token, no
  finite number of 2**53 or more, at most :data:`WIDE_KEYS` keys in the first line; span lines
  without ``args``/``metrics`` and with every field of its type. When every line holds
  every metric as a number (what ``et.log`` writes) the columns are interleaved into the
  LONG rows with numpy (:func:`_unpivot_dense`); a 4 MiB block of 5-float lines (~24,000)
  then takes ~31 ms of CPU here, ~23 ms of it ``pyarrow.json`` (~130 MB/s).
- line by line (:func:`decode_metrics`, :func:`decode_spans`) otherwise: orjson, with the
  standard ``json`` module for a line holding ``NaN``/``Infinity`` or a run of 20 digits (an
  int beyond 64 bits, which orjson would read as a float). About 60,000 metrics lines of 5
  keys a second (~25 MB/s); wide lines (50,000 metrics each) ~60-70 MB/s, where
  ``pyarrow.json`` builds a column per key and manages ~1 MB/s
  (``benchmarks/bench_wide.py``).
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import orjson

from expr_tracker.history.codec import is_step
from expr_tracker.history.untrusted import load_json_bytes

__all__ = [
    "BadLines",
    "CACHE_WRITE_OPTIONS",
    "METRICS_FIELDS",
    "SPANS_FIELDS",
    "WRITE_OPTIONS",
    "decode_metrics",
    "decode_metrics_block",
    "decode_metrics_part",
    "decode_spans",
    "decode_spans_block",
    "count_lines",
    "load_line",
    "part_schema",
    "part_table",
    "reason",
    "schema",
    "too_deep",
]

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_EXACT = 2**53
#: a first line with more keys than this is decoded line by line: ``pyarrow.json`` builds a
#: column per key, and at 50,000 keys a line it decodes ~1 MB/s (line by line: ~60 MB/s)
WIDE_KEYS = 500


class BadLines:
    """Complete lines that gave nothing because they could not be read: not JSON, not a JSON
    object, nested too deeply, a lone surrogate escape, invalid UTF-8. ``count`` of them and
    ``first``: ``(line number, 0-based; reason)`` of the first one, None while there is none."""

    __slots__ = ("count", "first")

    def __init__(self) -> None:
        self.count = 0
        self.first: tuple[int, str] | None = None

    def add(self, line: int, reason: str) -> None:
        self.count += 1
        if self.first is None or line < self.first[0]:
            self.first = (line, reason)

    def merge(self, other: BadLines) -> None:
        """Add ``other``'s lines to these."""
        if other.count:
            self.count += other.count - 1
            assert other.first is not None
            self.add(*other.first)


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


#: ``pyarrow.parquet.ParquetWriter`` options of a part: zstd; strings dictionary-encoded;
#: steps and line numbers delta-encoded; floats byte-stream-split (a 100,000-line file of
#: 5 random float metrics gives ~3.6 MB of parts instead of ~6.3 MB with the defaults).
#: A metric's ``value`` carries no min/max statistics: Parquet's leave NaN out, and DuckDB
#: then skips the row groups holding NaN in ``WHERE isnan(value)`` (its
#: ``parquet_can_have_nan`` fixes that but, in DuckDB 2.0.1, answers an ungrouped
#: ``max(value)`` with NaN from the statistics). The other columns keep theirs (row groups
#: pruned by step or metric; ``time``, ``start`` and ``dur_ms`` are the tracker's own clocks).
WRITE_OPTIONS: dict[str, dict[str, Any]] = {
    "metrics": {
        "compression": "zstd",
        "write_statistics": ["step", "time", "metric", "text", "line"],
        "use_dictionary": ["metric", "text"],
        "column_encoding": {
            "step": "DELTA_BINARY_PACKED",
            "line": "DELTA_BINARY_PACKED",
            "time": "BYTE_STREAM_SPLIT",
            "value": "BYTE_STREAM_SPLIT",
        },
    },
    "spans": {
        "compression": "zstd",
        "use_dictionary": ["name", "thread", "task", "error", "args", "metrics"],
        "column_encoding": {
            "step": "DELTA_BINARY_PACKED",
            "line": "DELTA_BINARY_PACKED",
            "id": "DELTA_BINARY_PACKED",
            "start": "BYTE_STREAM_SPLIT",
            "dur_ms": "BYTE_STREAM_SPLIT",
        },
    },
}


#: the options of the query cache's own parts: :data:`WRITE_OPTIONS` with LZ4 instead of
#: zstd. The cache is read by every query and rewritten by none, so its decoding speed
#: counts more than its size: a repeated aggregate over 10M rows takes ~14 % less CPU
#: (DuckDB decompressing), writing a part ~20 % less, for ~11 % more bytes (100,000 lines
#: of 5 random float metrics: ~3.9 MB). Files meant for other engines (``et export``,
#: ``et sync``) keep zstd, which every Parquet reader knows.
CACHE_WRITE_OPTIONS: dict[str, dict[str, Any]] = {
    kind: {**opts, "compression": "lz4", "store_schema": False}
    for kind, opts in WRITE_OPTIONS.items()
}


def schema(kind: str) -> Any:
    """The ``pyarrow.Schema`` of a ``"metrics"`` or ``"spans"`` part, as read back."""
    import pyarrow as pa

    fields = METRICS_FIELDS if kind == "metrics" else SPANS_FIELDS
    return pa.schema([(n, getattr(pa, t)()) for n, t in fields])


def part_schema(kind: str) -> Any:
    """The ``pyarrow.Schema`` a part is written from: :func:`schema`, with ``metric``
    dictionary-encoded (``dictionary<int32, string>``; Parquet keeps the column
    dictionary-encoded either way). The parts are written without Arrow's schema in their
    metadata (:data:`CACHE_WRITE_OPTIONS`' ``store_schema``), so they read back as
    :func:`schema` says, strings."""
    import pyarrow as pa

    sch = schema(kind)
    if kind != "metrics":
        return sch
    return sch.set(sch.get_field_index("metric"), pa.field("metric", _dict_string()))


def _dict_string() -> Any:
    import pyarrow as pa

    return pa.dictionary(pa.int32(), pa.string())


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


def _step(v: Any) -> int | None:
    """``_step`` as a step (an int in [0, 2**63-1]), else None: the line gives no row
    (``is_step``; docs/logging.md "The commit table")."""
    return v if is_step(v) else None


def _float(v: Any) -> float | None:
    t = type(v)
    if t is float:
        return v
    if t is int:
        return float(v)
    return None


class _Bad:
    """What a decoder gives for a line it cannot read (its ``reason``)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


_POSITION = re.compile(r"[:,]? ?(?:line \d+ column \d+ )?\(char \d+\)$|: line \d+ column \d+$")


def reason(exc: BaseException) -> str:
    """A short reason for a line or file that cannot be decoded, from the decoder's error
    (``"nested too deeply"``, ``"unexpected end of data"``)."""
    return _why(exc)


def _why(exc: BaseException) -> str:
    text = str(exc).split("\n")[0].strip()
    if "depth limit" in text or "recursion" in text.lower():
        return "nested too deeply"
    text = _POSITION.sub("", text).strip()
    if len(text) > 80:
        text = text[:77] + "..."
    return text or type(exc).__name__


#: a line nested deeper than this is unreadable (its values are written back as compact JSON
#: text, by code that recurses per level)
MAX_DEPTH = 200


def too_deep(raw: bytes, value: Any) -> bool:
    """True when ``value`` (decoded from ``raw``) nests deeper than :data:`MAX_DEPTH`; a
    line with fewer brackets than that is not looked into."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return False
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        if type(v) is dict:
            stack.extend((x, depth + 1) for x in v.values() if type(x) in (dict, list))
        elif type(v) is list:
            stack.extend((x, depth + 1) for x in v if type(x) in (dict, list))
    return False


def _decode(raw: bytes) -> Any:
    """The JSON value of one line, or a :class:`_Bad` (never an exception, whatever the
    bytes: :func:`~expr_tracker.history.untrusted.load_json_bytes`)."""
    try:
        value = load_json_bytes(raw)
    except (ValueError, RecursionError, MemoryError) as exc:
        return _Bad(_why(exc) if not isinstance(exc, RecursionError) else "nested too deeply")
    if too_deep(raw, value):
        return _Bad(f"nested deeper than {MAX_DEPTH} levels")
    return value


def load_line(raw: bytes) -> tuple[Any, str | None]:
    """One JSON line decoded as the metrics decoder decodes it: ``(value, None)``, or
    ``(None, reason)`` when the line cannot be read (never an exception)."""
    value = _decode_exact(raw)
    if type(value) is _Bad:
        return None, value.reason
    return value, None


#: a run of 20 digits: maybe an int beyond 64 bits, which orjson reads as a float
_LONG_DIGITS = re.compile(rb"[0-9]{20}")
#: a ``\\uD800``-``\\uDFFF`` escape: half of a surrogate pair, or a lone surrogate
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _decode_exact(raw: bytes) -> Any:
    """Decode with the standard ``json`` module (exact big ints) when the line may hold an
    int orjson would read as a float; as safe as :func:`_decode` (depth, surrogates)."""
    if not _LONG_DIGITS.search(raw):
        return _decode(raw)
    try:
        value = json.loads(raw.decode("utf-8"))
    except RecursionError:
        return _Bad("nested too deeply")
    except (ValueError, MemoryError) as exc:
        return _Bad(_why(exc))
    if _SURROGATE.search(raw):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except (UnicodeEncodeError, RecursionError):
            return _Bad("holds a lone surrogate escape")
    if too_deep(raw, value):
        return _Bad(f"nested deeper than {MAX_DEPTH} levels")
    return value


def decode_metrics(
    lines: list[bytes], first_line: int, bad: BadLines | None = None
) -> tuple[Any, list[int | None]]:
    """Decode complete metrics lines (without their newline) numbered from ``first_line``,
    one line at a time. Lines that cannot be read give no row and are added to ``bad``.

    Returns ``(table, steps)``: the LONG ``pyarrow.Table`` (see the module docstring) and
    the ``_step`` of each line that gave at least one row, in line order (None where the
    line has no int ``_step``).
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
            if bad is not None and raw.strip():
                bad.add(i, d.reason if type(d) is _Bad else "not a JSON object")
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
            step = _step(d.get("_step"))
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


_FAST_VALUE_TYPES = ("double", "int64", "bool", "string")


def decode_metrics_block(
    chunk: bytes, first_line: int, bad: BadLines | None = None
) -> tuple[Any, Any]:
    """Decode a block of complete metrics lines (``chunk`` ends with a newline) numbered
    from ``first_line``: vectorised with ``pyarrow.json`` when the block is plain (every
    line an object of numbers, bools and strings with an int ``_step``; no ``null``, no
    finite number of 2**53 or more in magnitude, no empty line), else line by line (:func:`decode_metrics`). Both give the
    same rows in line order (within one line, the per-line path keeps the line's key order,
    the vectorised one the order in which the block's keys first appear).

    Lines that cannot be read give no row and are added to ``bad``.

    Returns ``(table, steps)``: the LONG table and the ``_step`` of each line that gave
    rows, in line order (a ``pyarrow.Array`` of int64, null where absent).
    """
    table, steps, _lines = decode_metrics_part(chunk, first_line, bad)
    return _plain_metric(table), steps


def decode_metrics_part(
    chunk: bytes, first_line: int, bad: BadLines | None = None
) -> tuple[Any, Any, int]:
    """:func:`decode_metrics_block` for a cache part: ``(table, steps, lines)``, the table
    of :func:`part_schema` (``metric`` dictionary-encoded: the dense decoders build it from
    the block's names without hashing a string per row, and the Parquet writer keeps that
    dictionary instead of hashing them again) and ``lines`` the newlines of ``chunk``
    (counted once, by the pass that checks the lines are flat objects)."""
    import pyarrow as pa

    if chunk[:1] == b"{":
        lines, flat = _scan_lines(chunk)
    else:
        lines, flat = count_lines(chunk), False
    fast = _fast_metrics(chunk, first_line, lines if flat else 0, dictionary=True)
    if fast is not None:
        return fast[0], fast[1], lines
    table, steps = decode_metrics(chunk[:-1].split(b"\n"), first_line, bad)
    return part_table(table, "metrics"), pa.array(steps, type=pa.int64()), lines


def _plain_metric(table: Any) -> Any:
    """``table`` with a dictionary-encoded ``metric`` column turned back into strings
    (:func:`schema`)."""
    import pyarrow as pa

    i = table.schema.get_field_index("metric")
    if not pa.types.is_dictionary(table.schema.field(i).type):
        return table
    col = table.column(i).cast(pa.string())
    return table.set_column(i, table.schema.field(i).with_type(pa.string()), col)


def part_table(table: Any, kind: str) -> Any:
    """``table`` (a decoded block, or a row group read back from a part) in
    :func:`part_schema`: for metrics, ``metric`` dictionary-encoded when it is not yet."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if kind != "metrics":
        return table
    i = table.schema.get_field_index("metric")
    if pa.types.is_dictionary(table.schema.field(i).type):
        return table
    col = pc.dictionary_encode(table.column(i))
    return table.set_column(i, pa.field("metric", _dict_string()), col)


#: a JSON string (its escapes included): taken out before brackets are counted
_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')


def _flat_objects(chunk: bytes, n: int) -> bool:
    """True when each of the ``n`` lines of ``chunk`` is structurally one flat object: it
    starts with ``{`` and, outside strings, holds no other ``{`` and no ``[``. Only such a
    block goes to ``pyarrow.json``, whose parser recurses per nesting level (a line of
    20,000 brackets crashes the process); any nesting is not plain anyway."""
    starts = chunk.count(b"\n{") + (chunk[:1] == b"{")
    if starts != n:
        return False
    if b"[" not in chunk and chunk.count(b"{") == n:
        return True
    # brackets inside strings (a metric named "acc[0]"): count again without the strings
    bare = _STRING.sub(b'""', chunk)
    return b"[" not in bare and bare.count(b"{") == n


def count_lines(chunk: bytes) -> int:
    """The number of newlines in ``chunk`` (counted by numpy past 64 KiB: ``bytes.count``
    holds the GIL, which the threads refreshing other runs are waiting for)."""
    if len(chunk) < 1 << 16:
        return chunk.count(b"\n")
    import numpy as np

    return int(np.count_nonzero(np.frombuffer(chunk, dtype=np.uint8) == 10))


def _object_lines(chunk: bytes) -> int:
    """The number of lines of ``chunk`` (which ends with a newline) when each is one flat
    object as :func:`_flat_objects` says, else 0."""
    n, flat = _scan_lines(chunk)
    return n if flat else 0


def _scan_lines(chunk: bytes) -> tuple[int, bool]:
    """``(newlines in chunk, each line one flat object)`` for ``chunk`` (which ends with a
    newline; :func:`_flat_objects`); the line starts are found with numpy (one pass over
    the block instead of a substring count, without the GIL)."""
    import numpy as np

    a = np.frombuffer(chunk, dtype=np.uint8)
    ends = np.flatnonzero(a == 10)
    n = len(ends)
    if not n or a[0] != 123 or not (a[ends[:-1] + 1] == 123).all():
        return n, False  # a line not starting with "{" (blank lines included)
    if b"[" not in chunk and int(np.count_nonzero(a == 123)) == n:
        return n, True
    bare = _STRING.sub(b'""', chunk)
    return n, b"[" not in bare and bare.count(b"{") == n


def _fast_metrics(
    chunk: bytes, first_line: int, n: int | None = None, dictionary: bool = False
) -> tuple[Any, Any] | None:
    """The vectorised decoders (polars, then ``pyarrow.json``) of a plain block, or None.
    ``n``: the block's lines when known to be flat objects (:func:`_scan_lines`; 0: not
    flat). ``dictionary``: ``metric`` dictionary-encoded (:func:`part_schema`)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    if chunk[:1] != b"{":
        return None
    if n is None:
        n = _object_lines(chunk)
    if not n or chunk.count(b'":', 0, chunk.find(b"\n")) > WIDE_KEYS:
        return None
    dense = _polars_dense(chunk, first_line, n, dictionary)
    if dense is not None:
        return dense
    if b"null" in chunk:
        return None
    try:
        t = pj.read_json(
            pa.BufferReader(chunk),
            read_options=pj.ReadOptions(
                block_size=max(1 << 20, min(len(chunk), 1 << 24)), use_threads=False
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if t.num_rows != n:
        return None
    try:
        names = t.column_names
    except UnicodeDecodeError:  # pyarrow.json keeps a key of invalid UTF-8 as it is
        return None
    step = t.column("_step") if "_step" in names else None
    if step is None or str(step.type) != "int64" or step.null_count:
        return None
    if n and pc.min(step).as_py() < 0:  # not a step: the line-by-line decoder has no row
        return None
    tm = t.column("_time") if "_time" in names else pa.nulls(n, pa.float64())
    if str(tm.type) not in ("double", "int64"):
        return None
    if str(tm.type) != "double":
        tm = pc.cast(tm, pa.float64())
    cols = [(k, t.column(k)) for k in names if k[:1] != "_"]
    for _k, c in cols:
        ty = str(c.type)
        if ty not in _FAST_VALUE_TYPES:
            return None
        if ty in ("int64", "double") and c.length() - c.null_count:
            # pyarrow reads an int token beyond int64 as a double, and an int in a column
            # of floats as a double: a finite magnitude of 2**53 or more might have been an
            # int a double cannot hold exactly (2**53 + 1 reads as 2**53), which the
            # line-by-line path keeps in ``text``
            a = pc.abs(c)
            if ty == "double":
                a = pc.filter(a, pc.is_finite(a))
            hi = pc.max(a).as_py()
            if hi is not None and hi >= _EXACT:
                return None
    m = len(cols)
    if m and all(c.null_count == 0 and str(c.type) in ("double", "int64") for _k, c in cols):
        return _unpivot_dense(cols, step, tm, first_line, n, dictionary)
    line_all = pa.array(range(first_line, first_line + n), type=pa.int64())
    pieces = []
    order = []
    any_valid = None
    for j, (k, c) in enumerate(cols):
        c = c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
        valid = pc.is_valid(c)
        any_valid = valid if any_valid is None else pc.or_(any_valid, valid)
        idx = pc.indices_nonzero(valid) if c.null_count else None
        cc = c if idx is None else c.take(idx)
        ty = str(c.type)
        if ty == "string":
            value = pa.nulls(len(cc), pa.float64())
            text = cc
        else:
            value = pc.cast(cc, pa.float64())
            text = pa.nulls(len(cc), pa.string())
        sel = (lambda a: a) if idx is None else (lambda a, idx=idx: a.take(idx))
        line = sel(line_all)
        pieces.append(
            pa.table(
                {
                    "step": sel(step),
                    "time": sel(tm),
                    "metric": pa.repeat(pa.scalar(k, pa.string()), len(cc)),
                    "value": value,
                    "text": text,
                    "line": line,
                },
                schema=schema("metrics"),
            )
        )
        order.append(pc.add(pc.multiply(line, m), j))
    if not pieces:
        return pa.table({f: [] for f, _ in METRICS_FIELDS}, schema=schema("metrics")), pa.array(
            [], type=pa.int64()
        )
    table = pa.concat_tables(pieces)
    key = pa.chunked_array(order).combine_chunks()
    table = table.take(pc.sort_indices(key))
    steps = pc.filter(step, any_valid)
    if isinstance(steps, pa.ChunkedArray):
        steps = steps.combine_chunks()
    table = table.combine_chunks()
    return (part_table(table, "metrics") if dictionary else table), steps


def _numpy(column: Any) -> Any:
    """The values of an int64 or float64 Arrow column without nulls as a numpy array, read
    from its buffer (``to_numpy`` would import pandas, ~0.5 s, on a process's first call)."""
    import numpy as np
    import pyarrow as pa

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    dtype = np.int64 if pa.types.is_int64(arr.type) else np.float64
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * 8)


def _unpivot_dense(
    cols: list[tuple[str, Any]],
    step: Any,
    tm: Any,
    first_line: int,
    n: int,
    dictionary: bool = False,
) -> Any:
    """The LONG rows of a block where every line holds every metric as a number (the
    common case: a metric per ``log()`` key): the ``m`` columns interleaved line by line
    with numpy (one copy each) instead of a table per metric sorted back into line order.
    Arrays are made from numpy buffers: ``pyarrow.array`` and ``pyarrow.table`` import
    pandas (~0.5 s) on a process's first call, which a refresh of a few new lines would
    otherwise pay."""
    import numpy as np

    values = np.empty((n, len(cols)), dtype=np.float64)
    for j, (_k, c) in enumerate(cols):
        values[:, j] = _numpy(c)  # int64 columns are converted exactly (|v| <= 2**53)
    time = tm if tm.null_count else _numpy(tm)
    return _unpivot(values, [k for k, _c in cols], _numpy(step), time, first_line, dictionary)


def _unpivot(
    values: Any,
    names: list[str],
    step_np: Any,
    time: Any,
    first_line: int,
    dictionary: bool = False,
) -> Any:
    """``(table, steps)``: the LONG table of ``values`` (float64, shape ``(n, m)``: line by
    metric ``names``) with ``step_np`` (int64, ``(n,)``) and ``time`` (float64 numpy
    ``(n,)``, or an Arrow array with nulls where a line has no ``_time``), and the steps
    as an Arrow int64 array. ``dictionary``: ``metric`` as ``names`` indexed by codes
    (:func:`part_schema`), else as strings (:func:`schema`)."""
    import numpy as np
    import pyarrow as pa

    n, m = values.shape
    rows = np.repeat(np.arange(n, dtype=np.int64), m)
    if isinstance(time, np.ndarray):
        time_col = _from_numpy(np.repeat(time, m), pa.float64())
    else:  # ``_time`` absent from some line: kept NULL
        time_col = time.take(_from_numpy(rows, pa.int64()))
    codes = _from_numpy(np.tile(np.arange(m, dtype=np.int32), n), pa.int32())
    if dictionary:
        metric = pa.DictionaryArray.from_arrays(codes, _strings(names))
    else:
        metric = _strings(names).take(codes)
    arrays = [
        _from_numpy(np.repeat(step_np, m), pa.int64()),
        time_col,
        metric,
        _from_numpy(np.ascontiguousarray(values).reshape(-1), pa.float64()),
        pa.nulls(n * m, pa.string()),
        _from_numpy(rows + first_line, pa.int64()),
    ]
    sch = part_schema("metrics") if dictionary else schema("metrics")
    table = pa.Table.from_arrays(arrays, schema=sch)
    return table, _from_numpy(np.ascontiguousarray(step_np), pa.int64())


#: the smallest block decoded with polars when it is not imported yet (its import takes
#: ~0.3-1 s: a refresh of a few new lines keeps ``pyarrow.json``)
POLARS_MIN_BYTES = 1 << 20
_polars_state: list[Any] = []  # [module or None] once tried


def _polars(size: int) -> Any:
    """The ``polars`` module when installed and worth importing for a block of ``size``
    bytes (or already imported), else None."""
    if _polars_state:
        return _polars_state[0]
    if size < POLARS_MIN_BYTES and "polars" not in sys.modules:
        return None
    try:
        import polars
    except Exception:  # noqa: BLE001 - not installed or broken: pyarrow.json decodes
        polars = None
    _polars_state[:] = [polars]
    return polars


def _polars_dense(
    chunk: bytes, first_line: int, n: int, dictionary: bool = False
) -> tuple[Any, Any] | None:
    """The dense block (every line holds the first line's keys, each a number; an int
    ``_step`` everywhere; ``_time`` a number where present) decoded by polars' NDJSON
    reader (~40 % less CPU than ``pyarrow.json`` for such a block), or None when the block
    is anything else (then ``pyarrow.json`` or the line-by-line decoder reads it).

    ``chunk``: ``n`` lines, each one flat object (:func:`_object_lines`), no ``null``.
    Polars is given an explicit schema (every key of the first line a double, ``_step`` an
    int64), so a value of another type (a string, a bool, ``1.5`` for ``_step``, a number
    beyond int64 for ``_step``), ``NaN``/``Infinity`` or any syntax error fails the read.
    What an explicit schema does not see is checked from the bytes: a block with a
    backslash (escapes: a key's ``\\u`` or ``\\"``) is not taken; each key holds exactly
    two quotes and no value does, so the block's quotes must be twice the non-null cells:
    a key not in the first line, a key given twice in a line (polars keeps the first, the
    standard decoder the last) or any string value makes them more. A magnitude of 2**53
    or more (maybe an int a double does not hold exactly, read as a double) is left to the
    other decoders."""
    if b"\\" in chunk:
        return None
    pl = _polars(len(chunk))
    if pl is None:
        return None
    try:
        first = orjson.loads(chunk[: chunk.index(b"\n")])
    except orjson.JSONDecodeError:
        return None
    if type(first) is not dict or type(first.get("_step")) is not int:
        return None
    names = [k for k in first if k[:1] != "_"]
    if not names or any(type(v) not in (int, float) for v in first.values()):
        return None
    fields = {k: (pl.Int64 if k == "_step" else pl.Float64) for k in first}
    try:
        df = pl.read_ndjson(chunk, schema=fields)
    except (Exception, pl.exceptions.PanicException):  # noqa: BLE001 - any failure: not dense
        return None
    if df.height != n:
        return None
    nulls = df.null_count().row(0)
    cells = n * len(fields) - sum(nulls)
    import numpy as np

    if np.count_nonzero(np.frombuffer(chunk, dtype=np.uint8) == 34) != 2 * cells:
        return None  # 34: '"'
    if any(nulls[j] for j, k in enumerate(fields) if k != "_time"):
        return None  # a metric or ``_step`` missing from a line: not dense
    values = np.empty((n, len(names)), dtype=np.float64)
    for j, k in enumerate(names):
        values[:, j] = df.get_column(k).to_numpy()
    # an int token beyond 2**53 read as a double rounds to 2**53 or more: the line-by-line
    # decoder keeps its exact digits in ``text`` (polars reads no NaN/inf: all finite here)
    if n and (values.max() >= _EXACT or values.min() <= -_EXACT):
        return None
    step_np = df.get_column("_step").to_numpy()
    if n and step_np.min() < 0:  # not a step: the line-by-line decoder has no row
        return None
    if "_time" not in fields:
        import pyarrow as pa

        time: Any = pa.nulls(n, pa.float64())
    else:
        tcol = df.get_column("_time")
        time = tcol.to_arrow() if tcol.null_count() else tcol.to_numpy()
    return _unpivot(values, names, step_np, time, first_line, dictionary)


def _from_numpy(a: Any, typ: Any) -> Any:
    """A contiguous numpy array of a fixed-width type as an Arrow array without nulls."""
    import pyarrow as pa

    return pa.Array.from_buffers(typ, len(a), [None, pa.py_buffer(a)])


def _strings(items: list[str]) -> Any:
    """``items`` as an Arrow string array (see :func:`_unpivot_dense` for why not
    ``pyarrow.array``)."""
    import numpy as np
    import pyarrow as pa

    data = [x.encode("utf-8") for x in items]
    offsets = np.zeros(len(data) + 1, dtype=np.int32)
    np.cumsum([len(d) for d in data], out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))]
    return pa.Array.from_buffers(pa.string(), len(data), buffers)


#: the JSON fields of a span line the vectorised path reads, with their types: the part's
#: fields from ``step`` (read as ``_step``) to ``error``
_SPAN_JSON = (("_step", "int64"), *SPANS_FIELDS[1 : [k for k, _ in SPANS_FIELDS].index("args")])


def decode_spans_block(chunk: bytes, first_line: int, bad: BadLines | None = None) -> Any:
    """Decode a block of complete span lines (``chunk`` ends with a newline) numbered from
    ``first_line``: vectorised with ``pyarrow.json`` when no line has ``args`` or
    ``metrics`` (kept as JSON text) and every field has its type, else line by line
    (:func:`decode_spans`); both give the same table. Lines that cannot be read give no row
    and are added to ``bad``."""
    fast = _fast_spans(chunk, first_line)
    if fast is not None:
        return fast
    return decode_spans(chunk[:-1].split(b"\n"), first_line, bad)


def _fast_spans(chunk: bytes, first_line: int) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    if b'"args"' in chunk or b'"metrics"' in chunk or b"\n\n" in chunk or chunk[:1] == b"\n":
        return None
    n = chunk.count(b"\n")
    if not _flat_objects(chunk, n):
        return None
    explicit = pa.schema([(k, getattr(pa, t)()) for k, t in _SPAN_JSON])
    try:
        t = pj.read_json(
            pa.BufferReader(chunk),
            read_options=pj.ReadOptions(block_size=max(1 << 20, min(len(chunk), 1 << 24))),
            parse_options=pj.ParseOptions(
                explicit_schema=explicit, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if t.num_rows != n:
        return None
    cols = {
        k: t.column(k) if k in t.column_names else pa.nulls(n, getattr(pa, ty)())
        for k, ty in _SPAN_JSON
    }
    cols["step"] = step = cols.pop("_step")
    if step.null_count != n and pc.min(step).as_py() < 0:  # not a step: as decode_spans
        step = cols["step"] = pc.if_else(pc.less(step, 0), pa.scalar(None, pa.int64()), step)
    cols["args"] = pa.nulls(n, pa.string())
    cols["metrics"] = pa.nulls(n, pa.string())
    cols["line"] = pa.array(range(first_line, first_line + n), type=pa.int64())
    return pa.table({f: cols[f] for f, _ in SPANS_FIELDS}, schema=schema("spans")).combine_chunks()


def decode_spans(lines: list[bytes], first_line: int, bad: BadLines | None = None) -> Any:
    """Decode complete span lines numbered from ``first_line`` into a spans
    ``pyarrow.Table`` (see the module docstring); lines that cannot be read give no row and
    are added to ``bad``."""
    import pyarrow as pa

    cols: dict[str, list[Any]] = {n: [] for n, _ in SPANS_FIELDS}
    for i, raw in enumerate(lines):
        d = _decode(raw)
        if type(d) is not dict:
            if bad is not None and raw.strip():
                bad.add(first_line + i, d.reason if type(d) is _Bad else "not a JSON object")
            continue
        cols["step"].append(_step(d.get("_step")))
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
