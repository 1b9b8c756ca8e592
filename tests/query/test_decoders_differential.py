"""The cache's block decoders agree with the line-by-line one, bit for bit, on valid data.

A block goes to polars' NDJSON reader when it is dense (every line the first line's keys,
numbers only), else to ``pyarrow.json``, else line by line: whatever path a block takes, its
rows must be those of :func:`expr_tracker.query.scan.decode_metrics` (orjson / json), which
is the reference. The table below names the cases where the readers differ (duplicate keys,
ints vs floats, big ints, -0.0, extremes, unicode and escaped keys, CRLF, missing and extra
keys); hypothesis adds random blocks."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expr_tracker.query import scan

pl = pytest.importorskip("polars")


@pytest.fixture(autouse=True)
def _polars_for_every_block(monkeypatch):
    """Small test blocks go to polars too (a real refresh uses it from 1 MiB)."""
    monkeypatch.setattr(scan, "POLARS_MIN_BYTES", 0)


def _rows(table):
    return [
        (
            r["line"],
            r["metric"],
            None if r["value"] is None else r["value"].hex(),
            r["text"],
            r["step"],
            None if r["time"] is None else r["time"].hex(),
        )
        for r in table.to_pylist()
    ]


def _reference(lines):
    table, steps = scan.decode_metrics(lines, 7)
    return sorted(_rows(table)), steps


def _decoded(chunk, monkeypatch=None, polars=True):
    if not polars:
        assert monkeypatch is not None
        monkeypatch.setattr(scan, "_polars_dense", lambda *a: None)
    table, steps = scan.decode_metrics_block(chunk, 7, scan.BadLines())
    assert table.schema == scan.schema("metrics")
    return sorted(_rows(table)), steps.to_pylist()


def _took_polars(chunk):
    n = chunk.count(b"\n")
    return scan._polars_dense(chunk, 7, n) is not None


# (name, lines, whether polars takes the block)
CASES = [
    (
        "floats",
        [b'{"a":0.5,"b":-1.25,"_step":0,"_time":1.5}', b'{"a":1e-5,"b":3.0,"_step":1,"_time":2.5}'],
        True,
    ),
    (
        "ints and floats in one column",
        [b'{"a":1,"_step":0}', b'{"a":2.5,"_step":1}', b'{"a":-3,"_step":2}'],
        True,
    ),
    ("ints only", [b'{"a":1,"b":2,"_step":0}', b'{"a":3,"b":4,"_step":1}'], True),
    (
        "2**53 exactly",
        [b'{"a":9007199254740992,"_step":0}', b'{"a":-9007199254740992,"_step":1}'],
        False,
    ),
    (
        "below 2**53",
        [b'{"a":9007199254740991,"_step":0}', b'{"a":-9007199254740991.0,"_step":1}'],
        True,
    ),
    ("2**53+1 (kept as text)", [b'{"a":9007199254740993,"_step":0}'], False),
    ("2**53+1 after a NaN", [b'{"a":NaN,"_step":0}', b'{"a":9007199254740993,"_step":0}'], False),
    ("int64 max", [b'{"a":9223372036854775807,"_step":0}'], False),
    ("beyond int64", [b'{"a":18446744073709551616,"_step":0}'], False),
    ("beyond 64 bits", [b'{"a":123456789012345678901234567890,"_step":0}'], False),
    ("a float beyond 2**53", [b'{"a":1e300,"_step":0}', b'{"a":2.5,"_step":1}'], False),
    ("-0.0", [b'{"a":-0.0,"_step":0}', b'{"a":0.0,"_step":1}', b'{"a":-0.0,"_step":2}'], True),
    ("-0 as an int", [b'{"a":-0,"_step":0}', b'{"a":-0,"_step":1}'], True),
    (
        "extremes",
        [
            b'{"a":1e308,"b":5e-324,"_step":0}',
            b'{"a":-1.7976931348623157e308,"b":2.2250738585072014e-308,"_step":1}',
        ],
        False,
    ),
    (
        "long decimals",
        [
            b'{"a":0.1000000000000000055511151231257827,"_step":0}',
            b'{"a":3.141592653589793238462643383279,"_step":1}',
        ],
        True,
    ),
    (
        "unicode keys",
        [
            '{"ünï/☃":1.5,"日本":2,"😀":3.25,"_step":0}'.encode(),
            '{"ünï/☃":2.5,"日本":3,"😀":4.25,"_step":1}'.encode(),
        ],
        True,
    ),
    ("DEL in a key", [b'{"a\x7f":1.5,"_step":0}'], True),
    ("escaped keys", [b'{"new\\nline":1.5,"q\\"x":2,"tab\\t\\\\":3,"\\u00e9":4,"_step":0}'], False),
    (
        "an escaped key equal to a plain one",
        [b'{"\\u0061":1.5,"_step":0}', b'{"a":2.5,"_step":1}'],
        False,
    ),
    ("a key given twice", [b'{"a":1,"_step":0}', b'{"a":2,"a":3,"_step":1}'], False),
    (
        "a key given twice in the first line",
        [b'{"a":1,"a":2,"_step":0}', b'{"a":2,"_step":1}'],
        False,
    ),
    ("a key only in a later line", [b'{"a":1,"_step":0}', b'{"a":2,"b":3,"_step":1}'], False),
    ("a key missing from a later line", [b'{"a":1,"b":1,"_step":0}', b'{"a":2,"_step":1}'], False),
    ("keys in another order", [b'{"a":1,"b":2,"_step":0}', b'{"_step":1,"b":3,"a":4}'], True),
    ("no _time", [b'{"a":1.5,"_step":0}', b'{"a":2.5,"_step":1}'], True),
    (
        "_time in some lines",
        [
            b'{"a":1.5,"_step":0,"_time":5}',
            b'{"a":2.5,"_step":1}',
            b'{"a":3.5,"_step":2,"_time":7.25}',
        ],
        True,
    ),
    (
        "_time only in a later line",
        [b'{"a":1.5,"_step":0}', b'{"a":2.5,"_step":1,"_time":7.25}'],
        False,
    ),
    ("_time null", [b'{"a":1.5,"_step":0,"_time":5}', b'{"a":2.5,"_step":1,"_time":null}'], False),
    ("_time a string", [b'{"a":1.5,"_step":0,"_time":"x"}'], False),
    ("another _ field", [b'{"a":1.5,"_step":0,"_x":3}', b'{"a":2.5,"_step":1,"_x":4.5}'], True),
    ("a string _ field", [b'{"a":1.5,"_step":0,"_run":"x"}'], False),
    ("a string value later", [b'{"a":1,"_step":0}', b'{"a":"1","_step":1}'], False),
    ("a bool value later", [b'{"a":1,"_step":0}', b'{"a":true,"_step":1}'], False),
    ("a bool value first", [b'{"a":false,"_step":0}', b'{"a":1,"_step":1}'], False),
    ("null value", [b'{"a":1,"_step":0}', b'{"a":null,"_step":1}'], False),
    (
        "NaN and Infinity",
        [b'{"a":NaN,"_step":0}', b'{"a":Infinity,"_step":1}', b'{"a":-Infinity,"_step":2}'],
        False,
    ),
    ("NaN later", [b'{"a":1.5,"_step":0}', b'{"a":NaN,"_step":1}'], False),
    ("_step a float", [b'{"a":1,"_step":0}', b'{"a":2,"_step":1.5}'], False),
    ("_step 1e3", [b'{"a":1,"_step":0}', b'{"a":2,"_step":1e3}'], False),
    ("_step beyond int64", [b'{"a":1,"_step":0}', b'{"a":2,"_step":9223372036854775808}'], False),
    ("_step missing later", [b'{"a":1,"_step":0}', b'{"a":2}'], False),
    (
        "_step out of order",
        [b'{"a":1,"_step":5}', b'{"a":2,"_step":3}', b'{"a":3,"_step":5}'],
        True,
    ),
    # a negative _step is no step (NULL, as et.history skips the line): line by line
    ("_step negative", [b'{"a":1,"_step":5}', b'{"a":2,"_step":-3}', b'{"a":3,"_step":5}'], False),
    ("_step -2**63", [b'{"a":1,"_step":0}', b'{"a":2,"_step":-9223372036854775808}'], False),
    ("CRLF", [b'{"a":1.5,"_step":0}\r', b'{"a":2.5,"_step":1}\r'], True),
    ("whitespace", [b'{ "a" : 1.5 , "_step" : 0 }  ', b'{"a":\t2.5,"_step":1}'], True),
    ("only _ keys", [b'{"_step":0,"_time":1.5}', b'{"_step":1,"_time":2.5}'], False),
    ("nested", [b'{"a":1,"_step":0}', b'{"a":{"b":1},"_step":1}'], False),
    ("a list", [b'{"a":1,"_step":0}', b'{"a":[1,2],"_step":1}'], False),
    ("trailing garbage", [b'{"a":1,"_step":0}', b'{"a":2,"_step":1} x'], False),
    ("two objects on a line", [b'{"a":1,"_step":0}', b'{"a":2,"_step":1}{"a":3,"_step":2}'], False),
    ("a trailing comma", [b'{"a":1,"_step":0}', b'{"a":2,"_step":1,}'], False),
    ("a number beyond double", [b'{"a":1,"_step":0}', b'{"a":1e400,"_step":1}'], False),
    ("leading zero", [b'{"a":1,"_step":0}', b'{"a":01,"_step":1}'], False),
    ("a raw tab in a key", [b'{"a\tb":1,"_step":0}'], False),
    ("invalid UTF-8 in a key", [b'{"a\xff":1,"_step":0}'], False),
    ("a lone surrogate key", [b'{"\\ud800":1,"_step":0}'], False),
    ("a blank line", [b'{"a":1,"_step":0}', b"", b'{"a":2,"_step":1}'], False),
    ("not an object", [b'{"a":1,"_step":0}', b"[1,2]"], False),
    ("a truncated line", [b'{"a":1,"_step":0}', b'{"a":2,"_st'], False),
]


@pytest.mark.parametrize(("name", "lines", "polars"), CASES, ids=[c[0] for c in CASES])
def test_block_decoders_agree_with_the_reference(name, lines, polars, monkeypatch):
    chunk = b"\n".join(lines) + b"\n"
    assert _took_polars(chunk) is polars
    want, want_steps = _reference(lines)
    assert _decoded(chunk) == (want, want_steps)
    if name != "-0 as an int":  # pyarrow.json reads an int -0 in a column of doubles as -0.0
        assert _decoded(chunk, monkeypatch, polars=False) == (want, want_steps)


def test_dense_blocks_of_every_size_take_polars():
    lines = [
        json.dumps({"loss": 1 / (i + 1), "acc": i % 7, "_step": i, "_time": 1.7e9 + i}).encode()
        for i in range(5000)
    ]
    chunk = b"\n".join(lines) + b"\n"
    assert _took_polars(chunk)
    assert _decoded(chunk) == _reference(lines)


_keys = st.one_of(
    st.sampled_from(["loss", "acc", "lr", "a.b", "ünï/☃", "日本", "q'x", "acc[0]", "{x}"]),
    st.text(min_size=0, max_size=6),
)
_numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.integers(),
    st.sampled_from([-0.0, 0.0, 1e308, -1e308, 5e-324, 2**53 + 1, 2**63 - 1, 2**64]),
)
_values = st.one_of(_numbers, st.booleans(), st.text(max_size=4), st.just(math.nan))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    keys=st.lists(_keys, min_size=1, max_size=5, unique=True),
    rows=st.integers(1, 30),
    data=st.data(),
    dense=st.booleans(),
    ascii_only=st.booleans(),
)
def test_random_blocks_agree(keys, rows, data, dense, ascii_only):
    lines = []
    for i in range(rows):
        row = {}
        for k in keys:
            if k[:1] == "_":
                continue
            if dense:
                row[k] = data.draw(_numbers)
            elif data.draw(st.booleans()):
                row[k] = data.draw(_values)
        row["_step"] = data.draw(st.integers(-5, 10**6)) if not dense else i
        if data.draw(st.booleans()):
            row["_time"] = data.draw(st.one_of(st.floats(0, 2e9), st.integers(0, 2**40)))
        lines.append(json.dumps(row, ensure_ascii=ascii_only, separators=(",", ":")).encode())
    chunk = b"\n".join(lines) + b"\n"
    assert _decoded(chunk) == _reference(lines)
