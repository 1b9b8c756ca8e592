"""Media of a run (docs/media.md): the run folder's :class:`MediaStore`, hooked into the
history store as its converter of values that are not plain scalars, attached as
``run.media``, closed at finish (queued files written before ``run.json`` says finished).
The history writer waits for the queued files before it writes rows (``before_write``), so
a row in ``metrics.jsonl`` never precedes the media files it references."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from expr_tracker.media.store import MediaStore


def build_media(run: Any, run_dir: Path, max_bytes: int | None = None) -> MediaStore:
    """Attach ``run.media`` and its ``et.info()["media"]`` section; returns the store."""
    media = (
        MediaStore(run_dir, warner=run.warner)
        if max_bytes is None
        else MediaStore(run_dir, max_bytes, warner=run.warner)
    )
    run.media = media
    run.history.convert = media.convert
    writer = getattr(run.history, "writer", None)
    if writer is not None:
        writer.before_write.append(media.wait_written)
    run.add_closer("media", media.close)
    run.add_stats("media", media.stats)
    return media
