"""The per-project artifact store: ``<dir>/<project>/artifacts/``.

Layout::

    artifacts/
      index.jsonl                 the commit log: one line per published version
                                  ({"kind": "version", ...}) or alias move ({"kind": "alias"})
      .index.lock                 flock: one appender at a time
      <name>/
        .lock                     flock: one publisher of this artifact at a time
        v0/                       the files, exactly as named in the artifact (versions
        v0.manifest.json          count from v0, as in wandb); per file name, size, sha256;
                                  references; digest; type ...
        .staging-<pid>-<hex>/     a version being written (never listed; removed when stale)
        .staging-<pid>-<hex>.lock flock held by its writer while it lives

Publishing a version (:meth:`ArtifactStore.log`): the files are staged (copied, or
hard-linked in ``link`` mode, and hashed) into a staging directory beside the versions, without any lock held.
Then, under the artifact's lock: a version with the same digest is returned as it is (new
aliases are recorded); otherwise leftovers of a crashed publisher (version directories or
manifests the index does not list) are removed, the next number taken, the manifest
written, the staging directory renamed to ``v<N>`` and, last, one line appended to the
index under its lock. That line is the commit point: readers list only what the index
lists, so a process killed at any moment leaves no half version, and a failure (a full
disk) undoes what it made before raising. Aliases live in the index too (a version line
carries the aliases given with it; a later alias line moves one), so a version and its
aliases are committed by one append.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from expr_tracker.artifacts.errors import (
    ArtifactCorruptedError,
    ArtifactError,
    ArtifactNotFoundError,
    ArtifactTypeError,
)
from expr_tracker.artifacts.files import (
    LINK_FALLBACK,
    append_line,
    copy_hashed,
    dir_mode,
    hash_file,
    hold,
    locked,
    read_jsonl,
    try_lock,
)
from expr_tracker.artifacts.model import (
    SHA256_RE,
    Artifact,
    ArtifactVersion,
    version_digest,
)
from expr_tracker.artifacts.names import (
    VERSION_RE,
    validate_alias,
    validate_aliases,
    validate_name,
)
from expr_tracker.history.paths import atomic_write

MODES = ("link", "copy")
INDEX = "index.jsonl"
STAGING_PREFIX = ".staging-"
_MANIFEST_RE = re.compile(r"^v([0-9]+)\.manifest\.json$")
MANIFEST_FORMAT = 1
#: seconds before an abandoned staging directory or lock file may be removed
STALE_AFTER_S = 60.0
#: the largest manifest read (about 5 million files); a larger one is refused unread
MAX_MANIFEST = 1 << 30


def manifest_name(version: int) -> str:
    return f"v{version}.manifest.json"


class ArtifactStore:
    """The artifacts of one project under ``root`` (``<dir>/<project>/artifacts``).

    ``mode``: ``copy`` (the default: always copy, a reflink clone where the file system has
    one; stored copies are read-only, so nothing the user does to a source changes a
    version) or ``link`` (hard-link files when the file system allows, copy otherwise; a
    source rewritten in place changes its linked version). Reading needs no lock; writing
    is safe across threads and processes of one host (``flock``).

    Versions count from 0 (``v0`` is the first, as in wandb); a store whose first version
    is ``v1`` (written before) goes on from its highest number.
    """

    def __init__(self, root: str | os.PathLike[str], mode: str = "copy") -> None:
        self.root = Path(root)
        self.mode = check_mode(mode)
        self._local = threading.local()

    @property
    def notices(self) -> list[str]:
        """Warnings of this thread's last :meth:`log` (a linked earlier version rewritten in
        place); per thread, so a log in another thread never resets them."""
        notices = getattr(self._local, "notices", None)
        if notices is None:
            notices = self._local.notices = []
        return notices

    @notices.setter
    def notices(self, value: list[str]) -> None:
        self._local.notices = value

    # ------------------------------------------------------------------ reading

    @property
    def skipped(self) -> int:
        """How many index lines this thread's last :meth:`catalog` skipped as bad (not
        JSON, nested too deeply, a lone surrogate, not a version or alias record of valid
        names); a torn last line is not counted. Callers report it (``et artifacts`` on
        stderr, a run as one warning)."""
        return getattr(self._local, "skipped", 0)

    def records(self) -> list[dict[str, Any]]:
        """The index's committed lines, in order (a torn last line and bad lines are
        skipped: :attr:`skipped` counts the bad ones).

        Raises:
            ArtifactCorruptedError: the index is not a regular file (a FIFO, a device) or
                lies outside the store.
            ArtifactError: it exists but cannot be read (a permission).
        """
        return self._read_index()[0]

    def _read_index(self) -> tuple[list[dict[str, Any]], int]:
        from expr_tracker.history.untrusted import UnsafeFileError

        path = self.root / INDEX
        try:
            return read_jsonl(path, root=self.root)
        except UnsafeFileError as exc:
            raise ArtifactCorruptedError(
                f"the index {path} cannot be read: {exc.reason}; nothing was read from it"
            ) from None
        except OSError as exc:
            raise ArtifactError(f"the index {path} cannot be read: {exc}") from None

    def catalog(self) -> dict[str, dict[str, Any]]:
        """name -> {"versions": {N: index line}, "aliases": {alias: N}} from the index.
        The first line of a version wins; an alias points where it was last given. A
        version a ``removed`` line names (:meth:`remove_version`) is left out, its number
        kept in ``"removed"`` (never given again).

        Every line is untrusted: one whose name, version (an ``int`` from 0), digest (64
        hex digits) or alias is not valid is skipped and counted in :attr:`skipped`.

        Raises:
            ArtifactError: as :meth:`records`.
        """
        from expr_tracker.artifacts.errors import ArtifactNameError

        records, bad = self._read_index()
        out: dict[str, dict[str, Any]] = {}
        removed: set[tuple[str, int]] = set()
        for rec in records:
            name, version, kind = rec.get("name"), rec.get("version"), rec.get("kind")
            try:
                validate_name(name)
                if type(version) is not int or version < 0:
                    raise ValueError
                if kind == "version":
                    digest = rec.get("digest")
                    if not isinstance(digest, str) or not SHA256_RE.match(digest):
                        raise ValueError
                    given = rec.get("aliases") or []
                    if not isinstance(given, list):
                        raise ValueError
                    aliases = [a for a in given if a != "latest" and _is_alias(a)]
                    if len(aliases) < len([a for a in given if a != "latest"]):
                        bad += 1  # the version stands; its bad aliases do not
                elif kind == "alias":
                    aliases = [validate_alias(rec.get("alias"))]
                elif kind == "removed":  # et gc --artifacts: the version is gone
                    removed.add((name, version))
                    continue
                else:
                    raise ValueError
            except (ValueError, ArtifactNameError):
                bad += 1
                continue
            item = out.setdefault(name, {"versions": {}, "aliases": {}})
            if kind == "version":
                item["versions"].setdefault(version, rec)
            for alias in aliases:
                item["aliases"][alias] = version
        for name, version in removed:
            if name in out:
                out[name]["versions"].pop(version, None)
                out[name].setdefault("removed", set()).add(version)
        # an alias given with a version that never made it (cannot happen) points nowhere
        for item in out.values():
            item["aliases"] = {a: v for a, v in item["aliases"].items() if v in item["versions"]}
        self._local.skipped = bad
        return {k: out[k] for k in sorted(out) if out[k]["versions"]}

    def names(self) -> list[str]:
        """The names of the artifacts with at least one version, sorted."""
        return list(self.catalog())

    def get(self, name: str, selector: str = "latest") -> ArtifactVersion:
        """The version ``selector`` (``latest``, ``v<N>`` or an alias) of ``name``.

        Raises:
            ArtifactNotFoundError: no such artifact, version or alias (the message lists
                what exists and close names).
            ArtifactCorruptedError: the index lists it but its manifest is gone.
        """
        validate_name(name)
        catalog = self.catalog()
        item = catalog.get(name)
        if item is None:
            close = difflib.get_close_matches(name, list(catalog), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            have = ", ".join(list(catalog)[:20]) or "none"
            raise ArtifactNotFoundError(
                f"no artifact {name!r} in {self.root} (artifacts here: {have}){hint}"
            )
        versions = item["versions"]
        newest = max(versions)
        m = VERSION_RE.match(selector)
        if selector == "latest":
            version = newest
        elif m:
            version = int(m.group(1))
            if version not in versions:
                raise ArtifactNotFoundError(
                    f"artifact {name!r} has no version v{version} (versions: "
                    f"{', '.join(f'v{v}' for v in sorted(versions))})"
                )
        elif selector in item["aliases"]:
            version = item["aliases"][selector]
        else:
            have = ", ".join(sorted(item["aliases"])) or "none"
            raise ArtifactNotFoundError(
                f"artifact {name!r} has no alias {selector!r} (aliases: latest, {have}; or "
                f"a version v{min(versions)}..v{newest})"
            )
        return self._version(name, version, item, newest)

    def _version(self, name: str, version: int, item: dict[str, Any], newest: int):
        adir = self.root / name
        aliases = (["latest"] if version == newest else []) + sorted(
            a for a, v in item["aliases"].items() if v == version
        )
        found = ArtifactVersion(
            adir / f"v{version}", self._manifest(name, version), aliases, self.mode
        )
        listed = item["versions"].get(version, {}).get("digest")
        if (found.name, found.version) != (name, version) or found.digest != (
            listed or found.digest
        ):
            raise ArtifactCorruptedError(
                f"{name}:v{version}: the manifest {adir / manifest_name(version)} is not the "
                f"one the index {self.root / INDEX} lists (it holds {found.qualified_name}, "
                f"digest {found.digest[:16]}...; edited?); nothing of it was used"
            )
        return found

    def _manifest(self, name: str, version: int) -> Any:
        """The manifest of ``name:v<version>`` as decoded, read as untrusted input: a
        regular file inside the store (never a FIFO, never through a symbolic link out),
        at most ``MAX_MANIFEST`` bytes, depth-limited JSON. :class:`ArtifactVersion` checks its content.

        Raises:
            ArtifactCorruptedError: it cannot be read or is not JSON.
        """
        from expr_tracker.history.untrusted import UnsafeFileError, read_json

        path = self.root / name / manifest_name(version)
        try:
            return read_json(path, root=self.root, max_bytes=MAX_MANIFEST)
        except UnsafeFileError as exc:
            why = exc.reason
        except (OSError, ValueError) as exc:
            why = str(exc)
        raise ArtifactCorruptedError(
            f"{name}:v{version} is in the index of {self.root} but its manifest {path} cannot "
            f"be read ({why}); nothing of it was used"
        )

    def versions(self, name: str) -> list[ArtifactVersion]:
        """Every version of ``name``, oldest first ([] for an unknown name)."""
        item = self.catalog().get(name)
        if item is None:
            return []
        newest = max(item["versions"])
        out = []
        for v in sorted(item["versions"]):
            with contextlib.suppress(ArtifactCorruptedError):
                out.append(self._version(name, v, item, newest))
        return out

    # ------------------------------------------------------------------ writing

    def log(
        self,
        artifact: Artifact,
        *,
        aliases: Any = None,
        metadata: dict[str, Any] | None = None,
        run: dict[str, Any] | None = None,
        mode: str | None = None,
    ) -> tuple[ArtifactVersion, bool]:
        """Publish ``artifact`` as its next version; returns (the version, True), or (the
        existing version with the same digest, False) with ``aliases`` moved onto it.

        ``metadata`` (already JSON-able) replaces the artifact's; ``run`` (identity of the
        logging run) is recorded in the manifest and the index; ``mode`` (``copy`` or
        ``link``) is how this call stores its files, the store's :attr:`mode` when None.

        Raises:
            ValueError: a ``mode`` other than ``copy`` or ``link``.
            ArtifactNameError: a bad alias.
            ArtifactError: an empty artifact, a source file that cannot be read, a store
                that cannot be written (read-only, full disk). Nothing is published then
                and nothing is left but, after a kill, a staging directory that the next
                publisher of this artifact removes.
        """
        self.notices = []
        mode = self.mode if mode is None else check_mode(mode)
        aliases = validate_aliases(aliases)
        name = validate_name(artifact.name)
        files, refs = artifact.files, artifact.references
        if not files and not refs:
            raise ArtifactError(
                f"artifact {name!r} is empty: add files with add_file/add_dir or URIs with "
                "add_reference before logging it"
            )
        self._check_type(self.catalog().get(name), name, artifact.type)  # early: no copy
        adir = self.root / name
        try:
            adir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ArtifactError(
                f"cannot create the artifact store {adir} ({exc}); nothing was logged"
            ) from exc
        self.clean_staging(name)
        token = f"{STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        staging = adir / token
        lock_path = adir / f"{token}.lock"
        lock_file = None
        try:
            # a file object: closed (its flock released) even when an interrupt skips the
            # finally below; created before the directory (see clean_staging)
            lock_file = open(lock_path, "xb")  # noqa: SIM115
            hold(lock_file.fileno())
            staging.mkdir()
            entries, deferred = self._stage(files, staging, mode)
            references = [{"name": k, "uri": refs[k]} for k in sorted(refs)]
            digest = version_digest(entries, references)
            if deferred and not self._has_digest(name, digest):
                self.notices = self._rewritten(name, files, entries, deferred)
                self._copy_deferred(files, staging, entries, deferred)
                digest = version_digest(entries, references)
            with locked(adir / ".lock"):
                return self._publish(
                    artifact,
                    name,
                    adir,
                    staging,
                    entries,
                    references,
                    digest,
                    aliases,
                    metadata,
                    run,
                    mode,
                )
        except ArtifactError:
            raise  # ArtifactNotFoundError is an OSError too: never "cannot log"
        except OSError as exc:
            raise ArtifactError(
                f"cannot log artifact {name!r} to {self.root}: {exc}; nothing was published"
            ) from exc
        except UnicodeEncodeError as exc:  # the manifest is UTF-8: a lone surrogate fails
            raise ArtifactError(
                f"cannot log artifact {name!r}: its description or metadata holds a string "
                f"that is not valid UTF-8 ({exc}); nothing was published"
            ) from exc
        finally:
            with contextlib.suppress(OSError):
                if staging.exists():
                    _rmtree(staging)
            if lock_file is not None:
                with contextlib.suppress(OSError):
                    os.unlink(lock_path)
                lock_file.close()

    def _stage(
        self, files: dict[str, Path], staging: Path, mode: str
    ) -> tuple[list[dict[str, Any]], list[int]]:
        """Link (``mode`` ``link``) or copy every file into ``staging``, hashing it; returns
        (the manifest entries, the indexes of entries deferred).

        A linked file is hashed through its own descriptor with its stamps taken before and
        after (:func:`_hash_linked`): one written to while hashed is copied instead, and
        its stamps are recorded only when they can tell a later write apart (not racy).

        In ``link`` mode a source that already has other hard links (``st_nlink > 1``: most
        likely an earlier version of this store) is not linked again: it is only hashed here
        and copied by :meth:`_copy_deferred` when its version turns out to be new. Linking it
        would tie the new version to the old one, and a source rewritten in place (what
        ``torch.save`` to the same path does) would change both.
        """
        entries: list[dict[str, Any]] = []
        deferred: list[int] = []
        dmodes = _dir_modes(files)
        # the version directory and each one below it: no more visible than its files
        with contextlib.suppress(OSError):
            os.chmod(staging, os.stat(staging).st_mode & dmodes.get("", 0o777))
        made: set[Path] = {staging}
        for name in sorted(files):
            src = files[name]
            dst = staging / name
            if dst.parent not in made:
                for d in reversed([dst.parent, *dst.parent.parents]):
                    if d in made or staging not in d.parents:
                        continue
                    with contextlib.suppress(FileExistsError):
                        d.mkdir(mode=dmodes[d.relative_to(staging).as_posix()])
                    made.add(d)
            try:
                how = "copy"
                stamps: dict[str, int] | None = None
                if mode == "link":
                    if os.stat(src).st_nlink > 1:
                        size, sha = hash_file(src)
                        deferred.append(len(entries))
                        entries.append({"name": name, "size": size, "sha256": sha})
                        continue
                    try:
                        # the file a symbolic link names: os.link links the link itself
                        # (a relative one dangles in the store, an absolute one stores
                        # nothing but a pointer back to the source)
                        os.link(os.path.realpath(src), dst)
                        how = "link"
                    except OSError as exc:
                        if exc.errno not in LINK_FALLBACK:
                            raise
                if how == "link":
                    linked = _hash_linked(dst)
                    if linked is None:  # written to while hashed: a copy of it instead
                        os.unlink(dst)
                        how = "copy"
                    else:
                        size, sha, stamps = linked
                if how == "copy":
                    # a copy is the store's own: the source's bits, write bits cleared (a
                    # 0600 key stays private), so nothing edits it in place
                    size, sha = copy_hashed(src, dst)
            except FileNotFoundError as exc:
                if not Path(src).exists():
                    raise ArtifactError(
                        f"artifact file {name!r}: the source {str(src)!r} no longer exists; "
                        "nothing was published"
                    ) from exc
                raise
            entries.append(_entry(name, size, sha, how, dst, stamps))
        return entries, deferred

    def _copy_deferred(
        self,
        files: dict[str, Path],
        staging: Path,
        entries: list[dict[str, Any]],
        deferred: list[int],
    ) -> None:
        for i in deferred:
            name = entries[i]["name"]
            dst = staging / name
            size, sha = copy_hashed(files[name], dst)  # what is stored is what is hashed
            entries[i] = _entry(name, size, sha, "copy", dst)

    def _has_version(self, name: str, version: int) -> bool:
        with contextlib.suppress(Exception):
            item = self.catalog().get(name)
            return item is not None and version in item["versions"]
        return False

    @staticmethod
    def _check_type(item: dict[str, Any] | None, name: str, type_: str) -> None:
        """One type per artifact name (as in wandb): the newest version's type is the one.

        Raises:
            ArtifactTypeError: ``type_`` differs; the message names both and the way out.
        """
        versions = (item or {}).get("versions") or {}
        if not versions:
            return
        newest = versions[max(versions)]
        have = newest.get("type")
        if have is not None and have != type_:
            raise ArtifactTypeError(
                f"artifact {name!r} has type {have!r} (v{max(versions)}); a version of type "
                f"{type_!r} cannot be logged under the same name: use type={have!r} or "
                "another name; nothing was published"
            )

    def _has_digest(self, name: str, digest: str) -> bool:
        """Whether an intact version of ``name`` holds ``digest``."""
        item = self.catalog().get(name)
        return item is not None and any(
            rec.get("digest") == digest and self._intact(name, version)
            for version, rec in item["versions"].items()
        )

    def _intact(self, name: str, version: int) -> bool:
        """Whether ``name:v<version>`` still holds what was logged (the cheap check of
        ``use_artifact``). A linked version whose source was edited in place does not: the
        same contents logged again must not return it (a new version is stored instead)."""
        try:
            self.get(name, f"v{version}").check()
        except (ArtifactError, OSError):
            return False
        return True

    def _rewritten(
        self, name: str, files: dict[str, Path], entries: list[dict[str, Any]], deferred: list[int]
    ) -> list[str]:
        """Notices for files of the newest version that are the same file (inode) as a
        source now and no longer hold what was logged: rewritten in place since."""
        item = self.catalog().get(name)
        if item is None:
            return []
        newest = max(item["versions"])
        try:
            prev = self.get(name, f"v{newest}").manifest
        except ArtifactError:
            return []
        logged = {f["name"]: f for f in prev.get("files", [])}
        out = []
        for i in deferred:
            fname = entries[i]["name"]
            old = logged.get(fname)
            if old is None or old.get("stored") != "link":
                continue
            with contextlib.suppress(OSError):
                same = os.path.samefile(files[fname], self.root / name / f"v{newest}" / fname)
                if same and old.get("sha256") != entries[i]["sha256"]:
                    out.append(
                        f"{name}:v{newest} file {fname!r} is a hard link of {str(files[fname])!r}, "
                        "which was rewritten in place since it was logged: the stored "
                        f"{name}:v{newest} changed with it. Use mode='copy' (the default; "
                        "artifacts.mode: copy) for files saved again under the same name "
                        "(this version is a copy)"
                    )
        return out

    def _publish(
        self,
        artifact: Artifact,
        name: str,
        adir: Path,
        staging: Path,
        entries: list[dict[str, Any]],
        references: list[dict[str, Any]],
        digest: str,
        aliases: list[str],
        metadata: dict[str, Any] | None,
        run: dict[str, Any] | None,
        mode: str,
    ) -> tuple[ArtifactVersion, bool]:
        """Under the artifact's lock: dedupe by digest, or number, rename and commit."""
        item = self.catalog().get(name) or {"versions": {}, "aliases": {}}
        self._check_type(item, name, artifact.type)
        changed = []  # versions of this digest whose files no longer hold it
        for version, rec in sorted(item["versions"].items()):
            if rec.get("digest") == digest and not self._intact(name, version):
                changed.append(f"{name}:v{version}")
            elif rec.get("digest") == digest:
                moves = [a for a in aliases if item["aliases"].get(a) != version]
                for alias in moves:
                    self._append(
                        {
                            "kind": "alias",
                            "name": name,
                            "alias": alias,
                            "version": version,
                            "time": time.time(),
                            "run": run,
                        }
                    )
                return self.get(name, f"v{version}"), False
        if any("stored" not in e for e in entries):  # deferred, not copied: see log()
            raise ArtifactError(
                f"{', '.join(changed) or name} changed on disk while these same contents were "
                "logged; nothing was published: log it again"
            )
        if changed:
            self.notices.append(
                f"{', '.join(changed)} logged these same contents, but its files changed since "
                "(a hard-linked source edited in place): storing them as a new version. Use "
                "mode='copy' (the default; artifacts.mode: copy) for files edited in place"
            )
        removed = item.get("removed", set())
        for v in removed:  # what an interrupted remove_version left
            self._drop_files(adir, v)
        self._remove_orphans(adir, set(item["versions"]) | removed)
        # from v0 (as wandb); a store whose first version is v1 (written before) goes on
        # from its highest number; a removed version's number is never given again
        version = max([*item["versions"], *removed], default=-1) + 1
        now = time.time()
        manifest = {
            "format": MANIFEST_FORMAT,
            "name": name,
            "version": version,
            "type": artifact.type,
            "description": artifact.description,
            "metadata": artifact.metadata if metadata is None else metadata,
            "digest": digest,
            "size": sum(e["size"] for e in entries),
            "created_at": now,
            "mode": mode,
            "run": run,
            "files": entries,
            "references": references,
        }
        vdir = adir / f"v{version}"
        mpath = adir / manifest_name(version)
        committed = False
        try:
            atomic_write(mpath, json.dumps(manifest, indent=1, ensure_ascii=False, default=str))
            os.rename(staging, vdir)
            self._append(
                {
                    "kind": "version",
                    "name": name,
                    "version": version,
                    "digest": digest,
                    "type": artifact.type,
                    "size": manifest["size"],
                    "files": len(entries),
                    "references": len(references),
                    "aliases": aliases,
                    "created_at": now,
                    "run": run,
                }
            )
            committed = True
        finally:
            # undo: nothing of this version stays (unless its index line made it: an
            # interrupt between the append and `committed = True`)
            if not committed and not self._has_version(name, version):
                with contextlib.suppress(OSError):
                    if vdir.exists():
                        _rmtree(vdir)
                with contextlib.suppress(OSError):
                    mpath.unlink()
        newest_item = {
            "versions": {**item["versions"], version: {}},
            "aliases": {**item["aliases"], **dict.fromkeys(aliases, version)},
        }
        return self._version(name, version, newest_item, max(newest_item["versions"])), True

    def remove_version(self, name: str, version: int) -> None:
        """Remove ``name:v<version>`` (``et gc --artifacts``): a ``removed`` line appended to
        the index under the artifact's lock (the commit point: readers no longer list it),
        then its directory and manifest deleted. Its number is never given again.

        Raises:
            ArtifactNotFoundError: no such version.
            ArtifactError: it is the newest version (``latest``) or carries an alias.
        """
        validate_name(name)
        adir = self.root / name
        with locked(adir / ".lock"):
            item = self.catalog().get(name)
            if item is None or version not in item["versions"]:
                raise ArtifactNotFoundError(f"artifact {name!r} has no version v{version}")
            if version == max(item["versions"]):
                raise ArtifactError(f"{name}:v{version} is the newest version (latest); kept")
            aliases = sorted(a for a, v in item["aliases"].items() if v == version)
            if aliases:
                raise ArtifactError(
                    f"{name}:v{version} carries the aliases {', '.join(aliases)}; kept"
                )
            self._append({"kind": "removed", "name": name, "version": version, "time": time.time()})
            self._drop_files(adir, version)

    @staticmethod
    def _drop_files(adir: Path, version: int) -> None:
        """The directory and manifest of a removed version (links not followed)."""
        vdir = adir / f"v{version}"
        with contextlib.suppress(FileNotFoundError):
            if os.path.islink(vdir):
                os.unlink(vdir)
            elif vdir.is_dir():
                _rmtree(vdir)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(adir / manifest_name(version))

    def _append(self, record: dict[str, Any]) -> None:
        with locked(self.root / ".index.lock"):
            append_line(self.root / INDEX, record, sync=True)

    def _remove_orphans(self, adir: Path, indexed: set[int]) -> None:
        """Under the artifact's lock: the version directory and manifest the index does not
        list, left by a publisher killed between its rename and its index line.

        Such a leftover is always the next number (``max(indexed) + 1``, ``0`` for a new
        artifact: the number is taken under this lock, and the next publisher removes it
        before taking its own). Other
        unlisted versions mean the index lost lines (deleted, truncated, edited): they are
        complete versions, so nothing is removed and nothing is published.
        """
        leftover = max(indexed, default=-1) + 1
        found: dict[int, list[Path]] = {}
        for p in adir.iterdir():
            m = VERSION_RE.match(p.name) if p.is_dir() else _MANIFEST_RE.match(p.name)
            if m and int(m.group(1)) not in indexed:
                found.setdefault(int(m.group(1)), []).append(p)
        unlisted = sorted(v for v in found if v != leftover)
        if unlisted:
            raise ArtifactError(
                f"{adir} holds versions the index {self.root / INDEX} does not list "
                f"({', '.join(f'v{v}' for v in sorted(found))}): was the index deleted or edited? "
                "Restore it, or move those versions away; nothing was published"
            )
        for p in found.get(leftover, ()):
            if p.is_dir():
                _rmtree(p)
            else:
                p.unlink()

    def clean_staging(self, name: str, min_age_s: float = STALE_AFTER_S) -> int:
        """Remove the staging directories of ``name`` whose writer is gone; returns how many.

        A writer creates its lock file, takes the ``flock``, then makes its directory, and
        holds the lock until the directory is renamed or removed. A staging directory is
        stale when its lock can be taken, or when its lock file is missing and the directory
        is older than ``min_age_s``; a lock file is removed only when it can be taken and is
        older than ``min_age_s`` (so the instant between a writer's create and its ``flock``
        is never mistaken for a dead writer).
        """
        adir = self.root / name
        try:
            children = list(adir.iterdir())
        except OSError:
            return 0
        now = time.time()

        def old(p: Path) -> bool:
            try:
                return now - p.stat().st_mtime >= min_age_s
            except OSError:
                return False

        removed = 0
        for p in children:
            if not p.name.startswith(STAGING_PREFIX) or p.name.endswith(".lock"):
                continue
            lock_path = p.with_name(p.name + ".lock")
            fd = try_lock(lock_path)
            if fd is None and (lock_path.exists() or not old(p)):
                continue  # its writer is alive (or just starting)
            try:
                with contextlib.suppress(OSError):
                    _rmtree(p)
                    removed += 1
            finally:
                if fd is not None:
                    os.close(fd)
        for p in children:  # lock files of writers that are gone
            if p.name.startswith(STAGING_PREFIX) and p.name.endswith(".lock") and old(p):
                if p.with_name(p.name[: -len(".lock")]).exists():
                    continue
                fd = try_lock(p)
                if fd is not None:
                    with contextlib.suppress(OSError):
                        p.unlink()
                    os.close(fd)
        return removed


