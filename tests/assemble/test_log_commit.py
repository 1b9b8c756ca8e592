"""The write path: the commit table (docs/logging.md), step policy, reserved names."""

from __future__ import annotations

import json
import logging
import math
import threading

import pytest

import expr_tracker as et
from expr_tracker.history.reader import read_rows
from expr_tracker.history.store import HistoryStore
from expr_tracker.spans.core import AGGREGATION


def start(run_dir, **kw):
    return et.init(project="proj", name="r1", dir=str(run_dir.parent.parent), **kw)


def disk(run_dir):
    return read_rows(run_dir / "metrics.jsonl")


def strip_time(rows):
    return [{k: v for k, v in r.items() if k != "_time"} for r in rows]


# ---------------------------------------------------------------- every row of the table


def test_log_commits_and_advances(run_dir):
    start(run_dir)
    assert et.log({"a": 1}) == 0
    assert et.log({"a": 2}) == 1
    et.finish()
    assert strip_time(disk(run_dir)) == [{"a": 1, "_step": 0}, {"a": 2, "_step": 1}]


def test_commit_false_merges_only(run_dir):
    start(run_dir)
    et.log({"a": 1}, commit=False)
    et.log({"b": 2}, commit=False)
    assert et.history(5, include_open=False) == []
    assert strip_time(et.history(5)) == [{"a": 1, "b": 2, "_step": 0}]
    et.log({"c": 3})
    et.finish()
    assert strip_time(disk(run_dir)) == [{"a": 1, "b": 2, "c": 3, "_step": 0}]


def test_step_ahead_commits_old_row_and_opens_new(run_dir):
    start(run_dir)
    et.log({"a": 1}, step=3)
    assert et.history(5, include_open=False) == []  # step=N defaults to commit=False
    et.log({"a": 2}, step=7)
    assert strip_time(et.history(5, include_open=False)) == [{"a": 1, "_step": 3}]
    et.finish()
    assert [r["_step"] for r in disk(run_dir)] == [3, 7]


def test_same_step_merges(run_dir):
    start(run_dir)
    et.log({"a": 1}, step=4)
    et.log({"b": 2}, step=4)
    et.finish()
    assert strip_time(disk(run_dir)) == [{"a": 1, "b": 2, "_step": 4}]


def test_step_with_commit_true_commits_that_step(run_dir):
    start(run_dir)
    et.log({"a": 1}, step=4, commit=True)
    assert strip_time(et.history(5, include_open=False)) == [{"a": 1, "_step": 4}]
    assert et.log({"b": 1}) == 5


def test_stepless_log_after_explicit_step_merges_and_commits(run_dir):
    start(run_dir)
    et.log({"a": 1}, step=10)
    et.log({"b": 2})
    assert et.log({"c": 3}) == 11
    et.finish()
    assert strip_time(disk(run_dir)) == [
        {"a": 1, "b": 2, "_step": 10},
        {"c": 3, "_step": 11},
    ]


def test_backward_step_dropped_under_monotonic_warned_once_and_counted(run_dir, caplog):
    start(run_dir)
    et.log({"a": 1}, step=5, commit=True)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        assert et.log({"a": 0}, step=2) == -1
        assert et.log({"a": 0}, step=3) == -1
    assert sum("behind the current step" in r.message for r in caplog.records) == 1
    assert et.info()["history"]["dropped"]["backward_step"] == 2
    et.finish()
    assert [r["_step"] for r in disk(run_dir)] == [5]


def test_backward_step_accepted_under_allow(run_dir):
    start(run_dir, step_policy="allow")
    et.log({"a": 1}, step=5, commit=True)
    et.log({"a": 0}, step=2, commit=True)
    et.finish()
    assert [r["_step"] for r in disk(run_dir)] == [5, 2]
    meta = json.loads((run_dir / "metrics.meta.json").read_text())
    assert meta["sorted"] is False
    assert meta["max_step"] == 5


def test_empty_log_commits_a_meta_only_row(run_dir):
    start(run_dir)
    et.log({})
    et.finish()
    rows = disk(run_dir)
    assert len(rows) == 1 and set(rows[0]) == {"_step", "_time"}


