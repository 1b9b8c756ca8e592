"""CSV and JSONL rows from Arrow record batches, built column-wise (``et export``).

Each row is the concatenation of rendered columns, done by Arrow compute over whole
batches, never per value in Python. To keep that cheap on exports of tens of millions of
rows, a column is rendered once per *distinct* value where it repeats (a string column
through its dictionary, a number column through its runs of equal consecutive values: the
identity columns, the metric name, a long layout's step and time) and gathered by index;
the separators and JSON keys around it are folded into those rendered values, so a row is
joined from few pieces. A column that is constant over a batch becomes a plain string.

Tokens (docs/export.md):

- CSV: a header of the column names; NULL is an empty field; an empty string is ``""``;
  a field holding ``,``, ``"``, a line break, or a leading/trailing space is quoted with
  ``"`` doubled; a float is its shortest round-trip text, always with ``.`` or an exponent
  (``3.0``, ``0.1``, ``1e+20``); NaN is ``NaN``, ±inf ``inf``/``-inf`` (pandas, polars and
  DuckDB read all three as floats).
- JSONL: one object per line, keys in column order; NULL is ``null``; NaN, ±inf are
  ``NaN``, ``Infinity``, ``-Infinity`` as in our own JSONL files.
"""

from __future__ import annotations

import json
from typing import Any

#: a column rendered once per distinct value when it has at most this share of distinct
#: runs (else each value is rendered where it is)
RUN_SHARE = 0.5
_CONTROL = [chr(c) for c in range(0x20) if chr(c) not in "\b\f\n\r\t"]


