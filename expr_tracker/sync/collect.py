"""``et gc URL``: remove the objects of a sync bucket that no manifest references
(docs/team.md "Garbage").

A sync killed between uploading a part and committing its manifest, or one that lost a
conditional write, leaves objects nobody references. They are harmless (readers start from
the manifests) but take space and would be seen by a reader that globs the Parquet folders
instead of following the manifests. :func:`collect` lists every object under the prefix,
reads every manifest, and deletes what is referenced by none, when it is older than
``grace`` seconds: a sync running at the same moment has uploaded parts it has not
committed yet, and the grace (default one hour) keeps them.

A manifest that cannot be read or is not valid protects everything: its run's objects
and every blob are kept, and the problem is reported (deleting on the word of a manifest
we do not understand could delete data). Only the sync layout's own keys are deleted:
anything else under the prefix (a README someone put there) is left alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from expr_tracker.history import untrusted
from expr_tracker.sync import layout
from expr_tracker.sync.store import ObjectStore, StoreError

__all__ = ["DEFAULT_GRACE", "GcReport", "collect"]

#: unreferenced objects younger than this (seconds) are kept: a live sync may commit them
DEFAULT_GRACE = 3600.0
_OURS = ("_raw/", "_files/", "_blobs/", *(f"{k}/" for k in layout.PARQUET_KINDS))


@dataclass
class GcReport:
    """``deleted``/``freed``: objects removed and their bytes; ``kept``: objects referenced;
    ``young``: unreferenced but within the grace; ``problems``: manifests not understood
    (their run's objects and all blobs were kept)."""

    manifests: int = 0
    kept: int = 0
    young: int = 0
    deleted: int = 0
    freed: int = 0
    deleted_keys: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _run_of(key: str) -> str | None:
    """``project=<P>/run=<R>`` of a run's object key, None for a blob or another key."""
    parts = key.split("/")
    for i in range(len(parts) - 1):
        if parts[i].startswith("project=") and parts[i + 1].startswith("run="):
            return f"{parts[i]}/{parts[i + 1]}"
    return None


def collect(
    store: ObjectStore,
    *,
    grace: float = DEFAULT_GRACE,
    dry_run: bool = False,
    now: float | None = None,
) -> GcReport:
    """Delete unreferenced objects older than ``grace`` seconds (none with ``dry_run``:
    the report then lists what would go). Raises
    :class:`~expr_tracker.sync.store.StoreError` when the store cannot be listed."""
    report = GcReport()
    now = time.time() if now is None else now
    objects = list(store.list(""))
    referenced: set[str] = set()
    protected_runs: set[str] = set()
    protect_blobs = False
    for key, _size, _mtime in objects:
        if not key.startswith("_manifests/"):
            continue
        report.manifests += 1
        ident = layout.parse_manifest_key(key)
        run = _run_of(key)
        if ident is None:
            report.problems.append(f"{key}: not a manifest name this version writes")
            if run:
                protected_runs.add(run)
            protect_blobs = True
            continue
        try:
            got = store.get(key)
            if got is None:  # deleted since the listing
                continue
            m = layout.check_sync_manifest(untrusted.load_json_bytes(got[0]), *ident)
        except (ValueError, StoreError) as exc:
            report.problems.append(f"{key}: {exc}")
            if run:
                protected_runs.add(run)
            protect_blobs = True
            continue
        referenced |= layout.referenced(m)
    for key, size, mtime in objects:
        if key.startswith("_manifests/") or not key.startswith(_OURS):
            continue
        if key in referenced:
            report.kept += 1
            continue
        if _run_of(key) in protected_runs or (protect_blobs and key.startswith("_blobs/")):
            report.kept += 1
            continue
        if now - mtime < grace:
            report.young += 1
            continue
        if not dry_run:
            store.delete(key)
        report.deleted += 1
        report.freed += size
        report.deleted_keys.append(key)
    return report
