"""A row on disk means its media files are on disk (docs/media.md "Storage layout"): the
history writer waits for the media thread before it writes a batch, bounded by
``WAIT_TIMEOUT_S``, and pays nothing when no media are outstanding."""

from __future__ import annotations

import json
import logging
import threading
import time

import numpy as np

import expr_tracker as et
from expr_tracker._warn import Warner
from expr_tracker.media import store as media_store
from expr_tracker.media.store import MediaStore


def _init(tmp_path):
    return et.init(project="p", name="r", dir=str(tmp_path / "runs"), system=False)


def _refs_on_disk(run_dir):
    """(references in metrics.jsonl, those whose file is missing)."""
    refs, missing = 0, []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        for v in json.loads(line).values():
            if isinstance(v, dict) and "path" in v:
                refs += 1
                if not (run_dir / v["path"]).exists():
                    missing.append(v["path"])
    return refs, missing


def _slow_writes(monkeypatch, media, gate):
    original = media._write

    def slow(name, data):
        gate.wait(5)
        original(name, data)

    monkeypatch.setattr(media, "_write", slow)


def test_flushed_rows_never_precede_their_media_files(tmp_path, monkeypatch):
    run = _init(tmp_path)
    gate = threading.Event()
    _slow_writes(monkeypatch, run.media, gate)
    for i in range(3):
        et.log({"loss": float(i), "h": et.Histogram(np.arange(10.0) * (i + 1))})
    run.history.commit()
    threading.Timer(0.2, gate.set).start()  # the media thread is held until then
    t0 = time.monotonic()
    run.history.flush()
    waited = time.monotonic() - t0
    refs, missing = _refs_on_disk(run.dir)
    assert refs == 3 and missing == []
    assert waited >= 0.15  # the rows waited for the files
    run_dir = run.dir
    et.log({"h": et.Histogram(np.arange(5.0))})
    et.finish()  # media close, then history close: no deadlock, every reference on disk
    assert _refs_on_disk(run_dir) == (4, [])


def test_a_stuck_media_write_delays_rows_once_with_one_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(media_store, "WAIT_TIMEOUT_S", 0.2)
    run = _init(tmp_path)
    gate = threading.Event()  # a hung file system: never set until the end
    _slow_writes(monkeypatch, run.media, gate)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        et.log({"h": et.Histogram([1.0, 2.0])})
        run.history.commit()
        t0 = time.monotonic()
        run.history.flush()
        first = time.monotonic() - t0
        et.log({"h": et.Histogram([3.0, 4.0])})
        run.history.commit()
        t0 = time.monotonic()
        run.history.flush()  # still stuck: no second wait
        second = time.monotonic() - t0
    assert 0.15 <= first < 2.0 and second < 0.1
    assert (run.dir / "metrics.jsonl").read_text().count("\n") == 2  # written anyway
    assert run.media.stats()["wait_timeouts"] == 1
    assert sum("were not written within" in r.getMessage() for r in caplog.records) == 1
    gate.set()
    run_dir = run.dir
    et.finish()
    assert _refs_on_disk(run_dir) == (2, [])


class _NoLock:
    def __enter__(self):
        raise AssertionError("the fast path took the lock")

    def __exit__(self, *exc):
        return False


def test_nothing_outstanding_costs_no_lock_and_no_thread(tmp_path):
    store = MediaStore(tmp_path, warner=Warner())
    cond, store._cond = store._cond, _NoLock()  # type: ignore[assignment]
    assert store.wait_written() is True and store._worker is None  # never logged media
    store._cond = cond
    store.put(b"x", "bin")
    assert store.flush(5)
    store._cond = _NoLock()  # type: ignore[assignment]
    assert store.wait_written() is True  # all written: one comparison
    store._cond = cond
    store.close()
    assert (tmp_path / "media").is_dir()


def test_scalar_only_run_starts_no_media_thread(tmp_path):
    run = _init(tmp_path)
    for i in range(5):
        et.log({"loss": float(i)})
    run.history.flush()
    assert run.media._worker is None and run.media.wait_timeouts == 0
    et.finish()