def check_mode(mode: Any) -> str:
    """``mode`` of ``log_artifact``/``artifacts.mode``: ``copy`` or ``link``.

    Raises:
        ValueError: anything else, naming the value and what is valid.
    """
    if mode not in MODES:
        raise ValueError(f"artifacts mode {mode!r} is not valid: use 'link' or 'copy'")
    return mode


#: a linked file whose modification or change time is closer than this to the time it was
#: hashed (or in the future) has racy stamps: a write in the same tick of a coarse file
#: system clock (a few ms locally, 1-2 s on some network or FAT file systems) would leave
#: them equal, so none are recorded and every check re-hashes it
RACY_NS = 2_000_000_000


def _hash_linked(path: Path) -> tuple[int, str, dict[str, int] | None] | None:
    """(size, sha256, stamps) of a file just hard-linked into the store, hashed through one
    descriptor; None when it changed while it was hashed (its size, modification or change
    time moved). ``stamps`` (``mtime_ns``, ``ctime_ns``) is None when they are racy
    (:data:`RACY_NS`). Raises ``OSError``."""
    from expr_tracker.artifacts.files import hash_fd
    from expr_tracker.history.untrusted import open_regular

    fd = open_regular(path)
    try:
        before = os.fstat(fd)
        size, sha = hash_fd(fd)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    key = ("st_size", "st_mtime_ns", "st_ctime_ns", "st_ino", "st_dev")
    if size != after.st_size or any(getattr(before, k) != getattr(after, k) for k in key):
        return None
    age = time.time_ns() - max(after.st_mtime_ns, after.st_ctime_ns)
    if age < RACY_NS:  # a negative age too: a file system clock ahead of ours
        return size, sha, None
    return size, sha, {"mtime_ns": after.st_mtime_ns, "ctime_ns": after.st_ctime_ns}