def test_open_step_without_data_is_not_committed_on_advance(run_dir):
    start(run_dir)
    et.log({}, step=3)
    et.log({"a": 1}, step=5, commit=True)
    et.finish()
    assert [r["_step"] for r in disk(run_dir)] == [5]


def test_finish_commits_open_row_and_is_idempotent(run_dir):
    start(run_dir)
    et.log({"a": 1}, commit=False)
    et.finish()
    et.finish()
    assert strip_time(disk(run_dir)) == [{"a": 1, "_step": 0}]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"


# ---------------------------------------------------------------- values and names


def test_last_wins_warned_once_per_key(run_dir, caplog):
    start(run_dir)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        et.log({"a": 1}, commit=False)
        et.log({"a": 2}, commit=False)
        et.log({"a": 3})
        et.log({"a": 4}, commit=False)
        et.log({"a": 5})
    assert sum("logged twice" in r.message for r in caplog.records) == 1
    et.finish()
    assert [r["a"] for r in disk(run_dir)] == [3, 5]


def test_reserved_names_dropped(run_dir, caplog):
    start(run_dir)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        et.log({"_step": 99, "_time": 1.0, "a": 1})
    et.finish()
    rows = disk(run_dir)
    assert rows[0]["_step"] == 0 and rows[0]["_time"] != 1.0 and rows[0]["a"] == 1
    assert any("reserved" in r.message for r in caplog.records)


def test_nonfinite_written_as_python_json(run_dir):
    start(run_dir)
    et.log({"nan": float("nan"), "inf": float("inf"), "ninf": float("-inf"), "ok": 1.5})
    et.finish()
    text = (run_dir / "metrics.jsonl").read_text()
    assert '"nan":NaN' in text and '"inf":Infinity' in text and '"ninf":-Infinity' in text
    row = disk(run_dir)[0]
    assert math.isnan(row["nan"]) and row["inf"] == math.inf and row["ok"] == 1.5


@pytest.mark.parametrize(
    "name", ["train/loss", "eval.acc", "acc@16", "m[0]", "λ/损失", "a b", "x{y}", "'q'"]
)
def test_metric_names_stored_byte_identical(run_dir, name):
    start(run_dir)
    et.log({name: 1})
    et.finish()
    raw = (run_dir / "metrics.jsonl").read_bytes()
    assert json.dumps(name, ensure_ascii=False).encode() in raw
    assert name in disk(run_dir)[0]


def test_empty_key_dropped_non_string_key_converted(run_dir):
    start(run_dir)
    et.log({"": 1, 3: 2, "ok": 3})
    et.finish()
    row = disk(run_dir)[0]
    assert "" not in row and row["3"] == 2 and row["ok"] == 3
    assert et.read_history(run_dir)[0]["ok"] == 3


def test_string_subclass_keys_are_written_under_their_name(run_dir):
    """A NumPy string (``dict(zip(np.array(names), values))``) or a ``StrEnum`` member as a
    key is the metric of that name, never dropped as if reserved."""
    import enum

    np = pytest.importorskip("numpy")

    class Key(str, enum.Enum):
        LOSS = "loss"

    start(run_dir)
    assert et.log({np.str_("acc"): 0.5, Key.LOSS: 1.5, np.str_("_step"): 9}) == 0
    assert et.info()["history"]["dropped"] == {"reserved_key": 1}
    et.finish()
    row = disk(run_dir)[0]
    assert row["acc"] == 0.5 and row["loss"] == 1.5 and row["_step"] == 0
    assert set(row) == {"acc", "loss", "_step", "_time"}


