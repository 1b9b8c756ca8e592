"""et.history / HistoryStore queries: steps vs rows, the cache/disk boundary, step ranges on a
live store, snapshots, output types, stats, read_history and resolve_run_path."""

from __future__ import annotations

import json
import logging
import math
import sys

import pytest

import expr_tracker as et
from expr_tracker.history import HistoryStore, read_history, resolve_run_path
from expr_tracker.history import reader as reader_mod
from expr_tracker.history.reader import JsonlReader, meta_path_for
from expr_tracker.history.writer import JsonlWriter


def make_store(
    tmp_path,
    *,
    cache_rows=2_000_000,
    step_policy="monotonic",
    index_every=1000,
    buffer_size=50,
    name="metrics.jsonl",
    **kw,
):
    path = tmp_path / name
    w = JsonlWriter(
        path,
        meta_path=meta_path_for(path),
        async_write=False,
        buffer_size=buffer_size,
        interval=None,
        max_seconds=None,
        index_every=index_every,
        lock=False,
    )
    return HistoryStore(
        w, cache_rows=cache_rows, step_policy=step_policy, max_open_seconds=None, **kw
    )


def cold(store, n=None, step_range=None):
    """The same question asked of the file alone."""
    store.flush()
    r = JsonlReader(store.writer.path)
    return r.tail(n) if step_range is None else r.read_range(*step_range)


def steps(rows):
    return [r["_step"] for r in rows]


class NoDisk:
    """Fails the test if a JsonlReader is made (every disk read goes through one)."""

    def __init__(self, *a, **k):
        raise AssertionError("the query read the disk")


# --------------------------------------------------------------------------- tails


def test_n_counts_steps_not_rows_with_patch_lines(tmp_path):
    s = make_store(tmp_path)
    s.ingest({"a": 0})
    s.ingest({"a": 1}, commit=False)
    assert s.write_open_row()  # a timed-out open row: written, not committed
    s.ingest({"b": 1})  # -> patch line for step 1
    s.ingest({"a": 2})
    assert s.patch_rows == 1
    got = s.tail(2)
    assert [(r["_step"], r.get("a"), r.get("b")) for r in got] == [(1, 1, 1), (2, 2, None)]
    assert got == cold(s, 2)
    assert s.tail(1) == cold(s, 1)
    assert s.tail(None) == cold(s, None)


def test_include_open_and_a_written_open_row(tmp_path):
    s = make_store(tmp_path)
    s.ingest({"a": 0})
    s.ingest({"a": 1}, commit=False)
    assert steps(s.tail(5)) == [0, 1]
    assert steps(s.tail(5, include_open=False)) == [0]
    s.write_open_row()
    s.ingest({"b": 5}, commit=False)
    assert s.tail(5)[-1].items() >= {"a": 1, "b": 5, "_step": 1}.items()
    assert steps(s.tail(5, include_open=False)) == [0]
    assert steps(s.tail(1, include_open=False)) == [0]
    assert steps(s.step_range(0, 10, include_open=False)) == [0]
    assert s.step_range(1, 2)[0]["b"] == 5


def test_zero_disk_reads_while_the_window_is_cached(tmp_path, monkeypatch):
    s = make_store(tmp_path)
    for i in range(5000):
        s.ingest({"loss": i * 0.5, "acc": 0.1})
    from expr_tracker.history import storeread as store_mod  # tail/step_range

    monkeypatch.setattr(store_mod, "JsonlReader", NoDisk)
    monkeypatch.setattr(reader_mod, "JsonlReader", NoDisk)
    assert steps(s.tail(50)) == list(range(4950, 5000))
    assert steps(s.tail(50)) == list(range(4950, 5000))  # served by the decoded tail
    s.ingest({"loss": 1.0})
    assert steps(s.tail(50))[-1] == 5000
    assert steps(s.step_range(100, 110)) == list(range(100, 110))
    assert len(s.tail(-1)) == 5001
    st = s.stats()
    assert st["disk_queries"] == 0 and st["disk_bytes_read"] == 0
    assert st["queries"] == 5 and st["hit_rate"] == 1.0


def test_tail_across_the_eviction_boundary(tmp_path):
    s = make_store(tmp_path, cache_rows=100, index_every=10)
    for i in range(1000):
        s.ingest({"v": i})
    st = s.stats()
    assert st["evicted_rows"] > 0 and st["cached_rows"] <= 125
    assert steps(s.tail(300)) == list(range(700, 1000))
    assert s.tail(300) == cold(s, 300)
    assert s.stats()["disk_queries"] >= 1
    assert s.tail(None) == cold(s, None)


