"""A lock file planted in a shared runs folder: a symlink to someone's file, or a FIFO, is
never followed, truncated or blocked on; the run goes on without the lock and says so."""

from __future__ import annotations

import os

import pytest

import expr_tracker as et
from expr_tracker.history.recovery import acquire_lock


def test_a_symlinked_lock_file_is_never_followed_or_truncated(tmp_path, caplog):
    victim = tmp_path / "thesis.txt"
    victim.write_text("years of work\n")
    run = tmp_path / "runs" / "p" / "r"
    run.mkdir(parents=True)
    (run / "metrics.jsonl.lock").symlink_to(victim)
    with pytest.raises(OSError, match="not a regular file"):
        acquire_lock(run / "metrics.jsonl")
    assert victim.read_text() == "years of work\n"
    et.init(project="p", name="r", dir=str(tmp_path / "runs"))
    assert "is not a regular file" in caplog.text and "without the one-writer lock" in caplog.text
    et.log({"loss": 1.0})
    et.finish()
    assert victim.read_text() == "years of work\n"
    assert (run / "metrics.jsonl").read_text().count("\n") == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_a_fifo_lock_file_does_not_block(tmp_path):
    run = tmp_path / "runs" / "p" / "r"
    run.mkdir(parents=True)
    os.mkfifo(run / "metrics.jsonl.lock")
    with pytest.raises(OSError, match="not a regular file"):
        acquire_lock(run / "metrics.jsonl")
