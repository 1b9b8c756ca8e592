"""The run's background sync to a bucket (``sync: {url: ..., interval: 60s}``;
docs/team.md "Sync during training").

Each process uploads the files it writes: its own stream and rank and, where it runs the
system sampler, the ``system`` stream of its rank; the run's media go with the run's first
producer (as ``et sync`` does). So every rank of every host syncs its own producers into
the one run of the bucket, in parallel, with no coordination beyond the manifests'
conditional writes. The last pass runs after everything is on disk and ``run.json`` says
how the run ended (a late closer), waiting at most ``sync.finish_timeout``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from expr_tracker._warn import Warner
from expr_tracker.runs import Run

__all__ = ["build_sync", "sync_issue"]


def sync_issue(spec: Any) -> str | None:
    """Why ``spec.sync`` cannot be used (a URL the stores refuse, boto3 missing for
    ``s3://``), None when it can or sync is off; no side effect (no request)."""
    if spec.sync.url is None:
        return None
    from expr_tracker.sync.store import StoreError, open_store

    try:
        open_store(spec.sync.url, endpoint_url=spec.sync.endpoint_url)
    except (ValueError, StoreError) as exc:
        return str(exc).replace(repr(spec.sync.url), "the URL")
    return None


def build_sync(run: Run, spec: Any, run_dir: Path, stream: str | None, file_rank: int) -> None:
    """Start the background sync of ``spec.sync`` (when it has a URL), hooked into the run:
    late closer ``sync`` (the last pass, bounded), stats section ``sync``."""
    s = spec.sync
    if s.url is None:
        return
    from expr_tracker.sync.background import BackgroundSync
    from expr_tracker.sync.store import open_store
    from expr_tracker.sync.upload import sync_dir

    store = open_store(s.url, endpoint_url=s.endpoint_url)  # checked by check(): no request
    mine = {(stream or None, file_rank)}
    if run.system is not None:
        from expr_tracker.assemble.system import SYSTEM_STREAM

        mine.add((SYSTEM_STREAM, file_rank))

    def upload() -> Any:
        return sync_dir(run_dir, s.url, store=store, select=lambda p: (p.stream, p.rank) in mine)

    bg = BackgroundSync(upload, interval=s.interval, url=store.url, warner=Warner())
    run.add_closer("sync", lambda: bg.close(s.finish_timeout), late=True)
    run.add_stats("sync", bg.stats)
    run.sync = bg
    bg.start()