def test_step_range_on_a_live_store_uses_cache_and_index_not_a_scan(tmp_path):
    s = make_store(tmp_path, cache_rows=4096, index_every=100)
    n = 60_000
    for i in range(n):
        s.ingest({"loss": i % 13 * 0.5, "acc": 0.25})
    s.flush()
    size = s.writer.size
    before = s.stats()["disk_bytes_read"]
    got = s.step_range(12_345, 12_355)
    assert steps(got) == list(range(12_345, 12_355))
    read = s.stats()["disk_bytes_read"] - before
    assert 0 < read < size / 10  # the index found it: no full scan
    # entirely inside the cache: no disk at all
    dq = s.stats()["disk_queries"]
    assert steps(s.step_range(n - 100, n - 90)) == list(range(n - 100, n - 90))
    assert s.stats()["disk_queries"] == dq
    # straddling the boundary
    first = s.cache.first_step()
    got = s.step_range(first - 5, first + 5)
    assert steps(got) == list(range(first - 5, first + 5))
    assert got == cold(s, step_range=(first - 5, first + 5))


def test_step_range_is_end_exclusive_and_sorted_under_allow(tmp_path):
    s = make_store(tmp_path, step_policy="allow", cache_rows=8)
    for st in [0, 1, 2, 10, 11, 3, 4, 12, 5]:
        s.ingest({"v": st}, step=st, commit=True)
    got = s.step_range(2, 11)
    assert steps(got) == [2, 3, 4, 5, 10]
    assert got == cold(s, step_range=(2, 11))
    assert steps(s.tail(-1)) == [0, 1, 2, 3, 4, 5, 10, 11, 12]
    assert steps(s.tail(2)) == [12, 5]  # the most recently written, not the highest
    assert s.stats()["cache_sorted"] is False


def test_resume_prefix_is_read_from_disk(tmp_path):
    s = make_store(tmp_path)
    for i in range(100):
        s.ingest({"v": i})
    s.close()
    s2 = make_store(tmp_path)
    assert s2.disk_prefix_rows == 100
    s2.open_step = 100
    s2.ingest({"v": 100})
    assert steps(s2.tail(3)) == [98, 99, 100]
    assert s2.stats()["disk_queries"] == 1
    assert steps(s2.step_range(50, 52)) == [50, 51]
    assert steps(s2.step_range(100, 101)) == [100]


def test_results_are_snapshots(tmp_path):
    s = make_store(tmp_path)
    for i in range(10):
        s.ingest({"v": i, "nested": [i, {"k": i}]} if i == 9 else {"v": i})
    a = s.tail(3)
    a[0]["v"] = "changed"
    a[-1]["nested"][1]["k"] = "changed"
    a.append({"junk": 1})
    b = s.tail(3)
    assert [r["v"] for r in b] == [7, 8, 9] and b[-1]["nested"] == [9, {"k": 9}]
    s.ingest({"v": 10})
    assert [r["v"] for r in b] == [7, 8, 9]
    c = s.step_range(7, 9)
    c[0]["v"] = None
    assert s.step_range(7, 9)[0]["v"] == 7


# --------------------------------------------------------------------------- et.history


def start(tmp_path, **kw):
    kw.setdefault("dir", str(tmp_path / "runs"))
    return et.init(project="proj", name="r1", **kw)


def test_history_api_shapes(tmp_path):
    start(tmp_path)
    et.log({"loss": 1.0, "acc": 0.1})
    et.log({"loss": 0.5})
    et.log({"other": float("nan")})
    et.log({"acc": 0.3}, commit=False)
    rows = et.history(10)
    assert steps(rows) == [0, 1, 2, 3]
    assert et.history(10, output_type="dicts") == rows
    assert steps(et.history(10, include_open=False)) == [0, 1, 2]
    assert et.history(2, metrics="loss", include_meta=False) == [{}, {}]
    assert et.history(10, metrics=["loss"], dropna=True, include_meta=False) == [
        {"loss": 1.0},
        {"loss": 0.5},
    ]
    filled = et.history(2, metrics=["loss", "acc"], fill_missing=True)
    assert filled[0]["loss"] is None and filled[1] == {"_step": 3, "loss": None, "acc": 0.3}
    assert "_time" in et.history(1, include_open=False)[0]
    assert steps(et.history(-1)) == steps(et.history(None)) == [0, 1, 2, 3]
    assert steps(et.history(n=2, step_range=(0, 3))) == [1, 2]
    assert steps(et.history(step_range="1:")) == [1, 2, 3]
    assert math.isnan(et.history(step_range=(2, 3))[0]["other"])
    with pytest.raises(ValueError, match="output_type"):
        et.history(output_type="frame")
    with pytest.raises(ValueError, match="step_range"):
        et.history(step_range="12")


