"""The bucket layout of ``et sync``: object keys and the per-producer manifest (the contract
written down in docs/team.md "Layout").

Keys, relative to the URL's prefix (``<P>``, ``<R>``: project and run name, ``<S>``: the
stream, empty for the main one, ``<N>``: the rank; each value percent-encoded outside
``[A-Za-z0-9._-]``)::

    _manifests/project=<P>/run=<R>/<producer>.json            the commit points
    metrics/project=<P>/run=<R>/stream=<S>/rank=<N>/part-<line>-<hash>.parquet
    spans/project=<P>/run=<R>/stream=<S>/rank=<N>/part-<line>-<hash>.parquet
    _raw/project=<P>/run=<R>/<file>/part-<line>-<hash>.jsonl   the JSONL lines themselves
    _files/project=<P>/run=<R>/<file>/<hash>                   run.json, summary, config ...
    _blobs/sha256/<sha256>                                     media and artifact files

``<producer>`` is ``stream=<S>.rank=<N>``; ``<line>`` the first line's number (12 digits);
``<hash>`` the first 32 hex digits of the SHA-256 of the JSONL segment (of the file for
``_files``). Objects other than manifests are immutable: the same name always holds the
same bytes.

A manifest read back is untrusted input (it may be anyone's): :func:`check_sync_manifest`
accepts only the shape written here, with every key one this module would build for that
producer, so a hostile manifest cannot name an object outside its own run (or a path with
``..``) for a reader, a sync or ``et gc`` to follow.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from expr_tracker.history.paths import file_name

__all__ = [
    "LOG_KINDS",
    "MANIFEST_VERSION",
    "MEDIA_RE",
    "ManifestError",
    "PARQUET_KINDS",
    "blob_key",
    "check_sync_manifest",
    "file_key",
    "manifest_key",
    "part_keys",
    "parse_manifest_key",
    "producer_id",
    "referenced",
    "run_prefix",
    "small_files",
]

MANIFEST_VERSION = 1
#: per-producer JSONL files synced as parts (kind -> file stem)
LOG_KINDS = ("metrics", "spans", "alerts", "artifacts")
#: the kinds whose parts also get a Parquet object (the query cache's schemas)
PARQUET_KINDS = ("metrics", "spans")
_HEX = re.compile(r"^[0-9a-f]{64}$")
MEDIA_RE = re.compile(r"^media(/[A-Za-z0-9_.=+-]{1,255}){1,8}$")


def _enc(value: str) -> str:
    """Percent-encode everything outside ``[A-Za-z0-9._~-]`` (``/`` included): a value is
    always one key segment, and always after ``name=``, so never ``.`` or ``..``."""
    return quote(value, safe="")


def run_prefix(project: str, run: str) -> str:
    """``project=<P>/run=<R>`` (values percent-encoded)."""
    return f"project={_enc(project)}/run={_enc(run)}"


def producer_id(stream: str | None, rank: int) -> str:
    """``stream=<S>.rank=<N>`` (the main stream: an empty ``S``)."""
    return f"stream={_enc(stream or '')}.rank={int(rank)}"


def manifest_key(project: str, run: str, stream: str | None, rank: int) -> str:
    return f"_manifests/{run_prefix(project, run)}/{producer_id(stream, rank)}.json"


def part_keys(
    project: str, run: str, stream: str | None, rank: int, kind: str, file: str, line: int, sha: str
) -> tuple[str, str | None]:
    """``(raw JSONL key, Parquet key or None)`` of one part."""
    stem = f"part-{line:012d}-{sha[:32]}"
    raw = f"_raw/{run_prefix(project, run)}/{_enc(file)}/{stem}.jsonl"
    if kind not in PARQUET_KINDS:
        return raw, None
    pq = (
        f"{kind}/{run_prefix(project, run)}/stream={_enc(stream or '')}/rank={int(rank)}/"
        f"{stem}.parquet"
    )
    return raw, pq


def file_key(project: str, run: str, name: str, sha: str) -> str:
    return f"_files/{run_prefix(project, run)}/{_enc(name)}/{sha[:32]}"


def blob_key(sha: str) -> str:
    return f"_blobs/sha256/{sha}"


def small_files(stream: str | None, rank: int) -> tuple[str, ...]:
    """The names of the small files a producer's manifest may list: its ``run``,
    ``summary``, metrics sidecar and ``metric_defs`` files; rank 0 also its stream's
    ``config``, and the main stream's rank 0 ``spec.json``."""
    names = [file_name(k, stream, rank) for k in ("run", "summary", "meta", "metric_defs")]
    if rank == 0:
        names.append(file_name("config", stream))
        if not stream:
            names.append("spec.json")
    return tuple(names)


class ManifestError(ValueError):
    """A manifest that is not one this module writes (the message says what is wrong)."""


