"""The per-producer Parquet cache (expr_tracker.query.cache): contents, incremental refresh,
invalidation, compaction, location."""

from __future__ import annotations

import json
import math
import os
import struct

import pytest
from jsonl_model import long_metric_rows

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb")

from expr_tracker.query import cache as qcache  # noqa: E402
from expr_tracker.query.cache import CachedSource, refresh  # noqa: E402


@pytest.fixture(autouse=True)
def _xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def read_parts(c: CachedSource) -> list[dict]:
    if not c.parts:
        return []
    t = pa.concat_tables([pq.read_table(p) for p in c.parts])
    return t.to_pylist()


def expected_metric_rows(path) -> list[dict]:
    """The LONG rows a metrics JSONL should give (tests/jsonl_model.py)."""
    return long_metric_rows(path)


def same_rows(got: list[dict], want: list[dict]) -> None:
    """Equal, with NaN compared by its bits."""
    assert len(got) == len(want)

    def key(r):
        v = r["value"]
        return {**r, "value": None if v is None else struct.pack("<d", v)}

    assert [key(r) for r in got] == [key(r) for r in want]


def write(path, *rows, raw: bytes = b"", mode="ab"):
    with open(path, mode) as f:
        for r in rows:
            f.write(json.dumps(r).encode() + b"\n")
        f.write(raw)


def test_values_and_schema(tmp_path):
    src = tmp_path / "metrics.jsonl"
    write(
        src,
        {"a": 1.5, "b": 2, "c": True, "d": False, "_step": 0, "_time": 10.0},
        {"nan": math.nan, "inf": math.inf, "ninf": -math.inf, "_step": 1},
        {"s": "hi", "l": [1, math.nan], "o": {"x": 1}, "n": None, "_step": 2, "_time": 12.5},
        {"_step": 3, "_time": 13.0},
        {"big": 2**64 + 1, "exact": 2**53, "_step": 4},
        {"q\"'; DROP": 1.0, "ünï ☃": 2.0, "x" * 5000: 3.0, "_step": 5},
    )
    c = refresh(src, "metrics")
    schema = pq.read_schema(c.parts[0])
    assert [(f.name, str(f.type)) for f in schema] == [
        ("step", "int64"),
        ("time", "double"),
        ("metric", "string"),
        ("value", "double"),
        ("text", "string"),
        ("line", "int64"),
    ]
    rows = read_parts(c)
    by = {r["metric"]: r for r in rows}
    assert by["a"] == {
        "step": 0,
        "time": 10.0,
        "metric": "a",
        "value": 1.5,
        "text": None,
        "line": 0,
    }
    assert by["b"]["value"] == 2.0 and by["c"]["value"] == 1.0 and by["d"]["value"] == 0.0
    assert math.isnan(by["nan"]["value"]) and by["nan"]["time"] is None
    assert by["inf"]["value"] == math.inf and by["ninf"]["value"] == -math.inf
    assert by["s"]["value"] is None and by["s"]["text"] == "hi"
    assert by["l"]["text"] == "[1,NaN]" and by["o"]["text"] == '{"x":1}'
    assert by["n"]["text"] == "null" and by["n"]["value"] is None
    assert by["big"]["value"] == float(2**64 + 1) and by["big"]["text"] == str(2**64 + 1)
    assert by["exact"]["value"] == 2.0**53 and by["exact"]["text"] is None
    assert {"q\"'; DROP", "ünï ☃", "x" * 5000} <= set(by)
    assert 3 not in {r["line"] for r in rows}  # log({}) gives no row
    assert c.covered == src.stat().st_size and c.lines == 6 and c.rows == len(rows)
    assert c.merged is True
    same_rows(rows, expected_metric_rows(src))


def test_nan_bits_survive_duckdb(tmp_path):
    src = tmp_path / "metrics.jsonl"
    write(
        src, {"v": math.nan, "_step": 0}, {"v": math.inf, "_step": 1}, {"v": -math.inf, "_step": 2}
    )
    c = refresh(src, "metrics")
    got = duckdb.sql(
        f"select value from read_parquet({[str(p) for p in c.parts]}) order by line"
    ).fetchall()
    assert math.isnan(got[0][0]) and got[1][0] == math.inf and got[2][0] == -math.inf


def test_incremental_reads_only_appended_lines_and_ignores_torn_tail(tmp_path):
    src = tmp_path / "metrics.jsonl"
    write(src, {"a": 1.0, "_step": 0}, {"a": 2.0, "_step": 1})
    c1 = refresh(src, "metrics")
    assert c1.lines == 2 and len(c1.parts) == 1
    write(src, {"a": 3.0, "_step": 2}, raw=b'{"a": 4.0, "_st')  # torn tail
    c2 = refresh(src, "metrics")
    assert c2.lines == 3 and len(c2.parts) == 2 and c2.parts[0] == c1.parts[0]
    assert c2.covered == src.stat().st_size - len(b'{"a": 4.0, "_st')
    write(src, raw=b'ep": 3}\n')
    c3 = refresh(src, "metrics")
    rows = read_parts(c3)
    assert [(r["step"], r["value"], r["line"]) for r in rows] == [
        (0, 1.0, 0),
        (1, 2.0, 1),
        (2, 3.0, 2),
        (3, 4.0, 3),
    ]
    # unchanged file: same parts, no rewrite
    c4 = refresh(src, "metrics")
    assert c4 == c3


