"""A local read-through copy of a sync bucket, for the readers (``et runs s3://...``;
docs/team.md "Reading the bucket").

:func:`mirror` lists the bucket's manifests (one listing of ``_manifests/``, never of the
parts), reads each, and brings a local runs folder up to date with them:
``<cache>/<project>/<run>/`` holds each producer's JSONL files (the committed parts,
appended in order: only parts not yet here are fetched), its small files and the run's
media, with the names they have in a run directory, so every local reader reads it as it
reads any runs folder. ``<cache>`` is ``$XDG_CACHE_HOME/expr_tracker/bucket/<hash of the
URL>/`` (``0700``, this user's), or ``cache_dir=``.

A manifest read and mirrored is remembered (``<cache>/.mirror-state.json``) with the tag
the listing gave it (S3's ETag): the next :func:`mirror` reads again only the manifests
whose tag changed, so a bucket of 1,000 unchanged runs costs one listing (one request per
1,000 manifests) and no read. :func:`mirror_url` takes a URL naming the bucket, one of its
projects or one run (``s3://bucket/prefix/<project>/<run>``), mirrors only that, and says
which local folder stands for it: what ``et history``, ``et query``, ``et trace`` ... read.

Everything comes from the bucket, which is untrusted input: manifests are checked
(:func:`expr_tracker.sync.layout.check_sync_manifest`: every file name exactly one of the
producer's own), a project or run name that is not one plain folder name (empty, ``.``,
``..``, holding ``/``, starting with ``.``) is refused and reported, each part and file is
compared with its SHA-256 before it is written, files are written only below the cache
folder (never through a link: a path whose real location is elsewhere is refused).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from expr_tracker.history import untrusted
from expr_tracker.history.paths import atomic_write
from expr_tracker.media.read import MAX_READ_BYTES
from expr_tracker.sync import layout
from expr_tracker.sync.bucket import BucketError, list_manifests, read_manifest
from expr_tracker.sync.store import MAX_OBJECT_BYTES, ObjectStore, StoreError, open_store

__all__ = ["MirrorResult", "mirror", "mirror_root", "mirror_url"]

_STATE = ".mirror-state.json"
#: runs copied at once by :func:`mirror` (threads; each a request at a time)
MIRROR_THREADS = 8


@dataclass
class MirrorResult:
    """``path``: the local runs folder; ``producers``: manifests read; ``fetched``: bytes
    downloaded; ``problems``: one line per producer not mirrored (and why)."""

    path: Path
    producers: int = 0
    fetched: int = 0
    unchanged: int = 0
    problems: list[str] = field(default_factory=list)
    #: runs dropped from the copy: their manifests are gone from the bucket
    dropped: int = 0
    #: the local folder standing for the URL given to :func:`mirror_url` (``path``, or a
    #: project's or a run's folder below it)
    target: Path | None = None


def mirror_root(url: str) -> Path:
    """The default local folder of a bucket URL's copy."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:32]
    return Path(base) / "expr_tracker" / "bucket" / digest


def _folder_name(value: str) -> bool:
    return (
        bool(value)
        and value not in (".", "..")
        and not value.startswith(".")
        and "/" not in value
        and "\x00" not in value
        and len(value.encode("utf-8", "replace")) <= 255
    )


def _inside(path: Path, root: Path) -> bool:
    real = os.path.realpath(path)
    base = os.path.realpath(root)
    return real.startswith(base.rstrip(os.sep) + os.sep)


def _sha_file(path: Path) -> str | None:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        return h.hexdigest()
    except OSError:
        return None


def _fetch(store: ObjectStore, key: str, sha: str, max_bytes: int = MAX_OBJECT_BYTES) -> bytes:
    got = store.get(key, max_bytes)
    if got is None:
        raise BucketError(f"{store.url}/{key}: missing (its manifest references it)")
    if hashlib.sha256(got[0]).hexdigest() != sha:
        raise BucketError(f"{store.url}/{key}: changed (its SHA-256 differs)")
    return got[0]


def _check_names(project: str, run: str) -> None:
    if not (_folder_name(project) and _folder_name(run)):
        raise BucketError(
            f"project {project[:80]!r} / run {run[:80]!r}: not plain folder names: not mirrored"
        )


