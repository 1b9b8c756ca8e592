"""JsonlReader: tails with a spare step, step ranges through the sidecar index, and files the
reader did not write (no sidecar, stale sidecar, stray writers, patch lines, unsorted files,
torn last lines, NaN/Infinity)."""

from __future__ import annotations

import json
import math

import pytest

from expr_tracker.history.reader import JsonlReader, merge_by_step, meta_path_for, step_key
from expr_tracker.history.writer import JsonlWriter


def write_file(path, rows, *, index_every=None, sorted_=True, meta=True, extra=b""):
    """Write ``rows`` as lines directly (fast) and, with ``meta``, a matching sidecar."""
    index = []
    off = 0
    chunks = []
    for i, r in enumerate(rows):
        line = (json.dumps(r, separators=(",", ":")) + "\n").encode()
        if index_every and i % index_every == 0:
            index.append([r["_step"], i, off])
        chunks.append(line)
        off += len(line)
    path.write_bytes(b"".join(chunks) + extra)
    if meta:
        steps = [r["_step"] for r in rows]
        meta_path_for(path).write_text(
            json.dumps(
                {
                    "schema": 2,
                    "size": off,
                    "lines": len(rows),
                    "last_step": steps[-1] if steps else None,
                    "max_step": max(steps) if steps else None,
                    "sorted": sorted_,
                    "has_duplicate_steps": len(set(steps)) != len(steps),
                    "index": index,
                }
            )
        )
    return off


def brute_range(rows, lo, hi):
    """What an exact by-step range read must return: merged, in step order."""
    out = merge_by_step(r for r in rows if lo <= r["_step"] < hi)
    out.sort(key=step_key)
    return out


def rows_of(steps, **extra):
    return [{"a": float(s), "_step": s, "_time": 1000.0 + i, **extra} for i, s in enumerate(steps)]


# --------------------------------------------------------------------------- ranges


@pytest.mark.parametrize("lo,hi", [(0, 10), (37, 38), (250, 260), (990, 2000), (-5, 3), (500, 500)])
def test_range_with_sidecar_is_exact_and_indexed(tmp_path, lo, hi):
    path = tmp_path / "metrics.jsonl"
    rows = rows_of(range(1000))
    write_file(path, rows, index_every=50)
    r = JsonlReader(path)
    assert r.read_range(lo, hi) == brute_range(rows, lo, hi)
    assert r.full_scans == 0


@pytest.mark.slow
def test_range_reads_only_the_range_not_the_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = rows_of(range(200_000))
    size = write_file(path, rows, index_every=1000)
    r = JsonlReader(path)
    got = r.read_range(150_000, 150_010)
    assert [x["_step"] for x in got] == list(range(150_000, 150_010))
    assert r.index_lookups == 1 and r.full_scans == 0
    assert r.bytes_read < size / 10


def test_patch_line_just_before_an_anchor_is_not_lost(tmp_path):
    # step 10 occupies lines 9 and 10; the anchor (every 5 lines) sits on line 10
    steps = list(range(10)) + [10, 10] + list(range(11, 30))
    rows = rows_of(steps)
    rows[10] = {"a": 1.0, "_step": 10, "_time": 1.0}
    rows[11] = {"b": 2.0, "_step": 10, "_time": 2.0}
    path = tmp_path / "metrics.jsonl"
    write_file(path, rows, index_every=5)
    r = JsonlReader(path)
    assert r.read_range(10, 11) == [{"a": 1.0, "b": 2.0, "_step": 10, "_time": 2.0}]
    assert r.read_range(8, 12) == brute_range(rows, 8, 12)


