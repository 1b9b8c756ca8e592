"""Sync during training (``sync: {url, interval}``): a daemon thread uploads the run while
it trains and once more at finish; a failing bucket never breaks training."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

import expr_tracker as et
from expr_tracker.spec import SpecError
from expr_tracker.sync.background import BackgroundSync
from expr_tracker.sync.bucket import read_log, read_manifest
from expr_tracker.sync.store import open_store

pytest.importorskip("pyarrow")


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def bucket_lines(store, run, kind="metrics", stream=None, rank=0) -> bytes:
    m, _ = read_manifest(store, "proj", run, stream, rank)
    return b"".join(read_log(store, m, kind)) if m else b""


def test_a_run_syncs_while_it_trains_and_at_finish(s3_bucket, tmp_path):
    run = et.init(
        project="proj",
        name="live",
        dir=str(tmp_path / "runs"),
        sync={"url": s3_bucket.url, "interval": "0.2s"},
        system=False,
    )
    store = open_store(s3_bucket.url)
    for i in range(20):
        with et.span("fwd"):
            pass
        et.log({"loss": 1.0 / (i + 1)})
    run.history.flush()
    # the background thread commits the lines written so far, while the run is live
    assert wait_for(lambda: bucket_lines(store, "live").count(b"\n") >= 20)
    for i in range(20, 30):
        et.log({"loss": 1.0 / (i + 1)})
    et.finish()
    info = run.info()["sync"]
    local = tmp_path / "runs" / "proj" / "live"
    assert bucket_lines(store, "live") == (local / "metrics.jsonl").read_bytes()
    assert bucket_lines(store, "live", "spans") == (local / "spans.jsonl").read_bytes()
    m, _ = read_manifest(store, "proj", "live", None, 0)
    run_json = store.get(m["files"]["run.json"]["key"])[0]
    assert b'"finished"' in run_json  # the last pass ran after run.json was final
    assert info["failures"] == 0 and info["commits"] >= 2 and info["last_error"] is None


def test_a_failing_bucket_warns_once_and_the_next_interval_retries(tmp_path, caplog):
    blocker = tmp_path / "bucket"
    blocker.write_text("a file where the bucket folder should be")
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        run = et.init(
            project="proj",
            name="r",
            dir=str(tmp_path / "runs"),
            sync={"url": f"file://{blocker}", "interval": "0.1s"},
            system=False,
        )
        t0 = time.perf_counter()
        for i in range(50):
            et.log({"loss": float(i)})
        assert time.perf_counter() - t0 < 0.5  # log() never waits on the sync
        run.history.flush()
        assert wait_for(lambda: run.info()["sync"]["failures"] >= 2)
        warned = [r for r in caplog.records if "background sync" in r.getMessage()]
        assert len(warned) == 1 and "training goes on" in warned[0].getMessage()
        blocker.unlink()  # the bucket comes back: the next pass uploads everything
        assert wait_for(lambda: run.info()["sync"]["failed_in_row"] == 0)
        et.finish()
    store = open_store(f"file://{blocker}")
    local = tmp_path / "runs" / "proj" / "r" / "metrics.jsonl"
    assert bucket_lines(store, "r") == local.read_bytes()
    assert run.info()["sync"]["last_error"] is None


def test_finish_waits_for_the_last_pass_at_most_its_deadline(caplog):
    release = threading.Event()
    calls = []

    def upload():
        calls.append(time.monotonic())
        if len(calls) > 1:
            release.wait(5)
        return type("R", (), {"bytes": 1, "commits": 1, "errors": []})()

    bg = BackgroundSync(upload, interval=0.05, url="s3://b/p")
    bg.start()
    assert wait_for(lambda: len(calls) >= 1)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        t0 = time.monotonic()
        assert bg.close(0.2) is False  # the last pass hangs: finish goes on
        assert 0.15 < time.monotonic() - t0 < 1.0
    assert any("did not finish within 0.2s" in r.getMessage() for r in caplog.records)
    release.set()


def test_failed_passes_back_off_and_a_clean_one_resets_the_wait():
    outcomes = [OSError("unreachable")] * 7 + [None]

    def upload():
        err = outcomes.pop(0)
        if err is not None:
            raise err
        return type("R", (), {"bytes": 1, "commits": 1, "errors": []})()

    bg = BackgroundSync(upload, interval=60, url="s3://b/p")  # never started: passes by hand
    waits = [bg.next_wait()]
    for _ in range(8):
        bg._pass()
        waits.append(bg.stats()["next_wait_s"])
    # doubling from the interval, capped at 600 s (32 x 60 would be 1,920), reset when clean
    assert waits == [60, 120, 240, 480, 600, 600, 600, 600, 60]
    assert BackgroundSync(upload, interval=3600, url="s3://b/p").next_wait() == 3600
    slow = BackgroundSync(upload, interval=1200, url="s3://b/p")
    slow.failed_in_row = 3
    assert slow.next_wait() == 1200  # never below the interval itself


def test_close_runs_one_last_pass_without_waiting_an_interval():
    calls = []

    def upload():
        calls.append(1)
        return type("R", (), {"bytes": 0, "commits": 0, "errors": []})()

    bg = BackgroundSync(upload, interval=3600, url="file:///x")
    bg.start()
    t0 = time.monotonic()
    assert bg.close(5) is True
    assert time.monotonic() - t0 < 1 and calls == [1]
    assert bg.stats()["passes"] == 1 and bg.stats()["lag_s"] is not None


@pytest.mark.parametrize(
    ("sync", "why"),
    [
        ({"url": "ftp://host/x"}, "s3://bucket/prefix or file:///path"),
        ({"url": "s3://AKIAKEY:s3cr3t@bucket/p"}, "holds no credentials"),
        ({"url": "s3://b/p", "interval": "10ms"}, "at least 0.1 s"),
        ({"url": "s3://b/../p"}, "'..'"),
    ],
)
def test_a_bad_sync_section_is_a_spec_error_naming_the_field(tmp_path, sync, why):
    with pytest.raises(SpecError) as err:
        et.init(project="p", name="n", dir=str(tmp_path), sync=sync, system=False)
    text = str(err.value)
    assert "sync." in text and why in text and "s3cr3t" not in text
    assert not Path(tmp_path, "p", "n").exists()