def test_patch_lines_clear_merged(tmp_path):
    src = tmp_path / "metrics.jsonl"
    write(src, {"a": 1.0, "_step": 0}, {"a": 2.0, "_step": 1})
    assert refresh(src, "metrics").merged
    write(src, {"b": 2.0, "_step": 1})
    assert refresh(src, "metrics").merged is False
    # out of order but unique: still merged
    src2 = tmp_path / "m2.jsonl"
    write(src2, {"a": 1.0, "_step": 5}, {"a": 2.0, "_step": 3}, {"a": 2.0, "_step": 4})
    assert refresh(src2, "metrics").merged is True
    write(src2, {"a": 2.0, "_step": 5})
    assert refresh(src2, "metrics").merged is False


def test_truncation_and_replacement_rebuild(tmp_path):
    src = tmp_path / "metrics.jsonl"
    write(src, *({"a": float(i), "_step": i} for i in range(10)))
    refresh(src, "metrics")
    # truncated below covered
    data = src.read_bytes()
    keep = b"\n".join(data.split(b"\n")[:4]) + b"\n"
    with open(src, "r+b") as f:
        f.truncate(len(keep))
    c = refresh(src, "metrics")
    assert c.lines == 4
    same_rows(read_parts(c), expected_metric_rows(src))
    # replaced (new inode), same size
    tmp = tmp_path / "new.jsonl"
    write(tmp, *({"a": float(-i), "_step": i} for i in range(4)))
    os.replace(tmp, src)
    c = refresh(src, "metrics")
    same_rows(read_parts(c), expected_metric_rows(src))
    # edited in place (same inode, same size): a covered byte changed
    data = src.read_bytes()
    assert b'"a": -1.0' in data
    with open(src, "r+b") as f:
        f.write(data.replace(b'"a": -1.0', b'"a": -7.0'))
    c = refresh(src, "metrics")
    assert [r["value"] for r in read_parts(c)][1] == -7.0


def test_spans_part(tmp_path):
    src = tmp_path / "spans.jsonl"
    write(
        src,
        {
            "_step": 0,
            "name": "fwd/inner",
            "depth": 1,
            "start": 1.5,
            "dur_ms": 0.25,
            "id": 2,
            "parent": 1,
            "pid": 7,
            "tid": 8,
            "thread": "Main",
        },
        {
            "name": "x",
            "depth": 0,
            "start": 2.0,
            "dur_ms": 1,
            "id": 3,
            "parent": None,
            "pid": 7,
            "tid": 8,
            "thread": "Main",
            "task": "Task-1",
            "error": "ValueError",
            "args": {"k": [1, 2]},
            "metrics": {"m": math.nan},
        },
    )
    c = refresh(src, "spans")
    assert c.merged is True and c.rows == 2
    schema = pq.read_schema(c.parts[0])
    assert [f.name for f in schema] == [
        "step",
        "name",
        "depth",
        "start",
        "dur_ms",
        "id",
        "parent",
        "pid",
        "tid",
        "thread",
        "task",
        "error",
        "args",
        "metrics",
        "line",
    ]
    assert str(schema.field("depth").type) == "int32"
    a, b = read_parts(c)
    assert a["step"] == 0 and a["name"] == "fwd/inner" and a["parent"] == 1 and a["args"] is None
    assert b["step"] is None and b["dur_ms"] == 1.0 and b["parent"] is None
    assert b["task"] == "Task-1" and b["error"] == "ValueError"
    assert b["args"] == '{"k":[1,2]}' and b["metrics"] == '{"m":NaN}' and b["line"] == 1


def test_bad_kind_and_missing_source(tmp_path):
    with pytest.raises(ValueError, match="kind='alerts'"):
        refresh(tmp_path / "x.jsonl", "alerts")
    with pytest.raises(FileNotFoundError):
        refresh(tmp_path / "missing.jsonl", "metrics")
    with pytest.raises(OSError, match="not a regular file"):
        refresh(tmp_path, "metrics")


def test_default_location_and_cache_dir(tmp_path):
    src = tmp_path / "run" / "metrics.jsonl"
    src.parent.mkdir()
    write(src, {"a": 1.0, "_step": 0})
    c = refresh(src, "metrics")
    assert c.cache_dir == src.parent / ".et-cache" / "metrics.jsonl"
    assert all(p.parent == c.cache_dir for p in c.parts)
    c2 = refresh(src, "metrics", cache_dir=tmp_path / "cc")
    assert c2.cache_dir.parent == tmp_path / "cc"
    assert read_parts(c2) == read_parts(c)


def test_empty_source(tmp_path):
    src = tmp_path / "metrics.jsonl"
    src.write_bytes(b"")
    c = refresh(src, "metrics")
    assert c.parts == () and c.rows == 0 and c.covered == 0 and c.lines == 0