def test_pandas_and_polars_outputs(tmp_path):
    start(tmp_path)
    for i in range(5):
        et.log({"loss": 1.0 / (i + 1), "epoch": i})
    et.log({"note": "done"})
    df = et.history(10, output_type="pandas")
    assert list(df.columns)[:2] == ["_step", "_time"]
    assert list(df["_step"]) == [0, 1, 2, 3, 4, 5]
    assert et.history(10, output_type="pd", metrics=["loss"]).shape == (6, 3)
    pl_df = et.history(10, output_type="polars", include_meta=False)
    assert pl_df.columns == ["loss", "epoch", "note"]
    assert pl_df.height == 6
    empty = et.history(10, output_type="pandas", step_range=(100, 200), metrics=["loss"])
    assert list(empty.columns) == ["loss"] and len(empty) == 0


def test_missing_pandas_names_the_extra(tmp_path, monkeypatch):
    start(tmp_path)
    et.log({"a": 1})
    monkeypatch.setitem(sys.modules, "pandas", None)
    monkeypatch.setitem(sys.modules, "polars", None)
    with pytest.raises(ImportError, match=r"expr-tracker\[pandas\]"):
        et.history(output_type="pandas")
    with pytest.raises(ImportError, match=r"expr-tracker\[polars\]"):
        et.history(output_type="polars")


def test_info_reports_cache_and_queries(tmp_path):
    start(tmp_path, cache_rows=1000)
    for i in range(3000):
        et.log({"a": i})
    et.log({"a": 1}, step=5)  # dropped: backward under monotonic
    et.history(10)
    et.history(2500)
    h = et.info()["history"]
    for key in (
        "rows_logged",
        "rows_on_disk",
        "cached_rows",
        "cached_bytes",
        "cache_limit_bytes",
        "cache_limit_rows",
        "evicted_rows",
        "queries",
        "disk_queries",
        "hit_rate",
        "dropped",
    ):
        assert key in h
    assert h["rows_logged"] == 3000 and h["evicted_rows"] > 0
    assert h["queries"] == 2 and h["disk_queries"] == 1 and h["hit_rate"] == 0.5
    assert h["dropped"] == {"backward_step": 1} and h["dropped_rows"] == 1


def test_offline_read_history_and_run_argument(tmp_path):
    run = start(tmp_path)
    for i in range(20):
        et.log({"x": i})
    run_dir = run.dir
    et.finish()
    assert steps(read_history(run_dir)) == list(range(20))
    assert steps(read_history(run_dir, 3)) == [17, 18, 19]
    assert steps(read_history(run_dir / "metrics.jsonl", step_range=(5, 7))) == [5, 6]
    assert steps(et.history(4, run=run_dir)) == [16, 17, 18, 19]
    df = read_history(run_dir, output_type="pandas", metrics="x")
    assert list(df["x"]) == list(range(20))


def test_resolve_run_path_exact_names_and_shards(tmp_path, caplog):
    d = tmp_path / "run"
    d.mkdir()
    for name in ("metrics.data.jsonl", "metrics.jsonl", "metrics.rank1.jsonl"):
        (d / name).write_text(json.dumps({"_step": 0, "f": name}) + "\n")
    with caplog.at_level(logging.INFO, logger="expr_tracker"):
        assert resolve_run_path(d) == d / "metrics.jsonl"
    assert "metrics.rank1.jsonl" in caplog.text and "reading metrics.jsonl" in caplog.text
    assert resolve_run_path(d, stream="data") == d / "metrics.data.jsonl"
    assert read_history(d)[0]["f"] == "metrics.jsonl"
    assert read_history(d, stream="data")[0]["f"] == "metrics.data.jsonl"
    with pytest.raises(FileNotFoundError, match="metrics.nope.jsonl"):
        read_history(d, stream="nope")
