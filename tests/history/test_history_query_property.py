"""Reads across the cache/disk boundary equal a read with everything in memory and a cold
read of the file, over random commit sequences, patch lines and evictions; and a second
process reads a live run while it is being written."""

from __future__ import annotations

import itertools
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from expr_tracker.history import HistoryStore, read_history
from expr_tracker.history.reader import JsonlReader, meta_path_for
from expr_tracker.history.writer import JsonlWriter

KEYS = ("a", "b", "c")

op = st.one_of(
    st.tuples(st.just("log"), st.sampled_from(KEYS), st.integers(0, 9)),
    st.tuples(st.just("log"), st.sampled_from(KEYS), st.integers(0, 9)),
    st.tuples(st.just("nocommit"), st.sampled_from(KEYS), st.integers(0, 9)),
    st.tuples(st.just("step"), st.integers(-2, 3), st.integers(0, 9)),
    st.tuples(st.just("write_open"), st.just(0), st.just(0)),
    st.tuples(st.just("flush"), st.just(0), st.just(0)),
    st.tuples(st.just("query"), st.integers(-1, 12), st.integers(0, 12)),
)


def pair(tmp: Path, policy: str, cache_rows: int, buffer_size: int, index_every: int):
    path = tmp / "metrics.jsonl"
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
    c1, c2 = itertools.count(), itertools.count()
    small = HistoryStore(
        w,
        cache_rows=cache_rows,
        step_policy=policy,
        max_open_seconds=None,
        wall_clock=lambda: next(c1),
    )
    ref = HistoryStore(None, step_policy=policy, max_open_seconds=None, wall_clock=lambda: next(c2))
    return small, ref


def apply(store: HistoryStore, o: tuple) -> None:
    kind, x, y = o
    if kind == "log":
        store.ingest({x: y})
    elif kind == "nocommit":
        store.ingest({x: y}, commit=False)
    elif kind == "step":
        store.ingest({"s": y}, step=max(0, store.open_step + x))
    elif kind == "write_open":
        store.write_open_row()
    elif kind == "flush":
        store.flush()


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    ops=st.lists(op, min_size=10, max_size=120),
    policy=st.sampled_from(["monotonic", "allow"]),
    cache_rows=st.integers(1, 6),
    buffer_size=st.integers(1, 6),
    index_every=st.integers(1, 5),
)
@pytest.mark.slow
def test_cache_disk_boundary_equals_memory_and_cold_reads(
    ops, policy, cache_rows, buffer_size, index_every
):
    with tempfile.TemporaryDirectory() as d:
        small, ref = pair(Path(d), policy, cache_rows, buffer_size, index_every)
        for o in ops:
            apply(small, o)
            apply(ref, o)
            if o[0] == "query":
                n, lo = o[1], o[2]
                if policy == "monotonic":  # allow: tail(n) is "most recently written"
                    for inc in (True, False):
                        assert small.tail(n, include_open=inc) == ref.tail(n, include_open=inc)
                assert small.tail(-1) == ref.tail(-1)
                for inc in (True, False):
                    got = small.step_range(lo, lo + 4, include_open=inc)
                    assert got == ref.step_range(lo, lo + 4, include_open=inc)
        # finally everything is committed and on disk: a cold read of the file agrees
        small.commit()
        ref.commit()
        small.flush()
        path = small.writer.path
        cold = JsonlReader(path)
        assert small.tail(-1) == ref.tail(-1) == cold.tail(-1)
        for lo, hi in ((0, 3), (2, 9), (5, 6), (None, 4), (3, None)):
            want = ref.step_range(lo, hi)
            assert small.step_range(lo, hi) == want == JsonlReader(path).read_range(lo, hi)
        if policy == "monotonic":
            for n in (1, 2, 5, 50):
                assert small.tail(n) == ref.tail(n) == JsonlReader(path).tail(n)
        stats = small.stats()
        event(f"evicted={stats['evicted_rows'] > 0}")
        event(f"patch_lines={stats['patch_rows'] > 0}")
        event(f"disk_queries={stats['disk_queries'] > 0}")
        small.close()


# --------------------------------------------------------------------------- two processes

WRITER = textwrap.dedent(
    """
    import sys, time
    import expr_tracker as et
    et.init(project="p", name="live", dir=sys.argv[1], buffer_size=7, spans=False)
    for i in range(int(sys.argv[2])):
        et.log({"loss": 1.0 / (i + 1), "acc": i * 0.001, "big": "x" * (i % 50)})
        if i % 100 == 0:
            time.sleep(0.01)
    et.finish()
    """
)


@pytest.mark.slow
def test_second_process_reads_a_live_run(tmp_path):
    total = 4000
    run_dir = tmp_path / "runs" / "p" / "live"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path / "runs"), str(total)],
        stderr=subprocess.PIPE,
    )
    partial = 0
    reads = 0
    try:
        while proc.poll() is None:
            if not (run_dir / "metrics.jsonl").exists():
                time.sleep(0.005)
                continue
            rows = read_history(run_dir)
            reads += 1
            steps = [r["_step"] for r in rows]
            assert steps == list(range(len(steps)))  # no gap, no duplicate, no torn row
            assert all({"loss", "acc", "big", "_time"} <= r.keys() for r in rows)
            if 10 <= len(rows) < total:
                partial += 1
                lo = len(rows) // 2
                got = read_history(run_dir, step_range=(lo, lo + 5))
                assert [r["_step"] for r in got] == list(range(lo, lo + 5))
                if len(rows) >= 3:
                    t = [r["_step"] for r in read_history(run_dir, 3)]
                    assert t == list(range(t[0], t[0] + 3)) and t[-1] >= steps[-1]
    finally:
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert reads > 0
    final = read_history(run_dir)
    assert [r["_step"] for r in final] == list(range(total))
    assert partial >= 1  # at least one read saw the run half written
