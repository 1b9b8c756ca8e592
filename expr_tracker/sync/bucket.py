"""Reading a sync bucket back: its manifests and the parts they commit (docs/team.md
"Reading the bucket").

Everything read here is untrusted input: a manifest is checked by
:func:`expr_tracker.sync.layout.check_sync_manifest` (only keys of its own producer), and each
part's bytes are compared with the SHA-256 its manifest records before they are returned.
A reader that takes one manifest and then its parts sees a consistent prefix of the
producer's lines, whatever syncers do meanwhile: parts are immutable and a manifest only
ever grows by whole parts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

from expr_tracker.errors import ExprTrackerError
from expr_tracker.history import untrusted
from expr_tracker.sync import layout
from expr_tracker.sync.store import ObjectStore

__all__ = ["BucketError", "list_manifests", "list_producers", "read_log", "read_manifest"]


class BucketError(ExprTrackerError):
    """A manifest or a part of a bucket that is missing or not what it should be."""


def list_producers(store: ObjectStore) -> list[tuple[str, str, str | None, int]]:
    """``(project, run, stream, rank)`` of every manifest under the store's prefix (one
    listing of ``_manifests/``: no part is listed), sorted. Keys not named as this version
    names manifests are left out."""
    return [ident for ident, _tag in list_manifests(store)]


def list_manifests(
    store: ObjectStore, project: str | None = None, run: str | None = None
) -> list[tuple[tuple[str, str, str | None, int], str]]:
    """``((project, run, stream, rank), tag)`` of every manifest under the store's prefix,
    or of one project's or one run's only (the listing then starts at its folder), from
    one listing (paged by 1,000 on S3); ``tag`` changes whenever the manifest is rewritten
    (see :mod:`expr_tracker.sync.store`). Sorted; keys not named as this version names
    manifests are left out."""
    prefix = "_manifests/"
    if project is not None:
        prefix += (
            layout.run_prefix(project, run) + "/"
            if run is not None
            else layout.run_prefix(project, "").rsplit("/", 1)[0] + "/"
        )
    out = []
    for key, tag in store.tags(prefix):
        ident = layout.parse_manifest_key(key)
        if ident is not None and (project is None or ident[0] == project):
            if run is None or ident[1] == run:
                out.append((ident, tag))
    return sorted(out, key=lambda t: (t[0][0], t[0][1], t[0][2] or "", t[0][3]))


def read_manifest(
    store: ObjectStore, project: str, run: str, stream: str | None, rank: int
) -> tuple[dict[str, Any] | None, str | None]:
    """The checked manifest of one producer and its ETag, ``(None, None)`` when there is
    none. Raises :class:`BucketError` for a manifest that is not valid (saying why)."""
    key = layout.manifest_key(project, run, stream, rank)
    got = store.get(key)
    if got is None:
        return None, None
    data, etag = got
    try:
        m = layout.check_sync_manifest(untrusted.load_json_bytes(data), project, run, stream, rank)
    except ValueError as exc:
        raise BucketError(f"{store.url}/{key}: not a valid manifest ({exc})") from None
    return m, etag


def read_log(store: ObjectStore, manifest: dict[str, Any], kind: str) -> Iterator[bytes]:
    """The raw JSONL parts of one log (``"metrics"``, ``"spans"``, ...) of a checked
    manifest, in order, each verified against its SHA-256. Raises :class:`BucketError`
    for a part missing or changed."""
    log = manifest.get("logs", {}).get(kind)
    if log is None:
        return
    for p in log["parts"]:
        got = store.get(p["raw"])
        if got is None:
            raise BucketError(f"{store.url}/{p['raw']}: missing (its manifest references it)")
        if hashlib.sha256(got[0]).hexdigest() != p["sha256"]:
            raise BucketError(f"{store.url}/{p['raw']}: changed (its SHA-256 differs)")
        yield got[0]
