"""The store's row cache is its writer's queue (``JsonlWriter.feed_from``): one append per
row. Real files, real threads, a failing disk, an interrupt at every point.

Each committed row reaches the file exactly once, in order, on its step; the cache shows it
at once; a failing disk keeps the rows cached (drop-oldest past ``max_pending_records``
advances ``flushed`` and records the steps); the flusher thread copies its batches from the
cache while other threads append and evict."""

from __future__ import annotations

import collections
import json
import mmap
import os
import random
import threading

import pytest
from helpers import Injector, count_events

from expr_tracker.history.cache import RowCache
from expr_tracker.history.codec import encode_row
from expr_tracker.history.pending import PROBE_INTERVAL_S
from expr_tracker.history.store import HistoryStore
from expr_tracker.history.writer import JsonlWriter
from expr_tracker.testing import FakeClock


def file_rows(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def break_writes(w: JsonlWriter) -> None:
    """Every write now fails with EBADF (the file is opened read-only)."""
    if w.file.fd is not None:
        os.close(w.file.fd)
    w.file.fd = os.open(w.path, os.O_RDONLY | os.O_CREAT)


def heal_writes(w: JsonlWriter) -> None:
    os.close(w.file.fd)
    w.file.fd = os.open(w.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def test_the_cache_is_the_queue_and_the_writer_refuses_other_records(tmp_path):
    w = JsonlWriter(tmp_path / "m.jsonl", interval=3600, max_seconds=None, buffer_size=10_000)
    s = HistoryStore(w, max_open_seconds=None)
    for i in range(5):
        s.ingest({"x": float(i)})
    assert not w.queue.lines  # nothing copied into a queue of the writer's own
    st = s.stats()
    assert st["pending_rows"] + st["rows_on_disk"] == 5
    assert st["writer"]["appended"] == 5
    assert st["writer"]["pending_bytes"] == sum(
        len(x) for x in s.cache.lines(w.flushed, s.cache.next_ordinal)
    )
    with pytest.raises(RuntimeError):
        w.append(b"{}", 0)
    with pytest.raises(ValueError):  # one writer, one cache
        w.feed_from(RowCache(1 << 20, 1000))
    s.close()
    assert [r["_step"] for r in file_rows(w.path)] == [0, 1, 2, 3, 4]
    assert s.stats()["pending_rows"] == 0


def test_a_writer_that_holds_records_is_not_fed(tmp_path):
    w = JsonlWriter(tmp_path / "m.jsonl", async_write=False)
    w.append(b'{"_step":0}', 0)
    with pytest.raises(ValueError):
        HistoryStore(w)
    w.close()


@pytest.mark.parametrize("cache_rows", [2_000_000, 40])
def test_threads_logging_while_the_flusher_writes_keep_order(tmp_path, cache_rows):
    """Three threads commit rows (small buffer: the flusher copies a batch from the cache
    every few rows; a small cache: segments are closed, trimmed and evicted meanwhile); the
    file holds each committed step once, in commit order, with its own values, and a
    row's step is in the cache the moment ``ingest`` returns."""
    w = JsonlWriter(tmp_path / "m.jsonl", buffer_size=3, interval=0.001, max_seconds=0.002)
    s = HistoryStore(w, max_open_seconds=None, cache_rows=cache_rows)
    landed: dict[int, tuple[int, int]] = {}
    errors: list[str] = []

    def work(k: int) -> None:
        for i in range(1500):
            step = s.ingest({"k": k, "i": i, "v": float(i) / 7})
            landed[step] = (k, i)
            if i % 97 == 0:
                tail = s.tail(1, include_open=False)
                if not tail or tail[-1]["_step"] < step:
                    errors.append(f"step {step} not shown at once")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s.close()
    assert errors == []
    rows = file_rows(w.path)
    assert [r["_step"] for r in rows] == list(range(4500))
    assert all((r["k"], r["i"]) == landed[r["_step"]] for r in rows)
    # each thread's rows in the order it logged them
    for k in range(3):
        assert [r["i"] for r in rows if r["k"] == k] == list(range(1500))
    assert s.stats()["writer"]["dropped"] == 0


@pytest.mark.parametrize(("cache_bytes", "cache_rows"), [(1 << 30, 4000), (64 * 1024, 600)])
def test_batches_copied_on_another_thread_match_the_rows(cache_bytes, cache_rows):
    """``RowCache.batch`` read by one thread while another appends (consecutive and broken
    step runs, lines of many sizes) and evicts below the reader's watermark: every batch
    equals what was appended (bytearray and mapped segments)."""
    cache = RowCache(cache_bytes, cache_rows)
    assert type(cache._segments[0].data) is (bytearray if cache_rows == 600 else mmap.mmap)
    model: list[tuple[bytes, int]] = []
    flushed = 0  # the reader's watermark: the writer's ``flushed``
    lock = threading.Lock()  # the store's: appends and evictions
    done = threading.Event()
    bad: list[str] = []

    def reader() -> None:
        nonlocal flushed
        while not done.is_set() or flushed < cache.next_ordinal:
            stop = min(cache.next_ordinal, flushed + 37)
            lines, steps = cache.batch(flushed, stop)
            want = model[flushed:stop]
            if lines != [x for x, _ in want] or steps != [st for _, st in want]:
                bad.append(f"batch {flushed}:{stop}")
                return
            flushed = stop

    t = threading.Thread(target=reader)
    t.start()
    rng = random.Random(7)
    step = 0
    for _ in range(20_000):
        step += rng.choice((1, 1, 1, 1, 0, 3))
        line = encode_row({"_step": step, "s": "x" * rng.randrange(0, 300)})
        with lock:
            model.append((line, step))
            cache.append(line, step)
            if cache.over_limit():
                cache.evict(flushed)
    done.set()
    t.join()
    assert bad == []
    assert flushed == 20_000


def test_failing_disk_keeps_rows_cached_then_writes_them_in_order(tmp_path, caplog):
    clock = FakeClock()
    w = JsonlWriter(tmp_path / "m.jsonl", async_write=False, buffer_size=1, clock=clock)
    s = HistoryStore(w, max_open_seconds=None, clock=clock)
    s.ingest({"x": 0.0})
    break_writes(w)
    for i in range(1, 50):
        s.ingest({"x": float(i)})
        clock.now += 0.005
    assert w.write_errors >= 1
    st = s.stats()
    assert st["pending_rows"] == 49 and st["rows_on_disk"] == 1
    assert [r["_step"] for r in s.tail(-1)] == list(range(50))  # all still shown
    assert sum("write to" in r.getMessage() for r in caplog.records) == 1  # warned once
    heal_writes(w)
    s.close()
    assert [r["_step"] for r in file_rows(w.path)] == list(range(50))
    assert w.dropped == 0


def test_drop_oldest_advances_flushed_and_records_the_steps(tmp_path, caplog):
    """Past ``max_pending_records`` while the disk fails (and the probe fails too): the
    oldest rows are dropped, their steps recorded, ``flushed`` advanced (they may leave
    the cache); the rows after them reach the file once the disk is back."""
    clock = FakeClock()
    w = JsonlWriter(
        tmp_path / "m.jsonl",
        async_write=False,
        buffer_size=1,
        max_pending_records=10,
        clock=clock,
    )
    s = HistoryStore(w, max_open_seconds=None, clock=clock, cache_rows=8)
    s.ingest({"x": 0.0})
    break_writes(w)
    for i in range(1, 31):
        s.ingest({"x": float(i)})
        clock.now += PROBE_INTERVAL_S / 4
    assert w.dropped == 20
    assert w.pending == 10
    assert w.dropped_steps == [[1, 20]]
    assert s._flushed_ordinal() == 21  # one written, 20 dropped
    assert s.cache.first_ordinal > 0  # rows below the watermark were evicted
    heal_writes(w)
    s.close()
    assert [r["_step"] for r in file_rows(w.path)] == [0, *range(21, 31)]
    st = s.stats()
    assert st["dropped"]["disk"] == 20 and st["pending_rows"] == 0


def test_a_probe_that_lands_writes_the_queue_instead_of_dropping(tmp_path):
    clock = FakeClock()
    w = JsonlWriter(
        tmp_path / "m.jsonl", async_write=False, buffer_size=1, max_pending_records=5, clock=clock
    )
    s = HistoryStore(w, max_open_seconds=None, clock=clock)
    s.ingest({"x": 0.0})
    break_writes(w)
    for i in range(1, 6):
        s.ingest({"x": float(i)})
    heal_writes(w)  # the disk is back; no retry is due yet
    clock.now += PROBE_INTERVAL_S
    s.ingest({"x": 6.0})  # at the bound: the probe lands, the queue is written
    assert w.dropped == 0
    s.close()
    assert [r["_step"] for r in file_rows(w.path)] == list(range(7))


def test_resume_appends_after_the_disk_prefix(tmp_path):
    path = tmp_path / "m.jsonl"
    w = JsonlWriter(path, async_write=False)
    s = HistoryStore(w, max_open_seconds=None)
    for i in range(3):
        s.ingest({"x": float(i)})
    s.close()
    w = JsonlWriter(path, async_write=False, buffer_size=2)
    s = HistoryStore(w, max_open_seconds=None, start_step=3)
    assert s.disk_prefix_rows == 3
    for i in range(3, 8):
        s.ingest({"x": float(i)})
    assert s._flushed_ordinal() == 3 + w.flushed
    assert [r["_step"] for r in s.tail(-1)] == list(range(8))
    s.close()
    assert [r["_step"] for r in file_rows(path)] == list(range(8))


def test_open_row_writes_and_patch_lines_go_through_the_cache(tmp_path):
    w = JsonlWriter(tmp_path / "m.jsonl", async_write=False, buffer_size=1)
    s = HistoryStore(w, max_open_seconds=None)
    s.ingest({"a": 1.0}, commit=False)
    assert s.write_open_row()
    s.ingest({"b": 2.0})  # commits step 0 as a patch line (b only)
    s.close()
    rows = file_rows(w.path)
    assert [(r["_step"], "a" in r, "b" in r) for r in rows] == [(0, True, False), (0, False, True)]
    assert w.has_duplicate_steps


def _exactly_once(steps: list[int], returned: list[int]) -> None:
    dups = [x for x, n in collections.Counter(steps).items() if n > 1]
    assert dups == [], f"steps written twice: {dups[:20]}"
    assert sorted(set(returned) - set(steps)) == []
    assert steps == sorted(steps)


@pytest.mark.parametrize("plain", [True, False])
def test_interrupt_at_every_point_of_a_commit_that_tells_the_writer(tmp_path, plain):
    """``async_write=False``: every row calls ``JsonlWriter.added`` (and every third
    writes); a ``KeyboardInterrupt`` at each point of one commit in turn: no step twice,
    nothing returned lost, the cache and the file agree, no lock left held."""
    w = JsonlWriter(
        tmp_path / "m.jsonl", async_write=False, buffer_size=3, interval=None, max_seconds=None
    )
    s = HistoryStore(w, max_open_seconds=None, cache_rows=16)
    value = 0.5 if plain else float("nan")  # NaN: the general path (_commit_locked)
    returned = [s.ingest({"x": value})]
    n = max(count_events(s.ingest, {"x": value}) for _ in range(3)) + 10
    returned += [1, 2, 3]
    fired = 0
    for at in range(1, n):
        inj = Injector(at)
        try:
            returned.append(inj.run(s.ingest, {"x": value}))
        except KeyboardInterrupt:
            pass
        fired += inj.fired
        with w._io_lock:
            assert w.flushed + w.pending == s.cache.next_ordinal
            assert w.lines == w.flushed
        returned.append(s.ingest({"y": 1.0}))  # no lock left held
    assert fired > n // 3
    s.close()
    steps = [r["_step"] for r in file_rows(w.path)]
    _exactly_once(steps, returned)
    assert steps == [r["_step"] for r in s.tail(-1, include_open=False)]


@pytest.mark.parametrize("cache_rows", [5, 64, 100_000])
def test_pending_bytes_from_the_offsets_match_the_lines(cache_rows):
    """``nbytes_between`` (what ``stats()["pending_bytes"]`` of a fed writer reads) is the
    sum of the lines' sizes over any range, across segments and after eviction."""
    rng = random.Random(7)
    cache = RowCache(1 << 30, cache_rows, first_ordinal=3)
    lines = [b"x" * rng.randint(1, 300) for _ in range(1000)]
    for i, line in enumerate(lines):
        cache.append(line, i)
    cache.evict(3 + 400)  # rows below 403 are on disk: evictable
    low = cache.first_ordinal
    for _ in range(200):
        a = rng.randint(low, 1003)
        b = rng.randint(a, 1003)
        assert cache.nbytes_between(a, b) == sum(map(len, lines[a - 3 : b - 3]))
        assert cache.nbytes_between(a, b) == sum(map(len, cache.batch(a, b)[0]))
    if low > 3:
        with pytest.raises(ValueError):
            cache.nbytes_between(3, 10)