def test_no_sidecar_full_scan_is_exact(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = rows_of(range(300))
    write_file(path, rows, meta=False)
    r = JsonlReader(path)
    assert r.read_range(100, 110) == brute_range(rows, 100, 110)
    assert r.full_scans == 1


def test_unsorted_allow_file_is_exact_by_step(tmp_path):
    steps = [0, 1, 2, 5, 6, 3, 4, 7, 3, 8, 1]
    rows = rows_of(steps)
    path = tmp_path / "metrics.jsonl"
    write_file(path, rows, index_every=2, sorted_=False)
    r = JsonlReader(path)
    got = r.read_range(1, 5)
    assert got == brute_range(rows, 1, 5)
    assert [x["_step"] for x in got] == [1, 2, 3, 4]
    assert r.full_scans == 1
    assert [x["_step"] for x in r.tail(-1)] == sorted(set(steps))
    # tail(n) is the most recently *written* steps (docs/history.md "Steps, not lines")
    assert {x["_step"] for x in r.tail(3)} == {3, 8, 1}


def test_stale_sidecar_suffix_is_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = rows_of(range(200))
    write_file(path, rows[:150], index_every=10)  # the sidecar describes 150 rows
    with open(path, "ab") as f:
        for row in rows[150:]:
            f.write((json.dumps(row) + "\n").encode())
    r = JsonlReader(path)
    assert r.read_range(140, 160) == brute_range(rows, 140, 160)
    assert r.read_range(180, 1000) == brute_range(rows, 180, 1000)
    assert r.full_scans == 0


def test_stray_writer_after_the_sidecar_can_go_backwards(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = rows_of(range(100))
    write_file(path, rows, index_every=10)
    stray = [{"x": 1, "_step": 5}, {"x": 2, "_step": 200}, {"y": 3, "_step": 50}]
    with open(path, "ab") as f:
        f.write(b"not json at all\n")
        for row in stray:
            f.write((json.dumps(row) + "\n").encode())
    r = JsonlReader(path)
    assert r.read_range(0, 1000) == brute_range(rows + stray, 0, 1000)
    r = JsonlReader(path)
    assert r.read_range(5, 6)[0]["x"] == 1
    assert r.skipped == 1


def test_sidecar_of_another_file_is_ignored(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_file(path, rows_of(range(1000)), index_every=10)
    meta = meta_path_for(path).read_text()
    rows = rows_of(range(0, 100, 3))  # the file was replaced by a shorter one
    write_file(path, rows, meta=False)
    meta_path_for(path).write_text(meta)
    r = JsonlReader(path)
    assert r.read_range(30, 60) == brute_range(rows, 30, 60)


def test_wrong_anchors_are_not_trusted(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = rows_of(range(500))
    write_file(path, rows, index_every=10)
    mp = meta_path_for(path)
    meta = json.loads(mp.read_text())
    meta["index"] = [[s, ln, off + 7] for s, ln, off in meta["index"]]  # mid-line offsets
    mp.write_text(json.dumps(meta))
    r = JsonlReader(path)
    assert r.read_range(300, 305) == brute_range(rows, 300, 305)


def test_torn_last_line_is_never_returned(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = rows_of(range(20))
    write_file(path, rows, index_every=5, extra=b'{"a": 1.0, "_st')
    r = JsonlReader(path)
    assert [x["_step"] for x in r.tail(3)] == [17, 18, 19]
    assert r.read_range(15, 100) == brute_range(rows, 15, 100)
    assert len(r.tail_rows(100)) == 20


def test_nan_and_infinity_round_trip(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"loss": NaN, "_step": 0}\n{"loss": Infinity, "_step": 1}\n{"loss": -Infinity, "_step": 2}\n'
    )
    r = JsonlReader(path)
    got = [x["loss"] for x in r.read_range(0, 3)]
    assert math.isnan(got[0]) and got[1] == math.inf and got[2] == -math.inf
    assert math.isnan(r.tail(3)[0]["loss"])


# --------------------------------------------------------------------------- tails


def test_tail_counts_steps_and_merges_patch_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"a": 0, "_step": 0},
        {"a": 1, "_step": 1},
        {"a": 2, "_step": 2},
        {"b": 2, "_step": 2},  # patch line
        {"a": 3, "_step": 3},
        {"b": 3, "_step": 3},
    ]
    write_file(path, rows)
    r = JsonlReader(path)
    assert r.tail(2) == [{"a": 2, "b": 2, "_step": 2}, {"a": 3, "b": 3, "_step": 3}]
    assert len(r.tail_rows(2)) == 2  # physical rows
    assert [x["_step"] for x in r.tail(10)] == [0, 1, 2, 3]
    assert r.tail(0) == []


def test_writer_written_file_round_trip(tmp_path):
    path = tmp_path / "metrics.jsonl"
    w = JsonlWriter(path, meta_path=meta_path_for(path), async_write=False, index_every=7)
    for i in range(100):
        w.append(json.dumps({"v": i, "_step": i}).encode(), i)
    w.close()
    r = JsonlReader(path)
    assert r.sorted
    assert [x["v"] for x in r.read_range(40, 45)] == [40, 41, 42, 43, 44]
    assert r.full_scans == 0
    assert [x["v"] for x in r.tail(3)] == [97, 98, 99]


# --------------------------------------------------------------------------- 1M rows


def test_million_row_file_read_by_step_range_without_loading_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    n = 1_000_000
    index = []
    off = 0
    with open(path, "wb") as f:
        buf = []
        for i in range(n):
            line = b'{"loss":%d.5,"acc":0.25,"_step":%d,"_time":1700000000.5}\n' % (i % 977, i)
            if i % 1000 == 0:
                index.append([i, i, off])
            off += len(line)
            buf.append(line)
            if len(buf) == 50_000:
                f.write(b"".join(buf))
                buf = []
        f.write(b"".join(buf))
    meta = {"schema": 2, "size": off, "lines": n, "last_step": n - 1, "max_step": n - 1}
    meta.update(sorted=True, has_duplicate_steps=False, index=index)
    meta_path_for(path).write_text(json.dumps(meta))

    r = JsonlReader(path)
    got = r.read_range(987_654, 987_700)
    assert [x["_step"] for x in got] == list(range(987_654, 987_700))
    assert got[0]["loss"] == 987_654 % 977 + 0.5
    assert r.full_scans == 0
    assert r.bytes_read < 300_000 < off // 100  # a few blocks of a ~60 MB file

    t = JsonlReader(path)
    assert [x["_step"] for x in t.tail(50)] == list(range(n - 50, n))
    assert t.bytes_read <= 2 * 65536


def test_a_line_longer_than_many_blocks_is_read_back_in_linear_time(tmp_path):
    """Reading back from the end (tail: `et runs`, `et plot`, `et.history(n)`) put each
    block in front of what it had read of a long line so far, copying it again per block:
    a 300 MB line held `et runs` past 5 minutes. With blocks of 64 bytes, a 4 MB line took
    hours that way; gathered in pieces it takes well under a second."""
    import subprocess
    import sys

    from helpers import ROOT

    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps({"loss": 1.0, "_step": 0}) + "\n")
        f.write(json.dumps({"loss": 2.0, "_step": 1, "big": "x" * (4 << 20)}) + "\n")
        f.write(json.dumps({"loss": 3.0, "_step": 2}) + "\n")
    code = (
        "import sys\n"
        "from expr_tracker.history import reader\n"
        "reader.BLOCK = 64\n"
        "rows = reader.JsonlReader(sys.argv[1]).tail(10)\n"
        "print([(r['_step'], r['loss'], len(r.get('big', ''))) for r in rows])\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str([(0, 1.0, 0), (1, 2.0, 4 << 20), (2, 3.0, 0)])
