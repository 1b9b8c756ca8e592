"""A table's file, ``media/<sha256>.parquet``, and back (docs/media.md "Storage layout").

One Parquet file (pyarrow, zstd) per table, one Arrow column per table column:

- a column of numbers, strings or bools of one kind (None allowed) is that Arrow type; a
  table made from a DataFrame keeps its columns' NumPy dtypes (``int32`` stays ``int32``,
  ``float32`` ``float32``), so the table reads back as the same DataFrame;
- a column holding media (image or histogram cells, kept as their reference dicts) or
  values of mixed kinds (``1`` and ``"a"``) is a string column of JSON cells, named in the
  schema's metadata (``expr_tracker.json_columns``) and decoded when read.

The same table gives the same bytes with the same pyarrow (no timestamps are written), so
its SHA-256 names it.

The reader treats the bytes as untrusted: the footer is read first and the table refused
past :data:`MAX_COLUMNS` columns, :data:`MAX_ROWS` rows, :data:`MAX_TABLE_BYTES` of
uncompressed data, or a column type the writer does not write (nested lists, structs,
binary...); string columns are read dictionary-encoded and their decoded size checked
against the same bound before being expanded, so a small file of repeated long strings is
refused instead of filling memory. Errors raise ``ValueError`` naming the bound. The writer refuses (``ValueError``) a table
past the same bounds, so that no table is kept that cannot be read back.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

__all__ = [
    "JSON_COLUMNS_KEY",
    "MAX_COLUMNS",
    "MAX_ROWS",
    "MAX_TABLE_BYTES",
    "decode_table",
    "encode_table",
]

#: the schema metadata key naming the JSON columns
JSON_COLUMNS_KEY = b"expr_tracker.json_columns"
#: bounds of a table read back
MAX_COLUMNS = 4096
MAX_ROWS = 10_000_000
MAX_TABLE_BYTES = 1 << 30


def _pa() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.compute
        import pyarrow.parquet  # noqa: F401 - the submodules, for pa.compute and pa.parquet
    except ImportError:
        raise ImportError(
            "et.Table is stored as Parquet and needs pyarrow: pip install pyarrow "
            "(or pip install 'expr-tracker[query]')"
        ) from None
    return pa


def _json_cell(v: Any) -> str | None:
    if v is None:
        return None
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def _fits(values: list[Any], kinds: set[type], dtype: Any) -> bool:
    """Whether every cell keeps its value in the DataFrame's ``dtype``: Arrow casts 3.5 to
    an int32 3, 1e300 to a float32 inf and True to a float 1.0 without a word, so a row
    added later holding such a cell makes the column inferred from its cells instead."""
    import numpy as np

    dt = np.dtype(dtype)
    if dt.kind in "iu":
        return kinds <= {int}  # out of range: Arrow raises
    if dt.kind == "b":
        return kinds <= {bool}
    if dt.kind != "f" or not kinds <= {int, float}:
        return dt.kind != "f"
    if kinds <= {float} and dt.itemsize == 8:
        return True
    kind = float if kinds <= {float} else object  # ints: compared exactly, not as floats
    a = np.array([np.nan if v is None else v for v in values], dtype=kind)
    with np.errstate(over="ignore", invalid="ignore"):
        try:
            b = a.astype(dt).astype(kind)
        except (OverflowError, ValueError, TypeError):
            return False
        same = (a == b) | ((a != a) & (b != b))
    return bool(np.asarray(same, dtype=bool).all())


def _column(pa: Any, values: list[Any], dtype: Any) -> tuple[Any, bool]:
    """(Arrow array, is_json) of one column's cells."""
    if not any(isinstance(v, (dict, list)) for v in values):
        kinds = {type(v) for v in values if v is not None}
        if dtype is not None and _fits(values, kinds, dtype):
            try:
                return pa.array(values, type=pa.from_numpy_dtype(dtype)), False
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError):
                pass  # a row added later that the DataFrame's dtype cannot hold
        # bool is an int to Python: a mix of the two is kept as JSON (1 and True differ)
        if len(kinds) <= 1 or kinds <= {int, float}:
            try:
                return pa.array(values), False
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                pass  # an int beyond 64 bits
    return pa.array([_json_cell(v) for v in values], type=pa.string()), True