def test_numpy_and_torch_steps_are_steps(run_dir):
    """Integer-valued NumPy and torch scalars are steps (a loop over ``np.arange``); in a
    compiled build too, where ``int(step) == step`` gives NumPy's own bool type."""
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    start(run_dir)
    assert et.log({"k": 0}, step=np.int64(1), commit=True) == 1
    assert et.log({"k": 1}, step=np.uint8(2), commit=np.bool_(True)) == 2
    assert et.log({"k": 2}, step=np.float64(3.0), commit=True) == 3
    assert et.log({"k": 3}, step=torch.tensor(4), commit=True) == 4
    assert et.log({"k": 4}, step=np.float64(4.5)) == -1
    assert [r["k"] for r in et.history(3, include_open=np.bool_(True))] == [1, 2, 3]
    assert [r["_step"] for r in et.get_run().history.tail(np.int64(2), include_open=1)] == [3, 4]
    rows = et.get_run().history.step_range(np.int64(2), torch.tensor(4))
    assert [r["_step"] for r in rows] == [2, 3]
    et.finish()
    assert [r["_step"] for r in disk(run_dir)] == [1, 2, 3, 4]


def test_the_last_step_is_the_last_and_nothing_raises_after_it(run_dir):
    """Step 2**63-1 is accepted; the step after it cannot be stored (int64), so later
    ``log()`` calls are dropped with a warning instead of raising ``OverflowError`` into
    the loop, and the run still finishes with its rows."""
    start(run_dir)
    last = 2**63 - 1
    assert et.log({"a": 1.0}, step=last, commit=True) == last
    assert et.log({"a": 2.0}) == -1
    assert et.log({"a": 3.0}, commit=False) == -1
    assert et.log({"a": 4.0}, step=last) == -1  # behind the open step: a backward step
    assert et.info()["history"]["dropped"] == {"step_overflow": 2, "backward_step": 1}
    et.finish()
    assert strip_time(disk(run_dir)) == [{"a": 1.0, "_step": last}]


# ---------------------------------------------------------------- errors that do raise


def test_log_without_run_raises():
    with pytest.raises(et.NoActiveRunError, match="et.init"):
        et.log({"a": 1})


def test_log_non_mapping_raises(run_dir):
    start(run_dir)
    with pytest.raises(TypeError, match="mapping"):
        et.log([("a", 1)])


def test_init_twice_raises(run_dir):
    start(run_dir)
    with pytest.raises(et.RunAlreadyActiveError, match="finish"):
        et.init(project="proj", name="other", dir=str(run_dir.parent.parent))


def test_bad_step_is_dropped_not_raised(run_dir):
    start(run_dir)
    assert et.log({"a": 1}, step=-1) == -1
    assert et.log({"a": 1}, step="x") == -1
    assert et.log({"a": 1}, step=2.0, commit=True) == 2
    assert et.info()["history"]["dropped"]["bad_step"] == 2


# ---------------------------------------------------------------- threads


def test_threads_log_into_one_run(run_dir):
    start(run_dir)

    def worker(k):
        for i in range(500):
            et.log({f"t{k}": i})

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    et.finish()
    rows = disk(run_dir)
    assert [r["_step"] for r in rows] == list(range(2000))
    for k in range(4):
        assert sorted(r[f"t{k}"] for r in rows if f"t{k}" in r) == list(range(500))


def test_sinks_see_rows_in_commit_order_outside_the_lock():
    store = HistoryStore(None)
    seen = []

    def sink(row):
        # the store lock is free here: a sink may query the store
        seen.append((row["_step"], len(store.tail(1))))

    store.sinks.append(sink)
    for i in range(5):
        store.ingest({"a": i})
    assert [s for s, _ in seen] == [0, 1, 2, 3, 4]


def test_failing_sink_never_breaks_log():
    store = HistoryStore(None)

    def bad(row):
        raise RuntimeError("boom")

    store.sinks.append(bad)
    store.ingest({"a": 1})
    store.ingest({"a": 2})
    assert store.sink_errors == 2
    assert [r["a"] for r in store.tail(5)] == [1, 2]


# ---------------------------------------------------------------- span ingress