def _int(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def check_sync_manifest(
    m: Any, project: str, run: str, stream: str | None, rank: int
) -> dict[str, Any]:
    """Return ``m`` when it is a manifest of exactly this producer, else raise
    :class:`ManifestError` (a ``ValueError``) saying why.

    Checked: the version, the identity, each log's parts contiguous from line 0 and byte 0
    (``line``/``offset`` of a part = the previous part's end) with their keys the ones
    :func:`part_keys` builds, each file's key the one :func:`file_key` builds, each blob a
    ``media/...`` name with a 64-hex SHA-256.
    """
    if not isinstance(m, dict):
        raise ManifestError("not a JSON object")
    if m.get("version") != MANIFEST_VERSION:
        raise ManifestError(f"version {m.get('version')!r} (this reader knows {MANIFEST_VERSION})")
    ident = (m.get("project"), m.get("run"), m.get("stream") or None, m.get("rank"))
    if ident != (project, run, stream or None, rank):
        raise ManifestError("names another producer than its key")
    logs = m.get("logs")
    if not isinstance(logs, dict) or not set(logs) <= set(LOG_KINDS):
        raise ManifestError("'logs' is not a mapping of metrics/spans/alerts/artifacts")
    for kind, log in logs.items():
        if not isinstance(log, dict) or not isinstance(log.get("parts"), list):
            raise ManifestError(f"logs.{kind} has no parts list")
        file = log.get("file")
        if file != file_name(kind, stream, rank):
            raise ManifestError(f"logs.{kind}.file {str(file)[:80]!r} is not a {kind} file name")
        line = offset = 0
        for i, p in enumerate(log["parts"]):
            if not isinstance(p, dict):
                raise ManifestError(f"logs.{kind}.parts[{i}] is not an object")
            if p.get("line") != line or p.get("offset") != offset:
                raise ManifestError(f"logs.{kind}.parts[{i}] does not follow the previous part")
            if not (_int(p.get("lines"), 1) and _int(p.get("bytes"), 1)):
                raise ManifestError(f"logs.{kind}.parts[{i}] has no lines or bytes")
            sha = p.get("sha256")
            if not isinstance(sha, str) or not _HEX.match(sha):
                raise ManifestError(f"logs.{kind}.parts[{i}].sha256 is not a SHA-256")
            raw, pq = part_keys(project, run, stream, rank, kind, file, line, sha)
            if p.get("raw") != raw or p.get("parquet") != pq:
                raise ManifestError(f"logs.{kind}.parts[{i}] names objects of another part")
            line += p["lines"]
            offset += p["bytes"]
        if log.get("lines") != line or log.get("bytes") != offset:
            raise ManifestError(f"logs.{kind} totals do not match its parts")
    files = m.get("files", {})
    if not isinstance(files, dict):
        raise ManifestError("'files' is not a mapping")
    for name, f in files.items():
        if name not in small_files(stream, rank) or not isinstance(f, dict):
            raise ManifestError(f"files entry {str(name)[:80]!r} is not a file of this producer")
        sha = f.get("sha256")
        if not isinstance(sha, str) or not _HEX.match(sha) or not _int(f.get("size")):
            raise ManifestError(f"files.{name} has no SHA-256 or size")
        if f.get("key") != file_key(project, run, name, sha):
            raise ManifestError(f"files.{name} names another object")
    blobs = m.get("blobs", {})
    if not isinstance(blobs, dict):
        raise ManifestError("'blobs' is not a mapping")
    for name, b in blobs.items():
        if not isinstance(name, str) or not MEDIA_RE.match(name) or ".." in name.split("/"):
            raise ManifestError(f"blobs entry {str(name)[:80]!r} is not a media/... name")
        if not isinstance(b, dict) or not isinstance(b.get("sha256"), str):
            raise ManifestError(f"blobs.{name} has no SHA-256")
        if not _HEX.match(b["sha256"]) or not _int(b.get("size")):
            raise ManifestError(f"blobs.{name} has no SHA-256 or size")
    return m


def referenced(m: dict[str, Any]) -> set[str]:
    """Every key a checked manifest references."""
    keys: set[str] = set()
    for log in m.get("logs", {}).values():
        for p in log["parts"]:
            keys.add(p["raw"])
            if p["parquet"]:
                keys.add(p["parquet"])
    for f in m.get("files", {}).values():
        keys.add(f["key"])
    for b in m.get("blobs", {}).values():
        keys.add(blob_key(b["sha256"]))
    return keys


_MANIFEST_KEY = re.compile(
    r"^_manifests/project=([^/]*)/run=([^/]*)/stream=([^/]*)\.rank=(\d{1,9})\.json$"
)


def parse_manifest_key(key: str) -> tuple[str, str, str | None, int] | None:
    """``(project, run, stream or None, rank)`` of a manifest key, None for any other key
    (or one whose values do not read back to the same key: a hand-made name)."""
    from urllib.parse import unquote

    m = _MANIFEST_KEY.match(key)
    if not m:
        return None
    project, run, stream = (unquote(g) for g in m.group(1, 2, 3))
    rank = int(m.group(4))
    if not project or not run or manifest_key(project, run, stream or None, rank) != key:
        return None
    return project, run, stream or None, rank
