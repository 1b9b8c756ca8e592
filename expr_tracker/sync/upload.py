"""``et sync DIR URL``: upload every run under a folder to a bucket, incrementally
(docs/team.md "How a sync commits").

Per producer (a run's stream and rank), one pass:

1. read its manifest and ETag from the bucket (none yet: an empty one);
2. for each JSONL file (metrics, spans, alerts, artifacts): check that the local file still
   holds what the manifest's last part holds (its bytes hashed again: a run replaced by
   another of the same name, or another host's same rank, is refused, never merged), then
   cut what was appended since into parts of complete lines (a torn last line waits for its
   newline), at most :data:`PART_BYTES` each: each part is uploaded as its raw JSONL
   segment and, for metrics and spans, as Parquet (the query cache's schemas, decoded by
   :mod:`expr_tracker.query.scan`), both named by the segment's SHA-256;
3. small files (``run*.json``, ``summary*``, the metrics sidecar, ``metric_defs*``,
   ``config*``, ``spec.json``) whose content changed are uploaded under their hash; media
   files (the run's ``media/`` folder, listed in the manifest of the run's first producer)
   go to ``_blobs/sha256/<hash>`` unless an object has that name already;
4. the new manifest is written with a conditional write: ``If-None-Match: *`` for the
   first, ``If-Match: <ETag read>`` after. Losing (another syncer committed first) means
   reading the manifest again and redoing 2-4 from what is now committed: nothing
   committed by anyone is ever lost, and no line is in two parts.

A process killed anywhere leaves at most objects no manifest references: the next sync
does not see them (it starts from the manifest), ``et gc`` removes them.

Unchanged folders cost no request: after each commit the producer's local files'
(size, mtime, inode) are recorded in a state file of this user
(``$XDG_CACHE_HOME/expr_tracker/sync/<hash of URL>.json``); a producer whose files all
match is skipped without asking the bucket. The state is only a hint: ``full=True``
(``et sync --full``) ignores it (after the bucket was emptied by hand, say).
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from expr_tracker.errors import ExprTrackerError
from expr_tracker.history import untrusted
from expr_tracker.query import scan
from expr_tracker.query.catalog import Producer, discover, producers_of
from expr_tracker.sync import layout
from expr_tracker.sync.bucket import BucketError, read_manifest
from expr_tracker.sync.store import ObjectStore, PreconditionFailed, StoreError, open_store

__all__ = ["PART_BYTES", "SyncError", "SyncReport", "sync_dir"]

#: the most bytes of JSONL one part holds (a bigger backlog becomes several parts)
PART_BYTES = 64 << 20
#: conditional writes lost in a row before a producer is reported as not synced
MAX_COMMIT_TRIES = 50
_MEDIA_MAX_FILES = 10_000


class SyncError(ExprTrackerError):
    """A producer that could not be synced (the message names the run, the file and why)."""


@dataclass
class SyncReport:
    """What one :func:`sync_dir` did. ``bytes``: bytes uploaded (objects' bodies, manifests
    included); ``objects``: objects written; ``commits``: manifests written; ``lost``:
    conditional writes another syncer won (each followed by a retry); ``unchanged``:
    producers skipped without a request; ``errors``: one line per producer not synced;
    ``skipped``: one line per media file that could not be read (a FIFO, no permission):
    left out, the rest of its run synced, tried again next time."""

    runs: int = 0
    producers: int = 0
    unchanged: int = 0
    commits: int = 0
    lost: int = 0
    objects: int = 0
    bytes: int = 0
    errors: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _state_path(url: str, state_dir: str | os.PathLike[str] | None) -> Path:
    if state_dir is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        state_dir = os.path.join(base, "expr_tracker", "sync")
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:32]
    return Path(state_dir) / f"{digest}.json"


def _load_state(path: Path) -> dict[str, Any]:
    try:
        data = untrusted.read_json(path)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_state(path: Path, state: dict[str, Any]) -> None:
    from expr_tracker.history.paths import atomic_write

    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(path, orjson.dumps(state))
    except OSError:
        pass  # a hint only: the next sync asks the bucket instead


def _project(p: Producer) -> str:
    return p.project or p.run_dir.parent.name or "default"


def _listing(run_dir: Path) -> dict[str, tuple[int, int, int, bool]]:
    """``name -> (size, mtime_ns, inode, is a folder)`` of a run directory's entries, from
    one ``scandir`` (links not followed): what decides whether a producer changed."""
    out: dict[str, tuple[int, int, int, bool]] = {}
    try:
        with os.scandir(run_dir) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                out[e.name] = (
                    st.st_size,
                    st.st_mtime_ns,
                    st.st_ino,
                    e.is_dir(follow_symlinks=False),
                )
    except OSError:
        pass
    return out


class _Files:
    """The local files of one producer, as the sync sees them (``listing``: the run
    directory's, from :func:`_listing`)."""

    def __init__(self, p: Producer, first_of_run: bool, listing: dict[str, Any]):
        d = p.run_dir
        self.logs: dict[str, Path] = {}
        names: list[str] = []
        for kind in layout.LOG_KINDS:
            path = getattr(p, kind)
            if path is not None:
                self.logs[kind] = path
                names.append(path.name)
        small = [n for n in layout.small_files(p.stream, p.rank) if n in listing]
        self.small = [d / n for n in small]
        names += small
        media = listing.get("media")
        self.media = d / "media" if first_of_run and media is not None and media[3] else None
        self._sig: list[Any] = [[n, *listing.get(n, ())] for n in names]

    def media_files(self, root: Path) -> list[tuple[str, Path]]:
        if self.media is None or not self.media.is_dir() or self.media.is_symlink():
            return []
        out: list[tuple[str, Path]] = []
        for dirpath, dirnames, filenames in os.walk(self.media):
            dirnames[:] = sorted(n for n in dirnames if not n.startswith("."))
            for n in sorted(filenames):
                if n.startswith("."):
                    continue
                path = Path(dirpath) / n
                rel = path.relative_to(self.media.parent).as_posix()
                if layout.MEDIA_RE.match(rel) and not path.is_symlink():
                    out.append((rel, path))
                if len(out) >= _MEDIA_MAX_FILES:
                    return out
        return out

    def signature(self) -> list[Any]:
        """What the producer's files look like now (sizes, mtimes, inodes; the media
        folder's files too), compared with the state file's record."""
        sig = list(self._sig)
        if self.media is not None:
            for dirpath, _dirs, files in os.walk(self.media):
                for f in sorted(files):
                    try:
                        st = os.lstat(os.path.join(dirpath, f))
                        sig.append(
                            [os.path.join(dirpath, f), st.st_size, st.st_mtime_ns, st.st_ino]
                        )
                    except OSError:
                        sig.append([os.path.join(dirpath, f)])
        return sig


def _sha(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def _parquet(kind: str, chunk: bytes, first_line: int) -> bytes:
    import pyarrow.parquet as pq

    if kind == "metrics":
        table, _steps = scan.decode_metrics_block(chunk, first_line)
    else:
        table = scan.decode_spans_block(chunk, first_line)
    buf = io.BytesIO()
    pq.write_table(table, buf, **scan.WRITE_OPTIONS[kind])
    return buf.getvalue()


class _ProducerSync:
    """One producer's pass (steps 2-3 of the module's docstring) against one manifest."""

    def __init__(
        self,
        store: ObjectStore,
        p: Producer,
        files: _Files,
        report: SyncReport,
        uploaded: set[str],
        part_bytes: int,
    ):
        self.store = store
        self.p = p
        self.files = files
        self.report = report
        self.uploaded = uploaded
        self.part_bytes = part_bytes
        self.project = _project(p)
        self.where = f"{self.project}/{p.name} ({layout.producer_id(p.stream, p.rank)})"

    def _put(self, key: str, data: bytes) -> None:
        if key in self.uploaded:
            return
        self.store.put(key, data)
        self.uploaded.add(key)
        self.report.objects += 1
        self.report.bytes += len(data)

    def extend(self, m: dict[str, Any]) -> bool:
        """Bring manifest ``m`` (changed in place) up to the local files; True when changed."""
        changed = False
        for kind, path in self.files.logs.items():
            changed |= self._extend_log(m, kind, path)
        for path in self.files.small:
            changed |= self._small(m, path)
        for rel, path in self.files.media_files(self.p.root):
            changed |= self._blob(m, rel, path)
        return changed

    def _extend_log(self, m: dict[str, Any], kind: str, path: Path) -> bool:
        log = m["logs"].get(kind)
        if log is None:
            log = {"file": path.name, "bytes": 0, "lines": 0, "parts": []}
        elif log["file"] != path.name:
            raise SyncError(
                f"{self.where}: the bucket's {kind} file is {log['file']!r}, not {path.name!r}"
            )
        try:
            fd = untrusted.open_regular(path, root=self.p.root)
        except OSError as exc:
            raise SyncError(
                f"{self.where}: {path.name}: cannot be read ({exc.strerror or exc})"
            ) from None
        changed = False
        try:
            size = os.fstat(fd).st_size
            done = log["bytes"]
            if size < done:
                raise SyncError(
                    f"{self.where}: {path.name} holds {size:,} bytes, fewer than the "
                    f"{done:,} the bucket holds (another run of the same name?): not synced"
                )
            if log["parts"]:
                last = log["parts"][-1]
                if _sha(os.pread(fd, last["bytes"], last["offset"])) != last["sha256"]:
                    raise SyncError(
                        f"{self.where}: {path.name} differs from what the bucket holds "
                        "(another run, or another host's producer, of the same name): not synced"
                    )
            while done < size:
                want = min(self.part_bytes, size - done)
                block = os.pread(fd, want, done)
                cut = block.rfind(b"\n")
                if cut < 0:
                    if want < size - done:  # one line longer than a part: read it whole
                        block = _read_line(fd, done, size)
                        cut = len(block) - 1 if block.endswith(b"\n") else -1
                    if cut < 0:
                        break  # a torn last line: it waits for its newline
                chunk = block[: cut + 1]
                sha = _sha(chunk)
                lines = chunk.count(b"\n")
                raw, pq = layout.part_keys(
                    self.project,
                    self.p.name,
                    self.p.stream,
                    self.p.rank,
                    kind,
                    path.name,
                    log["lines"],
                    sha,
                )
                self._put(raw, chunk)
                if pq is not None:
                    self._put(pq, _parquet(kind, chunk, log["lines"]))
                log["parts"].append(
                    {
                        "line": log["lines"],
                        "offset": done,
                        "lines": lines,
                        "bytes": len(chunk),
                        "sha256": sha,
                        "raw": raw,
                        "parquet": pq,
                    }
                )
                log["lines"] += lines
                done += len(chunk)
                log["bytes"] = done
                changed = True
        finally:
            os.close(fd)
        if changed:
            m["logs"][kind] = log
        return changed

    def _small(self, m: dict[str, Any], path: Path) -> bool:
        try:
            data = untrusted.read_regular(path, root=self.p.root)
        except OSError as exc:
            raise SyncError(
                f"{self.where}: {path.name}: cannot be read ({exc.strerror or exc})"
            ) from None
        sha = _sha(data)
        old = m["files"].get(path.name)
        if old is not None and old["sha256"] == sha:
            return False
        key = layout.file_key(self.project, self.p.name, path.name, sha)
        self._put(key, data)
        m["files"][path.name] = {"key": key, "sha256": sha, "size": len(data)}
        return True

    def _blob(self, m: dict[str, Any], rel: str, path: Path) -> bool:
        old = m["blobs"].get(rel)
        named = _HASHED_MEDIA.match(rel)
        if old is not None and named is not None and old.get("sha256") == named.group(1):
            # content-addressed (media/<sha256>.<ext>, docs/media.md): already in the
            # manifest under its hash, so not read again (each background pass would
            # otherwise re-hash the whole media folder)
            return False
        try:
            fd = untrusted.open_regular(path, root=self.p.root)
        except OSError as exc:
            # one unreadable media file must not hold back the run's metrics: left out,
            # reported, and tried again by the next sync (media are not in the state's sig)
            self.report.skipped.append(
                f"{self.where}: {rel}: cannot be read ({exc.strerror or exc}): not synced"
            )
            return False
        try:
            h = hashlib.sha256()
            size = 0
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    break
                h.update(b)
                size += len(b)
            sha = h.hexdigest()
            old = m["blobs"].get(rel)
            if old is not None and old["sha256"] == sha:
                return False
            key = layout.blob_key(sha)
            if key not in self.uploaded and not self.store.exists(key):
                data = os.pread(fd, size, 0)
                self._put(key, data)
            self.uploaded.add(key)
        finally:
            os.close(fd)
        m["blobs"][rel] = {"sha256": sha, "size": size}
        return True


#: a media file named by its content's SHA-256 (expr_tracker/media/store.py)
_HASHED_MEDIA = re.compile(r"^media/([0-9a-f]{64})\.[a-z.]{1,16}$")


def _read_line(fd: int, start: int, size: int) -> bytes:
    """From ``start``: bytes up to and including the next newline (or to ``size``)."""
    out = bytearray()
    pos = start
    while pos < size:
        b = os.pread(fd, min(1 << 24, size - pos), pos)
        if not b:
            break
        i = b.find(b"\n")
        if i >= 0:
            out += b[: i + 1]
            return bytes(out)
        out += b
        pos += len(b)
    return bytes(out)


def _empty_manifest(project: str, p: Producer) -> dict[str, Any]:
    return {
        "version": layout.MANIFEST_VERSION,
        "project": project,
        "run": p.name,
        "stream": p.stream or "",
        "rank": p.rank,
        "logs": {},
        "files": {},
        "blobs": {},
    }


def _sync_producer(
    store: ObjectStore,
    p: Producer,
    files: _Files,
    report: SyncReport,
    uploaded: set[str],
    part_bytes: int,
    sleep: Callable[[float], None],
) -> None:
    job = _ProducerSync(store, p, files, report, uploaded, part_bytes)
    key = layout.manifest_key(job.project, p.name, p.stream, p.rank)
    for attempt in range(MAX_COMMIT_TRIES):
        m, etag = read_manifest(store, job.project, p.name, p.stream, p.rank)
        if m is None:
            m = _empty_manifest(job.project, p)
        if not job.extend(m):
            return
        data = orjson.dumps(m)
        try:
            if etag is None:
                store.put(key, data, if_none_match=True)
            else:
                store.put(key, data, if_match=etag)
        except PreconditionFailed:
            report.lost += 1
            sleep(random.uniform(0, min(1.0, 0.01 * 2**attempt)))
            continue
        report.commits += 1
        report.objects += 1
        report.bytes += len(data)
        return
    raise SyncError(f"{job.where}: lost {MAX_COMMIT_TRIES} commits in a row to other syncers")


def sync_dir(
    root: str | os.PathLike[str],
    url: str,
    *,
    store: ObjectStore | None = None,
    endpoint_url: str | None = None,
    full: bool = False,
    state_dir: str | os.PathLike[str] | None = None,
    part_bytes: int = PART_BYTES,
    sleep: Callable[[float], None] = time.sleep,
    select: Callable[[Producer], bool] | None = None,
) -> SyncReport:
    """Upload every run under ``root`` (a runs folder or one run directory) to ``url``
    (``s3://bucket/prefix`` or ``file:///path``), incrementally; see the module docstring.

    A producer that cannot be synced (unreadable, refused, a store error) is reported in
    :attr:`SyncReport.errors` and the others go on. ``select``: only the producers it
    returns True for are synced (a training process syncs its own files: docs/team.md
    "Sync during training"); a run's media go with its first producer all the same.

    Raises ``FileNotFoundError`` when ``root`` is not a folder, ``ValueError`` for a URL
    that is not valid, :class:`~expr_tracker.sync.store.StoreError` when the store cannot be
    opened (the ``team`` extra missing).
    """
    store = store if store is not None else open_store(url, endpoint_url=endpoint_url)
    state_file = _state_path(store.url, state_dir)
    state = {} if full else _load_state(state_file)
    new_state: dict[str, Any] = dict(state)
    report = SyncReport()
    # a whole run directory whose entries (names, sizes, mtimes, inodes) are the ones
    # recorded after its last clean sync is skipped before its run.json is even read: a
    # re-sync of 1,000 unchanged runs is one scandir per run (docs/team.md "Figures")
    listings: dict[Path, dict[str, Any]] = {}
    skipped: list[Path] = []

    def per_dir(run_dir: Path) -> list[Producer]:
        listing = listings[run_dir] = _listing(run_dir)
        if select is None and not full:
            rec = state.get(_dir_key(run_dir))
            if isinstance(rec, dict) and rec.get("sig") == _dir_sig(listing):
                skipped.append(run_dir)
                report.runs += 1
                report.producers += int(rec.get("producers") or 0)
                report.unchanged += int(rec.get("producers") or 0)
                return []
        return producers_of(run_dir)

    producers = discover(root, per_dir=per_dir)
    uploaded: set[str] = set()
    seen_dirs: set[Path] = set()
    listing: dict[str, Any] = {}
    listed: Path | None = None
    failed_dirs: set[Path] = set()
    counts: dict[Path, int] = {}
    try:
        for p in producers:
            if p.unlisted:
                continue
            first = p.run_dir not in seen_dirs
            if first:
                seen_dirs.add(p.run_dir)
            if select is not None and not select(p):
                continue
            if first or p.run_dir != listed:
                listed = p.run_dir
                report.runs += 1
                listing = listings.get(p.run_dir) or _listing(p.run_dir)
            report.producers += 1
            counts[p.run_dir] = counts.get(p.run_dir, 0) + 1
            files = _Files(p, first, listing)
            skey = f"{p.root}\0{layout.producer_id(p.stream, p.rank)}"
            sig = files.signature()
            if not full and state.get(skey) == sig:
                report.unchanged += 1
                continue
            try:
                _sync_producer(store, p, files, report, uploaded, part_bytes, sleep)
            except (SyncError, StoreError, BucketError) as exc:
                report.errors.append(str(exc))
                new_state.pop(skey, None)
                failed_dirs.add(p.run_dir)
                continue
            new_state[skey] = sig
        if select is None:
            for run_dir, n in counts.items():
                key = _dir_key(run_dir)
                listing = listings.get(run_dir, {})
                media = listing.get("media")
                if run_dir in failed_dirs or (media is not None and media[3]):
                    new_state.pop(key, None)  # a media folder's files are not in the sig
                else:
                    new_state[key] = {"sig": _dir_sig(listing), "producers": n}
    finally:
        _save_state(state_file, new_state)
    return report


def _dir_key(run_dir: Path) -> str:
    return f"dir\0{os.path.realpath(run_dir)}"


def _dir_sig(listing: dict[str, Any]) -> list[Any]:
    return [[name, *listing[name]] for name in sorted(listing)]
