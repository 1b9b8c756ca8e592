"""The column-wise CSV/JSONL renderer of et export (expr_tracker.query.textrows), checked
against Python's csv and json modules on columns that repeat, run and never repeat."""

from __future__ import annotations

import csv
import io
import json
import math
import random

import pytest

pa = pytest.importorskip("pyarrow")

from expr_tracker.query.textrows import RowRenderer, csv_field  # noqa: E402

NAN = float("nan")
INF = float("inf")
STRINGS = [
    "x",
    "a,b",
    'q"uote',
    "",
    " lead",
    "trail ",
    "line\nbreak",
    "tab\tü☃",
    "ctl\x01\x1f",
    "\\",
]


def batch(n: int, seed: int) -> pa.RecordBatch:
    rnd = random.Random(seed)
    specials = [NAN, INF, -INF, 0.0, -0.0, 1e20, 1e-7, 3.0, 2.0**60, None]
    floats = [rnd.choice(specials) if rnd.random() < 0.3 else rnd.random() for _ in range(n)]
    runs = [float(i // 4) if i % 13 else None for i in range(n)]  # a long layout's time
    steps = [i // 4 for i in range(n)]
    const = ["proj/run ü"] * n
    strs = [rnd.choice([*STRINGS, None]) for _ in range(n)]
    unique = [f"u{i},{rnd.random()}" if i % 7 else None for i in range(n)]
    return pa.record_batch(
        {
            "const": pa.array(const, pa.string()),
            "rank": pa.array([3] * n, pa.int64()),
            "step": pa.array(steps, pa.int64()),
            "time": pa.array(runs, pa.float64()),
            "value": pa.array(floats, pa.float64()),
            'we"ird, name': pa.array(strs, pa.string()),
            "unique": pa.array(unique, pa.string()),
        }
    )


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("n", [1, 5, 17, 1000])
def test_jsonl_parses_back_with_the_json_module(n):
    b = batch(n, n)
    r = RowRenderer(b.schema, "jsonl")
    text = r.render(b).decode("utf-8")
    lines = text.split("\n")
    assert lines[-1] == "" and len(lines) == n + 1
    want = b.to_pylist()
    for line, row in zip(lines[:-1], want, strict=True):
        got = json.loads(line)  # accepts NaN / Infinity, as our own reader does
        assert list(got) == b.schema.names
        for k, v in row.items():
            assert same(got[k], v), (k, got[k], v)


@pytest.mark.parametrize("n", [1, 5, 17, 1000])
def test_csv_parses_back_with_the_csv_module(n):
    b = batch(n, 100 + n)
    r = RowRenderer(b.schema, "csv")
    text = (r.header() + r.render(b)).decode("utf-8")
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[0] == b.schema.names
    assert len(rows) == n + 1
    for got, row in zip(rows[1:], b.to_pylist(), strict=True):
        for (k, v), cell in zip(row.items(), got, strict=True):
            if v is None:
                assert cell == "", (k, cell)
            elif isinstance(v, float):
                assert cell in ("NaN", "inf", "-inf") or "." in cell or "e" in cell, cell
                parsed = float(cell)
                assert same(parsed, v), (k, cell, v)
            elif isinstance(v, int):
                assert cell == str(v)
            else:
                assert cell == v, (k, cell, v)


def test_empty_string_and_null_differ_in_csv():
    b = pa.record_batch({"s": pa.array(["", None, "x"], pa.string())})
    body = RowRenderer(b.schema, "csv").render(b).decode()
    assert body == '""\n\nx\n'


def test_header_names_are_quoted_when_needed():
    assert csv_field("a") == "a"
    assert csv_field('we"ird, x') == '"we""ird, x"'
    assert csv_field("") == '""'
