"""Media of a run (docs/media.md): the run folder's :class:`MediaStore`, hooked into the
history store as its converter of values that are not plain scalars, attached as
``run.media``, closed at finish (queued files written before ``run.json`` says finished)."""

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
    run.add_closer("media", media.close)
    run.add_stats("media", media.stats)
    return media