def _entry(
    name: str, size: int, sha: str, how: str, dst: Path, stamps: dict[str, int] | None = None
) -> dict[str, Any]:
    """A manifest file entry. A copy (the store's own, read-only) records its modification
    time; a link records its modification and change times when they are not racy, and
    none otherwise (so every check re-hashes it: docs/artifacts.md "Link or copy")."""
    out: dict[str, Any] = {"name": name, "size": size, "sha256": sha, "stored": how}
    if how == "copy":
        out["mtime_ns"] = dst.stat().st_mtime_ns
    elif stamps:
        out.update(stamps)
    return out


def _is_alias(value: Any) -> bool:
    try:
        validate_alias(value)
    except ArtifactError:
        return False
    return True


def _dir_modes(files: dict[str, Path]) -> dict[str, int]:
    """The permission bits of each directory a version needs (``""``: the version directory
    itself), from the modes of the source files below it (:func:`files.dir_mode`): group
    and others may list a directory only when they may read every file in it."""
    below: dict[str, list[int]] = {"": []}
    for name, src in files.items():
        try:
            mode = os.stat(src).st_mode
        except OSError:
            mode = 0  # a source gone: the copy below says so; meanwhile keep it private
        parts = name.split("/")
        below[""].append(mode)
        for i in range(1, len(parts)):
            below.setdefault("/".join(parts[:i]), []).append(mode)
    return {d: dir_mode(modes) for d, modes in below.items()}


def _rmtree(path: Path) -> None:
    """Remove a directory tree, read-only stored copies included."""
    shutil.rmtree(path)