class RowRenderer:
    """Renders batches of one schema as ``csv`` or ``jsonl`` text (bytes per batch)."""

    def __init__(self, schema: Any, fmt: str) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        if fmt not in ("csv", "jsonl"):
            raise ValueError(f"fmt={fmt!r}: use csv or jsonl")
        self.pa, self.pc = pa, pc
        self.schema = schema
        self.fmt = fmt
        if fmt == "jsonl":
            self.lead = [
                ("{" if i == 0 else ",") + json.dumps(f.name, ensure_ascii=False) + ":"
                for i, f in enumerate(schema)
            ]
            self.end = "}\n"
            self.null = "null"
        else:
            self.lead = ["" if i == 0 else "," for i in range(len(schema))]
            self.end = "\n"
            self.null = ""

    def header(self) -> bytes:
        """The CSV header line (empty for JSONL)."""
        if self.fmt != "csv":
            return b""
        return (",".join(csv_field(f.name) for f in self.schema) + "\n").encode("utf-8")

    # -- rendering one column's values -----------------------------------------------------

    def _numbers(self, arr: Any) -> Any:
        pa, pc = self.pa, self.pc
        s = pc.cast(arr, pa.string())
        if pa.types.is_floating(arr.type):
            s = pc.replace_substring_regex(s, r"^(-?[0-9]+)$", r"\1.0")
            nan, inf, ninf = (
                ("NaN", "Infinity", "-Infinity") if self.fmt == "jsonl" else ("NaN", "inf", "-inf")
            )
            s = pc.if_else(pc.equal(s, "nan"), nan, s)
            s = pc.if_else(pc.equal(s, "inf"), inf, s)
            s = pc.if_else(pc.equal(s, "-inf"), ninf, s)
        return s

    def _strings(self, arr: Any) -> Any:
        pc = self.pc
        if self.fmt == "jsonl":
            s = pc.replace_substring(arr, "\\", "\\\\")
            s = pc.replace_substring(s, '"', '\\"')
            if pc.any(pc.match_substring_regex(s, "[\\x00-\\x1f]")).as_py():
                for ch, esc in (
                    ("\n", "\\n"),
                    ("\r", "\\r"),
                    ("\t", "\\t"),
                    ("\b", "\\b"),
                    ("\f", "\\f"),
                ):
                    s = pc.replace_substring(s, ch, esc)
                for ch in _CONTROL:
                    s = pc.replace_substring(s, ch, f"\\u{ord(ch):04x}")
            return pc.binary_join_element_wise('"', s, '"', "")
        needs = pc.or_(pc.match_substring_regex(arr, '[,"\\r\\n]|^\\s|\\s$'), pc.equal(arr, ""))
        quoted = pc.binary_join_element_wise('"', pc.replace_substring(arr, '"', '""'), '"', "")
        return pc.if_else(needs, quoted, arr)

    def _render(self, arr: Any) -> Any:
        """``arr`` as text, NULL as the format's null token (no NULLs left)."""
        pa, pc = self.pa, self.pc
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
            s = self._strings(arr)
        else:
            s = self._numbers(arr)
        return pc.fill_null(s, self.null)

    # -- one column: distinct values rendered once, or every value -------------------------

    def _gathered(self, arr: Any) -> tuple[Any, Any] | None:
        """``(distinct values, index per row)`` when the column repeats enough, else None."""
        import numpy as np

        pa, pc = self.pa, self.pc
        n = len(arr)
        if n == 0:
            return None
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
            enc = pc.dictionary_encode(arr, null_encoding="encode")
            if len(enc.dictionary) > RUN_SHARE * n and n > 16:
                return None
            return enc.dictionary, enc.indices
        # numbers: runs of equal consecutive values (bitwise: NaN runs too), NULL its own value
        if arr.null_count:
            valid = np.frombuffer(
                pc.is_valid(arr).cast(pa.int8()).buffers()[1], dtype=np.int8, count=n
            )
            bits = _bits(pc.fill_null(arr, pa.scalar(0, arr.type)), n)
            change = (bits[1:] != bits[:-1]) | (valid[1:] != valid[:-1])
        else:
            bits = _bits(arr, n)
            change = bits[1:] != bits[:-1]
        starts = np.flatnonzero(np.concatenate(([True], change)))
        if len(starts) > RUN_SHARE * n and n > 16:
            return None
        run_of_row = np.cumsum(np.concatenate(([0], change.astype(np.int32))), dtype=np.int32)
        return arr.take(pa.array(starts)), pa.array(run_of_row)

    def render(self, batch: Any) -> bytes:
        """The rows of ``batch`` as bytes (UTF-8)."""
        import numpy as np

        pa, pc = self.pa, self.pc
        if batch.num_rows == 0:
            return b""
        pieces: list[Any] = []  # str (a constant) or a string array (one per row)
        pending = ""  # text waiting to be folded into the next piece
        n_cols = batch.num_columns
        for i in range(n_cols):
            arr = batch.column(i)
            lead = pending + self.lead[i]
            pending = ""
            tail = self.end if i == n_cols - 1 else ""
            g = self._gathered(arr)
            if g is None:
                if lead:
                    pieces.append(lead)
                pieces.append(self._render(arr))
                pending = tail
                continue
            distinct, idx = g
            rendered = self._render(distinct)
            if len(distinct) == 1:
                pending = lead + rendered[0].as_py() + tail
                continue
            if lead or tail:
                rendered = pc.binary_join_element_wise(lead, rendered, tail, "")
            pieces.append(rendered.take(idx))
        if pending:
            pieces.append(pending)
        if len(pieces) == 1:
            only = pieces[0]
            if isinstance(only, str):  # every column constant: one text, repeated
                return (only * batch.num_rows).encode("utf-8")
            lines = only
        else:
            arrays = [p for p in pieces if not isinstance(p, str)]
            if not arrays:
                return ("".join(pieces) * batch.num_rows).encode("utf-8")
            lines = pc.binary_join_element_wise(*pieces, "")
        if isinstance(lines, pa.ChunkedArray):
            lines = lines.combine_chunks()
        lines = lines.cast(pa.large_string())
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)
        start = int(offsets[lines.offset])
        end = int(offsets[lines.offset + len(lines)])
        return bytes(memoryview(lines.buffers()[2])[start:end])


def _bits(arr: Any, n: int) -> Any:
    """The values of a null-free fixed-width number array as unsigned ints of its width
    (so equal bit patterns compare equal, NaN included)."""
    import numpy as np

    width = arr.type.bit_width
    buf = arr.buffers()[1]
    return np.frombuffer(
        buf, dtype=np.dtype(f"u{width // 8}"), count=n, offset=arr.offset * width // 8
    )


def csv_field(text: str) -> str:
    """One CSV field (a header name): quoted, ``"`` doubled, when it needs it."""
    if text == "" or any(c in text for c in ',"\r\n') or text != text.strip():
        return '"' + text.replace('"', '""') + '"'
    return text
