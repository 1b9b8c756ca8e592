"""A media file whose write failed (a full or unwritable disk) is written when the same
content is logged again, once the folder can be written (docs/media.md)."""

from __future__ import annotations

from expr_tracker._warn import Warner
from expr_tracker.media.store import MediaStore


def test_failed_media_write_is_retried_on_the_next_put(tmp_path):
    store = MediaStore(tmp_path, warner=Warner())
    (tmp_path / "media").write_bytes(b"")  # a file where the folder goes: mkdir fails
    rel, _ = store.put(b"pixels", "png")
    assert store.flush(5)
    assert store.write_errors == 1 and not (tmp_path / rel).exists()
    (tmp_path / "media").unlink()
    rel2, _ = store.put(b"pixels", "png")
    assert store.flush(5)
    store.close()
    assert rel2 == rel and (tmp_path / rel).read_bytes() == b"pixels"
    assert store.stats()["bytes_used"] == len(b"pixels")