def test_compaction_keeps_every_row(tmp_path, monkeypatch):
    src = tmp_path / "metrics.jsonl"
    seen_parts = set()
    for i in range(qcache.MAX_PARTS + 5):
        write(src, {"a": float(i), "_step": i})
        c = refresh(src, "metrics")
        seen_parts.update(c.parts)
        assert len(c.parts) <= qcache.MAX_PARTS
    same_rows(read_parts(c), expected_metric_rows(src))
    # replaced parts are kept for a grace period, then removed by a later refresh
    assert all(p.exists() for p in seen_parts)
    monkeypatch.setattr(qcache, "GRACE_S", 0.0)
    write(src, {"a": -1.0, "_step": 99})
    c = refresh(src, "metrics")
    left = {p.name for p in c.cache_dir.glob("part-*")}
    assert left == {p.name for p in c.parts}


def test_edits_of_first_or_last_covered_line_of_a_big_file_rebuild(tmp_path):
    src = tmp_path / "metrics.jsonl"
    write(src, *({"a": float(i), "_step": i} for i in range(5000)))
    assert src.stat().st_size > 16 * 4096
    c0 = refresh(src, "metrics")
    for old, new in ((b'"a": 0.0,', b'"a": 9.0,'), (b'"a": 4999.0,', b'"a": 4999.5,')):
        data = src.read_bytes()
        assert old in data
        src.write_bytes(data.replace(old, new))  # same inode
        c = refresh(src, "metrics")
        same_rows(read_parts(c), expected_metric_rows(src))
    # the parts of the first build are still there for a reader of the old manifest
    assert all(p.exists() for p in c0.parts)


def test_cache_dir_keys_each_source(tmp_path):
    a = tmp_path / "a" / "metrics.jsonl"
    b = tmp_path / "b" / "metrics.jsonl"
    for i, p in enumerate((a, b)):
        p.parent.mkdir()
        write(p, {"v": float(i), "_step": 0})
    ca = refresh(a, "metrics", cache_dir=tmp_path / "cc")
    cb = refresh(b, "metrics", cache_dir=tmp_path / "cc")
    assert ca.cache_dir != cb.cache_dir and ca.cache_dir.parent == cb.cache_dir.parent
    assert [r["value"] for r in read_parts(ca)] == [0.0]
    assert [r["value"] for r in read_parts(cb)] == [1.0]
    assert not (a.parent / ".et-cache").exists()


def test_merged_checked_exactly_across_row_groups_and_refreshes(tmp_path, monkeypatch):
    monkeypatch.setattr(qcache, "BLOCK_BYTES", 100)  # a row group every few lines
    src = tmp_path / "metrics.jsonl"
    steps = list(range(40))
    random_order = steps[20:] + steps[:20]  # out of order, each step once
    write(src, *({"a": float(s), "_step": s} for s in random_order))
    c = refresh(src, "metrics")
    assert pq.ParquetFile(c.parts[0]).num_row_groups > 3
    assert c.merged is True
    write(src, {"b": 1.0, "_step": 41}, {"_step": 5})  # a commit line only: no rows
    assert refresh(src, "metrics").merged is True
    write(src, {"b": 2.0, "_step": 3})  # step 3 again, with a row: a patch line
    assert refresh(src, "metrics").merged is False


def test_an_artifact_of_a_run_dir_leaves_its_query_cache_out(tmp_path):
    """``Artifact.add_dir(run_dir)`` after a query: the derived ``.et-cache/`` is not copied
    into the artifact (it is rebuilt from the JSONL; its parts would change every version)."""
    import expr_tracker as et
    from expr_tracker.query.cache import refresh

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"loss":1.0,"_step":0,"_time":1.0}\n')
    refresh(run / "metrics.jsonl", "metrics")
    assert (run / ".et-cache").is_dir()
    names = sorted(et.Artifact("run-files", type="run").add_dir(run).files)
    assert names == ["metrics.jsonl"]


def test_a_line_longer_than_many_blocks_is_gathered_in_linear_time(tmp_path):
    """Each block was appended to what had been read of a long line so far, copying it
    again per block: quadratic in the line's length (with 64-byte blocks, a 4 MB line
    took hours; with the real 4 MiB blocks a 1 GB line added minutes)."""
    import subprocess
    import sys

    from helpers import ROOT

    src = tmp_path / "metrics.jsonl"
    with open(src, "w") as f:
        f.write(json.dumps({"loss": 1.0, "_step": 0}) + "\n")
        f.write(json.dumps({"loss": 2.0, "_step": 1, "big": "x" * (4 << 20)}) + "\n")
        f.write(json.dumps({"loss": 3.0, "_step": 2}) + "\n")
    code = (
        "import sys\n"
        "from expr_tracker.query import cache\n"
        "cache.BLOCK_BYTES = 64\n"
        "c = cache.refresh(sys.argv[1], 'metrics', cache_dir=sys.argv[2])\n"
        "print(c.lines, c.covered)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(src), str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["3", str(src.stat().st_size)]
