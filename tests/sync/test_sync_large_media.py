"""A media file larger than the bucket's limit for run files (64 MiB) but within the media
readers' (256 MiB) is synced and read back whole: what `et sync` uploads, a teammate gets."""

from __future__ import annotations

import hashlib
import json

import pytest

from expr_tracker.media.read import MAX_READ_BYTES
from expr_tracker.sync.mirror import mirror
from expr_tracker.sync.store import MAX_OBJECT_BYTES
from expr_tracker.sync.upload import sync_dir


@pytest.mark.slow  # 65 MiB written, hashed, copied twice: ~2 s
def test_a_media_file_over_the_run_file_limit_mirrors_back(tmp_path):
    size = MAX_OBJECT_BYTES + (1 << 20)
    assert size <= MAX_READ_BYTES
    run = tmp_path / "runs" / "proj" / "r1"
    (run / "media").mkdir(parents=True)
    data = hashlib.sha256(b"seed").digest() * (size // 32)
    sha = hashlib.sha256(data).hexdigest()
    name = f"media/{sha}.table.json"
    (run / name).write_bytes(data)
    (run / "metrics.jsonl").write_text(
        json.dumps({"_step": 0, "_time": 1.0, "t": {"_type": "table", "path": name}}) + "\n"
    )
    url = f"file://{tmp_path / 'bucket'}"
    assert sync_dir(tmp_path / "runs", url).errors == []
    got = mirror(url, cache_dir=tmp_path / "copy")
    assert got.problems == []
    assert (got.path / "proj" / "r1" / name).read_bytes() == data


def test_an_unreadable_media_file_holds_back_nothing_else(tmp_path):
    import os

    run = tmp_path / "runs" / "proj" / "r1"
    (run / "media").mkdir(parents=True)
    os.mkfifo(run / "media" / f"{'0' * 64}.png")
    (run / "metrics.jsonl").write_text(json.dumps({"_step": 0, "_time": 1.0, "loss": 1}) + "\n")
    url = f"file://{tmp_path / 'bucket'}"
    rep = sync_dir(tmp_path / "runs", url)
    assert rep.errors == [] and rep.commits == 1
    assert len(rep.skipped) == 1 and "cannot be read" in rep.skipped[0]
    got = mirror(url, cache_dir=tmp_path / "copy")
    assert (got.path / "proj" / "r1" / "metrics.jsonl").read_bytes() == (
        run / "metrics.jsonl"
    ).read_bytes()