def encode_table(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], dtypes: Sequence[Any] | None = None
) -> bytes:
    """The Parquet bytes of a table (the module docstring).

    Args:
        columns: the column names (unique strings).
        rows: the rows, each with one cell per column: None, bool, int, float, str, or a
            media reference dict.
        dtypes: per column a NumPy dtype to keep (from a DataFrame), or None to infer.

    Raises:
        ImportError: pyarrow is not installed (the message says how to install it).
    """
    pa = _pa()
    arrays, json_cols = [], []
    for j, name in enumerate(columns):
        dtype = dtypes[j] if dtypes is not None else None
        arr, is_json = _column(pa, [r[j] for r in rows], dtype)
        arrays.append(arr)
        if is_json:
            json_cols.append(name)
    meta = {JSON_COLUMNS_KEY: json.dumps(json_cols).encode("utf-8")}
    fields = [pa.field(name, a.type) for name, a in zip(columns, arrays, strict=True)]
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=meta))
    _check_readable(pa, table)
    buf = io.BytesIO()
    pa.parquet.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def _check_readable(pa: Any, table: Any) -> None:
    """Refuse to write a table :func:`decode_table` would refuse to read (its bounds)."""
    rows, ncols = table.num_rows, table.num_columns
    if ncols > MAX_COLUMNS or rows > MAX_ROWS:
        raise ValueError(
            f"a table of {rows} rows x {ncols} columns is not kept: at most {MAX_ROWS} rows "
            f"and {MAX_COLUMNS} columns can be read back"
        )
    size = rows * sum(_cell_bytes(pa, f.type) for f in table.schema)
    text = sum(
        pa.compute.sum(pa.compute.binary_length(col)).as_py() or 0
        for f, col in zip(table.schema, table.columns, strict=True)
        if pa.types.is_string(f.type)
    )
    if size + text > MAX_TABLE_BYTES:  # the reader's bounds, and its footer's page sizes
        raise ValueError(
            f"a table of {size + text} bytes once read is not kept: at most "
            f"{MAX_TABLE_BYTES} can be read back"
        )


def _cell_bytes(pa: Any, t: Any) -> int:
    """The least bytes one cell of an allowed type takes once read (strings: the
    dictionary index and offset; their text is bounded after the read)."""
    if pa.types.is_dictionary(t):
        return 4 + _cell_bytes(pa, t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return 8
    if pa.types.is_boolean(t) or pa.types.is_null(t):
        return 1
    return max(1, t.bit_width // 8)


def _allowed(pa: Any, t: Any) -> bool:
    types = pa.types
    return bool(
        types.is_boolean(t)
        or types.is_integer(t)
        or types.is_floating(t)
        or types.is_null(t)
        or types.is_string(t)
        or types.is_large_string(t)
        or (types.is_dictionary(t) and _allowed(pa, t.value_type))
    )


def decode_table(data: bytes) -> tuple[Any, set[str]]:
    """``(pyarrow.Table, JSON column names)`` from Parquet bytes, bounded (the module
    docstring); JSON columns are still strings (:func:`json_cells` decodes them).

    Raises:
        ValueError: not a Parquet file, a bound passed, or a column type the writer does
            not write.
        ImportError: pyarrow is not installed.
    """
    pa = _pa()
    pq = pa.parquet
    try:
        pf = pq.ParquetFile(io.BytesIO(data))
        md = pf.metadata
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"not a Parquet table ({exc})") from None
    if md.num_columns > MAX_COLUMNS or md.num_rows > MAX_ROWS:
        raise ValueError(
            f"a table of {md.num_rows} rows x {md.num_columns} columns; at most {MAX_ROWS} "
            f"rows and {MAX_COLUMNS} columns are read"
        )
    for f in schema:
        if not _allowed(pa, f.type):
            raise ValueError(f"table column {f.name[:80]!r} has type {f.type}, not written here")
    size = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    # the footer's sizes are of the encoded pages: run-length encoded zeros are a few bytes
    # for millions of rows, so bound what reading will allocate too (rows x cell widths)
    size = max(size, md.num_rows * sum(_cell_bytes(pa, f.type) for f in schema))
    if size > MAX_TABLE_BYTES:
        raise ValueError(f"a table of {size} bytes uncompressed; at most {MAX_TABLE_BYTES}")
    strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]  # fmt: skip
    try:
        if strings:
            pf = pq.ParquetFile(io.BytesIO(data), read_dictionary=strings)
        table = pf.read(use_threads=False)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"a damaged Parquet table ({exc})") from None
    total = 0
    cols = []
    for f, col in zip(table.schema, table.columns, strict=True):
        if pa.types.is_dictionary(f.type):
            for chunk in col.chunks:
                lengths = pa.compute.binary_length(chunk.dictionary)
                total += pa.compute.sum(lengths.take(chunk.indices)).as_py() or 0
            if total > MAX_TABLE_BYTES:
                raise ValueError(
                    f"table column {f.name[:80]!r} expands past {MAX_TABLE_BYTES} bytes of text"
                )
            col = col.cast(f.type.value_type)
        cols.append(col)
    table = pa.Table.from_arrays(cols, names=table.column_names)
    meta = (schema.metadata or {}).get(JSON_COLUMNS_KEY)
    json_cols: set[str] = set()
    if meta:
        try:
            names = json.loads(meta)
        except ValueError:
            names = None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("a table whose JSON column list is not a list of names")
        json_cols = set(names) & set(table.column_names)
    return table, json_cols