def _mirror_producer(store: ObjectStore, root: Path, ident: tuple, res: MirrorResult) -> None:
    project, run, stream, rank = ident
    _check_names(project, run)
    m, _etag = read_manifest(store, project, run, stream, rank)
    if m is None:
        return
    run_dir = root / project / run
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not _inside(run_dir, root) or run_dir.is_symlink():
        raise BucketError(f"{project}/{run}: its folder lies outside {root}: not mirrored")
    for log in m["logs"].values():
        path = run_dir / log["file"]
        if path.is_symlink():
            path.unlink()
        have = path.stat().st_size if path.exists() else 0
        offsets = [p["offset"] for p in log["parts"]] + [log["bytes"]]
        if have not in offsets:  # not a prefix we wrote: start again
            have = 0
        with open(path, "r+b" if have else "wb") as f:
            f.truncate(have)
            f.seek(have)
            for p in log["parts"]:
                if p["offset"] < have:
                    continue
                data = _fetch(store, p["raw"], p["sha256"])
                f.write(data)
                res.fetched += len(data)
    for name, info in m["files"].items():
        path = run_dir / name
        if path.is_symlink():
            path.unlink()
        if _sha_file(path) == info["sha256"]:
            continue
        data = _fetch(store, info["key"], info["sha256"])
        atomic_write(path, data)
        res.fetched += len(data)
    for rel, info in m["blobs"].items():
        path = run_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not _inside(path.parent, run_dir) or path.is_symlink():
            raise BucketError(f"{project}/{run}: {rel} would lie outside the run: not mirrored")
        if _sha_file(path) == info["sha256"]:
            continue
        # a media file: as large as the media readers read (docs/media.md), not a run file's
        data = _fetch(store, layout.blob_key(info["sha256"]), info["sha256"], MAX_READ_BYTES)
        atomic_write(path, data)
        res.fetched += len(data)


def _state_key(ident: tuple) -> str:
    project, run, stream, rank = ident
    return layout.manifest_key(project, run, stream, rank)


def _root_gone(store: ObjectStore) -> bool:
    """True for a ``file://`` store whose folder is not there (a share not mounted): its
    listing is empty, which must not read as a bucket whose runs were all removed."""
    from expr_tracker.sync.store import FileStore

    return isinstance(store, FileStore) and not store.root.is_dir()


def _real_dirs(folder: Path) -> list[str]:
    """Names of the folders in ``folder`` that are plain folder names and real folders (a
    link is never one: the copy never writes links, so one is not the copy's to drop)."""
    try:
        with os.scandir(folder) as it:
            return [e.name for e in it if _folder_name(e.name) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _drop_gone(
    root: Path, listed: set[tuple[str, str]], project: str | None, run: str | None
) -> tuple[int, list[str]]:
    """Delete from the copy ``root`` the run folders (of ``project``, of its ``run``, or
    all) that no manifest of the listing names: the bucket no longer has them (``et gc``,
    manifests deleted). Only real folders inside ``root`` are deleted (never through a
    link: ``shutil.rmtree`` unlinks a link inside, it does not follow it). Returns the
    number dropped and a line per folder that could not be."""
    projects = [project] if project is not None else _real_dirs(root)
    dropped, problems = 0, []
    for p in projects:
        pdir = root / p
        if pdir.is_symlink() or not _inside(pdir, root):
            continue
        for r in [run] if run is not None else _real_dirs(pdir):
            rdir = pdir / r
            if (p, r) in listed or rdir.is_symlink() or not rdir.is_dir():
                continue
            if not _inside(rdir, root):
                continue
            try:
                shutil.rmtree(rdir)
                dropped += 1
            except OSError as exc:
                problems.append(f"{p}/{r}: gone from the bucket, not dropped from the copy: {exc}")
        if project is None or run is not None:
            try:
                pdir.rmdir()  # only an empty one
            except OSError:
                pass
    return dropped, problems


def _load_state(root: Path) -> dict[str, str]:
    try:
        data = untrusted.read_json(root / _STATE)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def mirror(
    url: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    endpoint_url: str | None = None,
    store: ObjectStore | None = None,
    project: str | None = None,
    run: str | None = None,
) -> MirrorResult:
    """Bring the local copy of the bucket at ``url`` up to date (only ``project``, or only
    its ``run``, when given); see the module docstring.

    A producer that cannot be mirrored (a manifest not valid, a part missing or changed, a
    name that is no folder name) is reported in :attr:`MirrorResult.problems`; the others
    are mirrored. Raises ``ValueError`` for a URL that is not valid and
    :class:`~expr_tracker.sync.store.StoreError` when the store cannot be listed.
    """
    store = store if store is not None else open_store(url, endpoint_url=endpoint_url)
    root = Path(cache_dir) if cache_dir is not None else mirror_root(store.url)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    res = MirrorResult(path=root, target=root)
    state = _load_state(root)
    changed = False
    todo: dict[tuple[str, str], list[tuple[tuple, str]]] = {}
    listing = list_manifests(store, project, run)
    if not listing and _root_gone(store):
        # a folder unmounted is no empty bucket: the copy is kept as it is
        raise StoreError(f"{store.url}: not a folder (not there, or not readable)")
    # the copy mirrors the listing: runs whose manifests are gone leave it
    listed = {(ident[0], ident[1]) for ident, _tag in listing}
    res.dropped, dropped_problems = _drop_gone(root, listed, project, run)
    res.problems += dropped_problems
    for key in list(state):
        ident = layout.parse_manifest_key(key)
        in_scope = ident is not None and project in (None, ident[0]) and run in (None, ident[1])
        if ident is None or (in_scope and (ident[0], ident[1]) not in listed):
            del state[key]
            changed = True
    for ident, tag in listing:
        res.producers += 1
        key = _state_key(ident)
        if tag and state.get(key) == tag and (root / ident[0] / ident[1]).is_dir():
            res.unchanged += 1  # the same manifest as mirrored last time: no request
            continue
        todo.setdefault((ident[0], ident[1]), []).append((ident, tag))

    def one_run(producers: list[tuple[tuple, str]]) -> tuple[MirrorResult, dict[str, str | None]]:
        """A run's producers, one after the other (their files share the run's folder)."""
        part = MirrorResult(path=root)
        tags: dict[str, str | None] = {}
        for ident, tag in producers:
            try:
                _mirror_producer(store, root, ident, part)
            except (BucketError, StoreError, OSError) as exc:
                part.problems.append(str(exc))
                tags[_state_key(ident)] = None
                continue
            if tag:
                tags[_state_key(ident)] = tag
        return part, tags

    # runs are fetched MIRROR_THREADS at a time: a first copy is one request per object,
    # each waiting on the store (docs/team.md "Figures")
    if len(todo) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(MIRROR_THREADS, len(todo)), "et-mirror") as pool:
            done = list(pool.map(one_run, todo.values()))
    else:
        done = [one_run(p) for p in todo.values()]
    for part, tags in done:
        res.fetched += part.fetched
        res.problems += part.problems
        for key, got in tags.items():
            if got is None:
                changed |= state.pop(key, None) is not None
            else:
                state[key] = got
                changed = True
    if changed:
        try:
            atomic_write(root / _STATE, orjson.dumps(state))
        except OSError:
            pass  # a hint only: the next mirror reads every manifest again
    return res


