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
            # Arrow writes 3.0 as "3": add ".0" (checked first: most floats are not integral)
            if pc.any(pc.equal(arr, pc.floor(arr))).as_py():
                s = pc.replace_substring_regex(s, r"^(-?[0-9]+)$", r"\1.0")
            if not pc.all(pc.is_finite(arr)).as_py():
                nan, inf, ninf = (
                    ("NaN", "Infinity", "-Infinity")
                    if self.fmt == "jsonl"
                    else ("NaN", "inf", "-inf")
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
        # items: [kind, ...]: ["const", text] | ["gath", distinct rendered, index] | ["arr", rendered]
        items: list[list[Any]] = []
        for i in range(batch.num_columns):
            arr = batch.column(i)
            g = self._gathered(arr)
            if g is None:
                items.append(["arr", self._render(arr)])
                continue
            distinct, idx = g
            rendered = self._render(distinct)
            if len(distinct) == 1:
                items.append(["const", rendered[0].as_py()])
            else:
                items.append(["gath", rendered, idx])
        if self.fmt == "csv":
            pieces = self._fold(items, [""] * len(items), "\n", sep=",")
            sep = ","
        else:
            pieces = self._fold(items, self.lead, self.end, sep="")
            sep = ""
        if len(pieces) == 1:
            only = pieces[0]
            if isinstance(only, str):  # every column constant: one text, repeated
                rows: int = batch.num_rows
                return (only * rows).encode("utf-8")
            lines = only
        else:
            lines = pc.binary_join_element_wise(
                *(pa.scalar(p, pa.string()) if isinstance(p, str) else p for p in pieces),
                pa.scalar(sep, pa.string()),
            )
        if isinstance(lines, pa.ChunkedArray):
            lines = lines.combine_chunks()
        lines = lines.cast(pa.large_string())
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)
        start = int(offsets[lines.offset])
        end = int(offsets[lines.offset + len(lines)])
        return bytes(memoryview(lines.buffers()[2])[start:end])

    def _fold(self, items: list[list[Any]], leads: list[str], end: str, sep: str) -> list[Any]:
        """The pieces of a row, joined by ``sep``: constant text (each column's lead, the
        line end, constant columns) folded into the distinct values of a gathered
        neighbour wherever there is one, so few pieces remain (joining is per piece)."""
        pc = self.pc
        # 1. leads and the end as constants of their own, consecutive constants merged
        seq: list[list[Any]] = []
        for lead, item in zip(leads, items, strict=True):
            if lead:
                seq.append(["const", lead])
            seq.append(item)
        if not sep:
            seq.append(["const", end])
        merged: list[list[Any]] = []
        for item in seq:
            if item[0] == "const" and merged and merged[-1][0] == "const":
                # with a separator (CSV), two constant columns still need it between them
                merged[-1] = ["const", merged[-1][1] + sep + item[1]]
            else:
                merged.append(item)
        if sep:  # CSV: the line end follows the last column, without a separator
            last = merged[-1]
            if last[0] == "const":
                last[1] = last[1] + end
            else:  # a gathered column takes it into its distinct values
                last[1] = pc.binary_join_element_wise(last[1], end, "")
        # 2. JSON: a constant goes into the gathered item before it, else the one after it
        if not sep:
            out: list[list[Any]] = []
            for item in merged:
                if item[0] == "const" and out and out[-1][0] == "gath":
                    out[-1][1] = pc.binary_join_element_wise(out[-1][1], item[1], "")
                elif item[0] == "gath" and out and out[-1][0] == "const":
                    text = out.pop()[1]
                    out.append(["gath", pc.binary_join_element_wise(text, item[1], ""), item[2]])
                else:
                    out.append(item)
            merged = out
        return [
            item[1] if item[0] in ("const", "arr") else item[1].take(item[2]) for item in merged
        ]


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