def test_ingest_span_aggregation_table():
    store = HistoryStore(None, aggregation=AGGREGATION)
    store.ingest_span({"time_ms/f": 2.0, "gpu_mem_peak_mb/f": 10.0, "cpu_percent/f": 100.0}, 2.0)
    store.ingest_span({"time_ms/f": 3.0, "gpu_mem_peak_mb/f": 5.0, "cpu_percent/f": 50.0}, 6.0)
    store.ingest_span({"custom/f": 1.0, "cpu_percent/f": 0.0}, 0.0)
    store.ingest_span({"custom/f": 2.0}, 1.0)
    row = store.open_row()
    assert row["time_ms/f"] == 5.0
    assert row["gpu_mem_peak_mb/f"] == 10.0
    assert row["cpu_percent/f"] == pytest.approx((100 * 2 + 50 * 6) / 8)
    assert row["custom/f"] == 3.0
    store.ingest({"x": 1})  # commits
    assert store.open_row() is None


def test_log_overwrite_resets_weighted_mean():
    store = HistoryStore(None, aggregation=AGGREGATION)
    store.ingest_span({"cpu_percent/f": 100.0}, 1.0)
    store.ingest({"cpu_percent/f": 7.0}, commit=False)
    store.ingest_span({"cpu_percent/f": 50.0}, 1.0)
    assert store.open_row()["cpu_percent/f"] == 50.0


def test_zero_duration_spans_keep_latest_value_when_all_zero():
    store = HistoryStore(None, aggregation=AGGREGATION)
    store.ingest_span({"gpu_percent/f": 10.0}, 0.0)
    store.ingest_span({"gpu_percent/f": 20.0}, 0.0)
    assert store.open_row()["gpu_percent/f"] == 20.0
    store.ingest_span({"gpu_percent/f": 40.0}, 2.0)
    store.ingest_span({"gpu_percent/f": 90.0}, 0.0)
    assert store.open_row()["gpu_percent/f"] == 40.0


def test_span_never_commits():
    store = HistoryStore(None)
    assert store.ingest_span({"time_ms/a": 1.0}, 1.0) == 0
    assert store.ingest_span({"time_ms/a": 1.0}, 1.0) == 0
    assert store.tail(5, include_open=False) == []
    store.ingest({})
    assert store.tail(5)[0]["time_ms/a"] == 2.0


def test_huge_step_and_non_bool_commit_are_dropped(run_dir):
    start(run_dir)
    assert et.log({"a": 1}, step=2**70) == -1
    assert et.log({"a": 1}, commit="no") == -1
    import numpy as np

    assert et.log({"a": 1}, commit=np.bool_(True)) == 0
    dropped = et.info()["history"]["dropped"]
    assert dropped["bad_step"] == 1 and dropped["bad_commit"] == 1


def test_small_byte_budget_evicts_without_flushing_every_commit(tmp_path):
    from expr_tracker.history.writer import JsonlWriter

    writer = JsonlWriter(tmp_path / "m.jsonl", buffer_size=10_000, interval=None, max_seconds=None)
    store = HistoryStore(writer, cache_bytes=2000, cache_rows=1_000_000)
    for i in range(3000):
        store.ingest({"loss": 1.0 + i, "acc": 0.5})
    assert writer.flushes < 300  # was one flush per commit (2973): now one per few segments
    assert store.cache.evicted_rows > 2000
    assert store.cache.nbytes <= 2000 + store.cache.segment_bytes
    assert [r["_step"] for r in store.tail(3)] == [2997, 2998, 2999]
    store.close()


def test_fan_out_keeps_up_with_many_logging_threads():
    store = HistoryStore(None)
    seen_steps = []
    backlog = []

    def sink(row):
        seen_steps.append(row["_step"])
        backlog.append(len(store._fanq))

    store.sinks.append(sink)

    def worker():
        for i in range(3000):
            store.ingest({"x": i})

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen_steps == list(range(12000))  # every row, in commit order
    assert max(backlog) <= 8  # each thread delivers up to its own row: no runaway queue


def test_sink_that_logs_does_not_deadlock():
    store = HistoryStore(None)
    seen = []

    def sink(row):
        seen.append(row["_step"])
        if row["_step"] == 0:
            store.ingest({"from_sink": 1})

    store.sinks.append(sink)
    store.ingest({"a": 1})
    store.ingest({"a": 2})
    assert seen == [0, 1, 2]