def mirror_url(
    url: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    endpoint_url: str | None = None,
) -> MirrorResult:
    """Mirror what ``url`` names and set :attr:`MirrorResult.target` to its local folder:
    the bucket (``s3://bucket/prefix``: a runs folder), one project
    (``.../<project>``: its folder) or one run (``.../<project>/<run>``: the run
    directory). The URL is read as a bucket first; when it holds no manifest, its last one
    or two path segments are read as a project and a run of the bucket above.

    Raises ``ValueError`` for a URL that is not valid or names nothing with a manifest
    (saying what was looked for), :class:`~expr_tracker.sync.store.StoreError` when the
    store cannot be listed.
    """
    from urllib.parse import unquote

    head, sep, path = url.partition("://")
    if not sep:
        head, path = "", url
    segments = path.rstrip("/").split("/")
    first = 1 if head == "s3" else 0  # an s3:// URL's first segment is the bucket
    for cut in (0, 1, 2):
        if len(segments) - cut <= first or (cut and not segments[-1]):
            break
        base_path = "/".join(segments[: len(segments) - cut])
        base = f"{head}{sep}{base_path}" if sep else base_path
        tail = [unquote(x) for x in segments[len(segments) - cut :]]
        if any(not _folder_name(x) for x in tail):
            continue
        store = open_store(base, endpoint_url=endpoint_url)
        if cut == 0 and _root_gone(store):  # a project's or run's URL of a folder bucket
            continue
        if cut and not list_manifests(store, *tail):
            continue
        copy = Path(cache_dir) if cache_dir is not None else mirror_root(store.url)
        fresh = not copy.exists()
        res = mirror(
            base,
            cache_dir=cache_dir,
            store=store,
            project=tail[0] if tail else None,
            run=tail[1] if cut == 2 else None,
        )
        if cut == 0 and res.producers == 0:
            if fresh:  # no bucket there: the empty copy this lookup made goes again
                with contextlib.suppress(OSError):
                    (copy / _STATE).unlink(missing_ok=True)
                    copy.rmdir()
            continue
        res.target = res.path.joinpath(*tail)
        return res
    raise ValueError(
        f"{url}: no run synced there (no manifest under _manifests/ of this URL, nor of "
        "the bucket above it with the last segments read as <project>/<run>)"
    )
