"""What an artifact is: :class:`Artifact` (being built: files, directories, references) and
:class:`ArtifactVersion` (one stored version, read back: manifest, files, download, verify)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from expr_tracker.artifacts.errors import (
    ArtifactCorruptedError,
    ArtifactError,
    ArtifactNameError,
    ArtifactNotFoundError,
)
from expr_tracker.artifacts.names import (
    validate_entry_name,
    validate_name,
    validate_type,
    validate_uri,
)
from expr_tracker.history.paths import QUERY_CACHE_DIR


class Artifact:
    """A set of files (and references) to log as the next version of ``name``.

    ``et.Artifact("digits", type="dataset", description=None, metadata=None)``; add content
    with :meth:`add_file`, :meth:`add_dir` (chains: it returns the artifact),
    :meth:`add_reference`, then ``et.log_artifact(artifact, aliases=["best"])``. Files are
    read when logged, not when added (only their existence is checked here).

    Once ``log_artifact(artifact)`` or ``use_artifact(artifact)`` has resolved it to a stored
    version (:attr:`resolved`), the artifact also answers that version's attributes
    (``version``, ``digest``, ``aliases``, ``dir``, ``get_path()``, ``download()`` ... see
    ``RESOLVED_ATTRIBUTES``); ``files`` and ``references`` keep their meaning here (the
    sources added). Adding content afterwards unresolves it.

    Raises:
        ArtifactNameError: a bad ``name`` or ``type`` (the message says what is valid).
        ArtifactError: ``metadata`` is not a mapping, ``description`` not a string.
    """

    def __init__(
        self,
        name: str,
        type: str = "dataset",  # noqa: A002 - wandb's keyword
        description: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = validate_name(name)
        self.type = validate_type(type)
        if description is not None and not isinstance(description, str):
            raise ArtifactError(
                f"artifact description must be a string or None, not {type_name(description)}"
            )
        self.description = description
        self.metadata = check_metadata(metadata)
        self._files: dict[str, Path] = {}  # name inside the artifact -> source file
        self._refs: dict[str, str] = {}  # name -> URI
        self._dirs: set[str] = set()  # every directory prefix of a name
        self._resolved: ArtifactVersion | None = None

    @property
    def resolved(self) -> ArtifactVersion | None:
        """The stored version ``log_artifact``/``use_artifact`` resolved this artifact to
        (None before, or after content was added since)."""
        return self._resolved

    def resolve(self, version: ArtifactVersion | None) -> None:
        """Set :attr:`resolved` (what ``log_artifact``/``use_artifact`` call)."""
        self._resolved = version

    def __getattr__(self, name: str) -> Any:
        # only for names not found the usual way: the resolved version's attributes
        if name in RESOLVED_ATTRIBUTES:
            version = self.__dict__.get("_resolved")
            if version is None:
                raise AttributeError(
                    f"artifact {self.__dict__.get('name')!r} has no {name!r} yet: it is not a "
                    "stored version until et.log_artifact(artifact) or "
                    "et.use_artifact(artifact) resolves it"
                )
            return getattr(version, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------ building

    def add_file(self, local_path: str | os.PathLike[str], name: str | None = None) -> str:
        """Add one file as ``name`` (default: the file's own name); returns the name.
        ``local_path`` is wandb's keyword (``add_file(local_path="model.pt")``).

        Raises:
            ArtifactError: ``local_path`` is not a file.
            ArtifactNameError: a bad ``name``, or one already in the artifact (or a
                directory of it).
        """
        src = Path(local_path)
        if not src.is_file():
            if src.is_dir():
                what = "a directory (use add_dir)"
            else:
                what = "not a regular file" if os.path.lexists(src) else "missing"
            raise ArtifactError(f"add_file: {str(src)!r} is not a file ({what})")
        entry = validate_entry_name(src.name if name is None else name, "name")
        self._claim(entry)
        self._files[entry] = src.absolute()
        return entry

    def add_dir(self, local_path: str | os.PathLike[str], name: str | None = None) -> Artifact:
        """Add every regular file under directory ``local_path`` (symbolic links to files
        are followed, links to directories are not), named by its path relative to it,
        under the prefix ``name`` when given (``add_dir("out", name="ckpt")`` adds
        ``ckpt/model.pt``). Other special files (sockets, FIFOs) are skipped, and so are a
        project's artifact store below (``artifacts/`` with its ``index.jsonl``) and a run's
        query cache (``.et-cache/``: derived from the run's JSONL, rebuilt on demand).
        Returns the artifact itself, so calls chain
        (``et.log_artifact(et.Artifact("ds").add_dir("data"))``); :attr:`files` lists the
        names.

        Raises:
            ArtifactError: ``local_path`` is not a directory.
            ArtifactNameError: a bad prefix or file name (nothing is added then).
        """
        root = Path(local_path)
        if not root.is_dir():
            raise ArtifactError(f"add_dir: {str(root)!r} is not a directory")
        prefix = validate_entry_name(name, "name") + "/" if name is not None else ""
        found: list[tuple[str, Path]] = []
        for dirpath, dirnames, filenames in os.walk(root):
            base = Path(dirpath)
            # a project's artifact store below (logging "." beside ./runs) is left out: each
            # version would hold the previous ones, and the store's live index and locks
            dirnames[:] = sorted(
                d for d in dirnames if d != QUERY_CACHE_DIR and not is_store(base / d)
            )
            rel_dir = base.relative_to(root).as_posix()
            for fname in sorted(filenames):
                src = base / fname
                if not src.is_file():
                    continue
                rel = fname if rel_dir == "." else f"{rel_dir}/{fname}"
                found.append((validate_entry_name(prefix + rel, "file name"), src.absolute()))
        saved = dict(self._files), set(self._dirs)
        try:  # all or nothing
            for entry, src in found:
                self._claim(entry)
                self._files[entry] = src
        except BaseException:
            self._files, self._dirs = saved
            raise
        return self

    def add_reference(self, uri: str, name: str | None = None) -> str:
        """Record ``uri`` (``s3://bucket/key``, ``https://...``, a path) by name, never
        copied or read. ``name`` defaults to the last part of the URI's path. Returns it.

        Raises:
            ArtifactNameError: an empty URI, a control character in it, or a bad name.
        """
        validate_uri(uri)
        if name is None:
            tail = uri.split("?", 1)[0].split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]
            if not tail or tail.endswith(":"):
                raise ArtifactNameError(
                    f"reference uri {uri!r} has no last path part to name it: pass name="
                )
            name = tail
        entry = validate_entry_name(name, "name")
        self._claim(entry)
        self._refs[entry] = uri
        return entry

    def _claim(self, entry: str) -> None:
        self._resolved = None  # other contents now: no longer the version resolved
        if entry in self._files or entry in self._refs:
            raise ArtifactNameError(f"name {entry!r} is already in artifact {self.name!r}")
        if entry in self._dirs:
            raise ArtifactNameError(
                f"name {entry!r} is a directory of artifact {self.name!r} (it holds files)"
            )
        parts = entry.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts))]
        for p in prefixes:
            if p in self._files or p in self._refs:
                raise ArtifactNameError(
                    f"name {entry!r} needs {p!r} to be a directory, but it is a file of "
                    f"artifact {self.name!r}"
                )
        self._dirs.update(prefixes)

    # ------------------------------------------------------------------ reading

    @property
    def files(self) -> dict[str, Path]:
        """name -> source file (a copy of the table)."""
        return dict(self._files)

    @property
    def references(self) -> dict[str, str]:
        """name -> URI (a copy of the table)."""
        return dict(self._refs)

    def __repr__(self) -> str:
        return (
            f"Artifact({self.name!r}, type={self.type!r}, files={len(self._files)}, "
            f"references={len(self._refs)})"
        )


#: the attributes of :class:`ArtifactVersion` an :class:`Artifact` answers once resolved
RESOLVED_ATTRIBUTES = frozenset(
    {
        "version",
        "qualified_name",
        "digest",
        "aliases",
        "size",
        "created_at",
        "path",
        "dir",
        "run",
        "run_info",
        "manifest",
        "get_path",
        "download",
        "check",
        "verify",
        "to_dict",
    }
)


def is_store(path: Path) -> bool:
    """Whether ``path`` is a project's artifact store (``artifacts/`` holding its index)."""
    return path.name == "artifacts" and (path / "index.jsonl").is_file()


def type_name(value: Any) -> str:
    return type(value).__name__


def check_metadata(metadata: Any) -> dict[str, Any]:
    """``metadata`` as a plain dict of JSON-able values (NumPy scalars, paths, datetimes and
    the like converted as ``et.log`` converts them).

    Raises:
        ArtifactError: not a mapping, or a key that is not a string.
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise ArtifactError(f"artifact metadata must be a mapping, not {type_name(metadata)}")
    from expr_tracker.history.codec import normalize_value

    out: dict[str, Any] = {}
    for k, v in metadata.items():
        if not isinstance(k, str):
            raise ArtifactError(f"artifact metadata key {k!r} is not a string")
        out[k] = normalize_value(v)
    return out


#: a sha256 as the manifest and the index hold it: 64 lowercase hex digits
SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
#: the longest value quoted in an error message
_SHOWN = 80


def _show(value: Any) -> str:
    """``value`` for an error message: its repr (control characters escaped), cut short."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def version_digest(files: list[dict[str, Any]], references: list[dict[str, Any]]) -> str:
    """sha256 (hex) over the manifest entries sorted by name: the compact JSON of
    ``[["file", name, size, sha256] | ["ref", name, uri], ...]``. Type, metadata, time and
    the logging run are not part of it: the digest is the content."""
    import hashlib

    entries = [["file", f["name"], f["size"], f["sha256"]] for f in files]
    entries += [["ref", r["name"], r["uri"]] for r in references]
    entries.sort(key=lambda e: e[1])
    blob = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def _count(value: Any) -> bool:
    """A non-negative ``int`` (never a ``bool``)."""
    return type(value) is int and value >= 0


def check_manifest(manifest: Any, where: str) -> None:
    """Check a manifest read from disk before anything of it is used: every field the reader
    relies on has its shape, every file and reference name is valid (``validate_entry_name``:
    relative, no ``..``, no control character), names are unique and no file is also a
    directory of another, sizes are byte counts, every ``sha256`` and the ``digest`` are 64
    hex digits, and the digest is the one its entries give (:func:`version_digest`).

    ``where`` names the manifest in the message (``"ds:v3 (.../v3.manifest.json)"``).

    Raises:
        ArtifactCorruptedError: naming the manifest, the entry and what is wrong.
    """

    def bad(what: str) -> ArtifactCorruptedError:
        return ArtifactCorruptedError(
            f"the manifest of {where} is not valid: {what} (edited, or not written by this "
            "store); nothing of it was used"
        )

    if not isinstance(manifest, dict):
        raise bad(f"a {type_name(manifest)}, not an object")
    try:
        validate_name(manifest.get("name"), "name")
        validate_type(manifest.get("type"), "type")
    except ArtifactNameError as exc:
        raise bad(str(exc)) from None
    version = manifest.get("version")
    if type(version) is not int or version < 0:
        raise bad(f"version {_show(version)} is not a number from 0")
    for key, kinds in (
        ("description", (str,)),
        ("metadata", (dict,)),
        ("run", (dict,)),
        ("mode", (str,)),
        ("created_at", (int, float)),
    ):
        value = manifest.get(key)
        if value is not None and (type(value) is bool or not isinstance(value, kinds)):
            raise bad(f"{key} is a {type_name(value)}")
    if manifest.get("size") is not None and not _count(manifest["size"]):
        raise bad(f"size {_show(manifest['size'])} is not a byte count")
    digest = manifest.get("digest")
    if not isinstance(digest, str) or not SHA256_RE.match(digest):
        raise bad(f"digest {_show(digest)} is not 64 hex digits")
    files, refs = manifest.get("files", []), manifest.get("references", [])
    if not isinstance(files, list) or not isinstance(refs, list):
        raise bad("files and references must be lists")
    names: set[str] = set()
    for kind, entries in (("file", files), ("reference", refs)):
        for i, entry in enumerate(entries):
            label = f"{kind} entry {i}"
            if not isinstance(entry, dict):
                raise bad(f"{label} is a {type_name(entry)}, not an object")
            name = entry.get("name")
            try:
                validate_entry_name(name, f"{label} name")
            except ArtifactNameError as exc:
                raise bad(str(exc)) from None
            label = f"{kind} {name!r}"
            if name in names:
                raise bad(f"{label} is listed twice")
            names.add(name)
            if kind == "file":
                if not _count(entry.get("size")):
                    raise bad(f"{label}: size {_show(entry.get('size'))} is not a byte count")
                sha = entry.get("sha256")
                if not isinstance(sha, str) or not SHA256_RE.match(sha):
                    raise bad(f"{label}: sha256 {_show(sha)} is not 64 hex digits")
                for stamp in ("mtime_ns", "ctime_ns"):
                    value = entry.get(stamp)
                    if value is not None and type(value) is not int:
                        raise bad(f"{label}: {stamp} {_show(value)} is not an integer")
                if entry.get("stored") not in (None, "link", "copy"):
                    raise bad(f"{label}: stored {_show(entry.get('stored'))} is not link or copy")
            else:
                try:
                    validate_uri(entry.get("uri"), f"{label}: uri")
                except ArtifactNameError as exc:
                    raise bad(str(exc)) from None
    for name in names:  # "a" and "a/b": a file cannot also be a directory
        parts = name.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in names:
                raise bad(f"{prefix!r} is an entry and also a directory of {name!r}")
    if version_digest(files, refs) != digest:
        raise bad(f"digest {digest[:16]}... is not the digest of its entries")


class _Bad(Exception):
    """One stored file that fails its check: the reason, for the message."""


def _what(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISREG(mode):
        return "a file"
    return "not a directory"


class ArtifactVersion:
    """One stored version of an artifact (what ``et.log_artifact`` and ``et.use_artifact``
    return).

    Attributes:
        name, type, description: as logged. ``version``: the number (``int``, from 0:
            ``v0`` is the first, as in wandb).
        qualified_name: ``"name:v3"``.
        digest: sha256 (hex) over the sorted manifest entries (see docs/artifacts.md).
        aliases: the aliases pointing here, ``latest`` included when it is the newest.
        metadata: dict. ``size``: bytes of the stored files. ``created_at``: epoch seconds.
        path: the version directory (``Path``): the files, as named in the artifact, not
            checked; ``dir`` is the same directory once every stored file is checked
            (:meth:`check`), what to read the files from.
        manifest: the whole manifest (dict). ``run``: the name of the run that logged it
            (``str``, None when unknown); ``run_info``: that run's identity (dict:
            ``project``, ``name``, ``stream``, ``rank``, ``dir``; None when unknown).

    The manifest is checked when the version is made (:func:`check_manifest`), and every
    stored file when it is handed out (:meth:`get_path`, :meth:`download`, :meth:`check`,
    :meth:`verify`): a regular file, inside the version directory, which must itself be
    ``<store>/<name>/v<N>`` (no symbolic link on the way), with its logged size and hash.

    Raises:
        ArtifactCorruptedError: (when made) the manifest is not valid; the message names the
            entry.
    """

    def __init__(self, path: Path, manifest: dict[str, Any], aliases: list[str], mode: str):
        check_manifest(manifest, f"{Path(path).name} of {Path(path).parent}")
        self.path = Path(path)
        self.manifest = manifest
        self.name: str = manifest["name"]
        self.version: int = manifest["version"]
        self.digest: str = manifest["digest"]
        self.type: str = manifest["type"]
        self.description: str | None = manifest.get("description")
        self.metadata: dict[str, Any] = dict(manifest.get("metadata") or {})
        self.size: int = manifest.get("size") or 0
        self.created_at: float | None = manifest.get("created_at")
        self.run_info: dict[str, Any] | None = manifest.get("run")
        who = (self.run_info or {}).get("name")
        self.run: str | None = who if isinstance(who, str) else None
        self.aliases = list(aliases)
        self._mode = mode
        self._files = {f["name"]: f for f in manifest.get("files", [])}
        self._refs = {r["name"]: r["uri"] for r in manifest.get("references", [])}

    @property
    def qualified_name(self) -> str:
        return f"{self.name}:v{self.version}"

    @property
    def dir(self) -> Path:
        """The version directory, once every stored file is checked (:meth:`check`: a
        linked file edited since it was logged raises instead of being handed out); read
        the files from it, do not edit them. ``download()`` with no root is the same.

        Raises:
            ArtifactCorruptedError: a stored file is missing or changed, or the store was
                tampered with.
        """
        self.check()
        return self.path

    def refresh_from(self, other: ArtifactVersion) -> None:
        """Take ``other``'s state (the same version read again: aliases as they are now).

        Raises:
            ArtifactCorruptedError: ``other`` is another version or other contents.
        """
        if (other.name, other.version, other.digest) != (self.name, self.version, self.digest):
            raise ArtifactCorruptedError(
                f"{self.qualified_name} (digest {self.digest[:16]}...) cannot be refreshed from "
                f"{other.qualified_name} (digest {other.digest[:16]}...): other contents"
            )
        self.__dict__.update(other.__dict__)

    def files(self) -> list[str]:
        """The names of the stored files (relative, ``/``-separated), sorted. References
        are not files: see :meth:`references`."""
        return sorted(self._files)

    def references(self) -> dict[str, str]:
        """name -> URI of every reference (recorded, never copied)."""
        return dict(self._refs)

    def get_path(self, name: str) -> Path | str:
        """The stored file ``name`` (a ``Path`` inside the version directory), checked as
        :meth:`check` checks each file; for a reference, its URI (a ``str``) as recorded.

        Raises:
            ArtifactNotFoundError: no file or reference of that name (the message lists
                some that exist).
            ArtifactCorruptedError: the file is missing, not a regular file, outside the
                version directory, or no longer what was logged.
        """
        if name in self._files:
            real = self._real_dir()
            try:
                os.close(self._open(name, real, full=False)[0])
            except _Bad as exc:
                raise self._corrupted([f"{name} ({exc})"]) from None
            return self.path / name
        if name in self._refs:
            return self._refs[name]
        names = sorted([*self._files, *self._refs])
        shown = ", ".join(names[:10]) + (" ..." if len(names) > 10 else "")
        raise ArtifactNotFoundError(
            f"{self.qualified_name} has no file {name!r}; it has: {shown or 'nothing'}"
        )

    def download(self, root: str | os.PathLike[str] | None = None) -> Path:
        """The files on local disk. ``root`` None: the version directory itself, after
        :meth:`check` (the files are already local; do not edit them). Else every file is
        hard-linked (store mode ``link``, same file system) or copied into ``root`` under
        its name, replacing a file there; returns ``root`` as a ``Path``. References are not
        downloaded.

        Nothing is written outside ``root``: a directory on the way that is a symbolic link
        (or not a directory) is refused before anything is written, and files are created
        below directory descriptors opened without following links. Every file is checked
        first, and a copy is hashed as it is written (a mismatch removes it). A copy has the
        stored file's permission bits (never more readable than the source); a directory
        created for the files is readable by group or others only when all files below it
        are.

        Raises:
            ArtifactCorruptedError: a stored file is missing or changed (nothing written
                when found before the copy).
            ArtifactError: ``root`` cannot be written, or a path under it is a symbolic
                link or not a directory (nothing half-written stays there for the file that
                failed).
        """
        if root is None:
            self.check()
            return self.path
        from expr_tracker.artifacts.files import dir_mode

        out = Path(root)
        names = self.files()
        real = self._real_dir() if names else ""
        modes: dict[str, int] = {}
        bad = []
        for name in names:  # every file checked before anything is written
            try:
                fd, st = self._open(name, real, full=False)
            except _Bad as exc:
                bad.append(f"{name} ({exc})")
                continue
            os.close(fd)
            modes[name] = st.st_mode
        self._raise_if(bad)
        self._check_targets(out, names)
        below: dict[str, list[int]] = {"": list(modes.values())}
        for name, m in modes.items():
            parts = name.split("/")
            for i in range(1, len(parts)):
                below.setdefault("/".join(parts[:i]), []).append(m)
        dmodes = {d: dir_mode(ms) for d, ms in below.items()}
        try:  # root exists afterwards, also for a version of references only
            if not os.path.isdir(out):
                out.parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(FileExistsError):
                    os.mkdir(out, dmodes[""])
            root_fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise ArtifactError(f"cannot download {self.qualified_name} to {out}: {exc}") from exc
        parent: tuple[str, int] | None = None  # the last directory opened (files are sorted)
        try:
            for name in names:
                head, _, leaf = name.rpartition("/")
                if parent is None or parent[0] != head:
                    if parent is not None:
                        os.close(parent[1])
                        parent = None
                    parent = (head, self._open_dirs(out, root_fd, head, dmodes))
                self._download_one(name, real, parent[1], leaf, out)
        finally:
            if parent is not None:
                os.close(parent[1])
            os.close(root_fd)
        return out

    def _check_targets(self, out: Path, names: list[str]) -> None:
        """Before anything is written: ``out`` is a directory (or missing), every directory on
        the way to each file is a directory of its own (a symbolic link there would lead the
        write outside ``out``), and no file lands on a directory.

        Raises:
            ArtifactError: naming the path.
        """

        def refuse(path: Path, why: str) -> ArtifactError:
            return ArtifactError(
                f"cannot download {self.qualified_name} to {out}: {path} {why}; nothing was written"
            )

        try:
            st = os.stat(out)  # out itself may be a link to a directory: the caller's choice
        except FileNotFoundError:
            return
        except OSError as exc:
            raise refuse(out, f"cannot be read ({exc.strerror})") from exc
        if not stat.S_ISDIR(st.st_mode):
            raise refuse(out, "is not a directory")
        seen: set[str] = set()
        for name in names:
            parts = name.split("/")
            for i in range(1, len(parts) + 1):
                rel = "/".join(parts[:i])
                if rel in seen:
                    continue
                seen.add(rel)
                try:
                    mode = os.lstat(out / rel).st_mode
                except FileNotFoundError:
                    break
                except OSError as exc:
                    raise refuse(out / rel, f"cannot be read ({exc.strerror})") from exc
                if i < len(parts) and not stat.S_ISDIR(mode):
                    raise refuse(out / rel, f"is {_what(mode)}, not a directory")
                if i == len(parts) and stat.S_ISDIR(mode):
                    raise refuse(out / rel, "is a directory, where a file goes")

    def _open_dirs(self, out: Path, root_fd: int, head: str, dmodes: dict[str, int]) -> int:
        """A descriptor of directory ``head`` below ``root_fd``, made when missing (with its
        mode from ``dmodes``), each part opened with ``O_NOFOLLOW``: a part swapped for a
        symbolic link since :meth:`_check_targets` is refused, never followed.

        Raises:
            ArtifactError: a part is a symbolic link or not a directory, or cannot be made.
        """
        flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
        flags |= getattr(os, "O_NOFOLLOW", 0)
        fd = os.dup(root_fd)
        if not head:
            return fd
        done = []
        try:
            for part in head.split("/"):
                done.append(part)
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dmodes["/".join(done)], dir_fd=fd)
                nfd = os.open(part, flags, dir_fd=fd)
                os.close(fd)
                fd = nfd
        except OSError as exc:
            os.close(fd)
            why = (
                "is a symbolic link or not a directory"
                if exc.errno in (errno.ELOOP, errno.ENOTDIR)
                else f"cannot be made ({exc.strerror})"
            )
            raise ArtifactError(
                f"cannot download {self.qualified_name} to {out}: {out / '/'.join(done)} {why}"
            ) from exc
        return fd

    def _download_one(self, name: str, real: str, dir_fd: int, leaf: str, out: Path) -> None:
        """Hard-link (store mode ``link``) or copy the stored file ``name`` as ``leaf`` in
        ``dir_fd``, through a temporary name renamed over it."""
        from expr_tracker.artifacts.files import LINK_FALLBACK, copy_hashed

        entry = self._files[name]
        try:
            fd, st = self._open(name, real, full=False)
        except _Bad as exc:
            raise self._corrupted([f"{name} ({exc})"]) from None
        # a short name: the file's own may already be at the 255-byte limit
        tmp = f".et-download-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        made = False
        try:
            linked = False
            if self._mode == "link":
                try:
                    os.link(os.path.join(real, name), tmp, dst_dir_fd=dir_fd, follow_symlinks=False)
                    made = linked = True
                except OSError as exc:
                    if exc.errno not in LINK_FALLBACK:
                        raise
                if linked:
                    got = os.stat(tmp, dir_fd=dir_fd, follow_symlinks=False)
                    if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):
                        raise self._corrupted([f"{name} (replaced while downloaded)"])
            if not linked:
                made = True
                if copy_hashed(fd, tmp, dir_fd=dir_fd) != (entry["size"], entry["sha256"]):
                    raise self._corrupted([f"{name} (content changed)"])
            os.replace(tmp, leaf, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            made = False
        except OSError as exc:
            raise ArtifactError(
                f"cannot download {self.qualified_name} to {out}: {name}: {exc}"
            ) from exc
        finally:
            os.close(fd)
            if made:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)

    def _real_dir(self) -> str:
        """The real path of the version directory, once it is known to be a directory at
        its place in the store: ``<store>/<name>/v<N>`` with neither ``<name>`` nor ``v<N>``
        a symbolic link (one would hand out files from anywhere).

        Raises:
            ArtifactCorruptedError: it is missing, not a directory, or resolves elsewhere.
        """
        try:
            mode = os.lstat(self.path).st_mode
        except OSError as exc:
            what = f"its directory {self.path} cannot be read ({exc.strerror})"
            raise self._broken(what) from None
        if not stat.S_ISDIR(mode):
            raise self._broken(f"its directory {self.path} is {_what(mode)}")
        real = os.path.realpath(self.path)
        store = os.path.realpath(self.path.parent.parent)
        if real != os.path.join(store, self.path.parent.name, self.path.name):
            raise self._broken(
                f"its directory {self.path} resolves to {real}, outside the store {store} "
                "(a symbolic link on the way)"
            )
        return real

    def _open(self, name: str, real: str, *, full: bool) -> tuple[int, os.stat_result]:
        """Open the stored file ``name`` below ``real`` (the version directory's real path)
        and check it: a regular file (opened non-blocking: a FIFO never hangs), lying inside
        ``real``, of the logged size, and of the logged sha256 when ``full``, when the
        manifest has no ``mtime_ns`` or when the modification time differs from it. Returns
        (the descriptor, its ``fstat``); the caller closes it.

        Raises:
            _Bad: the reason it fails.
        """
        from expr_tracker.artifacts.files import hash_fd
        from expr_tracker.history.untrusted import UnsafeFileError, open_regular

        entry = self._files[name]
        try:
            fd = open_regular(os.path.join(real, name), root=real)
        except FileNotFoundError:
            raise _Bad("missing") from None
        except UnsafeFileError as exc:
            raise _Bad(exc.reason) from None
        except OSError as exc:
            raise _Bad(f"cannot be read: {exc.strerror or exc}") from None
        try:
            st = os.fstat(fd)
            if st.st_size != entry["size"]:
                raise _Bad(f"size {st.st_size} bytes, logged {entry['size']}")
            mtime = entry.get("mtime_ns")
            stale = mtime is None or st.st_mtime_ns != mtime
            if entry.get("stored") == "link":
                # a hard link is the user's file too: a write needs no chmod, and a tool may
                # restore the modification time (rsync -t, touch -r); the change time cannot
                # be set back, so it must match as well
                ctime = entry.get("ctime_ns")
                stale = stale or ctime is None or st.st_ctime_ns != ctime
            if full or stale:
                try:
                    digest = hash_fd(fd)
                except OSError as exc:
                    raise _Bad(f"cannot be read: {exc.strerror or exc}") from None
                if digest != (entry["size"], entry["sha256"]):
                    raise _Bad("content changed")
        except BaseException:
            os.close(fd)
            raise
        return fd, st

    def _each(self, full: bool) -> None:
        if not self._files:
            return
        real = self._real_dir()
        bad = []
        for name in sorted(self._files):
            try:
                os.close(self._open(name, real, full=full)[0])
            except _Bad as exc:
                bad.append(f"{name} ({exc})")
        self._raise_if(bad)

    def check(self) -> None:
        """The cheap integrity check ``use_artifact`` runs: the version directory is at its
        place in the store, and every stored file is a regular file inside it with its
        recorded size; a file is re-hashed when its modification time differs from the
        recorded one, or when none is recorded, and a hard-linked file (``mode="link"``)
        also when its change time differs or none is recorded (docs/artifacts.md "Link or
        copy").

        Raises:
            ArtifactCorruptedError: naming the files that differ.
        """
        self._each(full=False)

    def verify(self) -> bool:
        """Re-hash every stored file against the manifest; True when all match.

        Raises:
            ArtifactCorruptedError: naming every file missing or changed.
        """
        self._each(full=True)
        return True

    def _broken(self, what: str) -> ArtifactCorruptedError:
        return ArtifactCorruptedError(f"{self.qualified_name}: {what}; nothing was read from it")

    def _corrupted(self, bad: list[str]) -> ArtifactCorruptedError:
        shown = ", ".join(bad[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        hint = ""
        linked = any(f.get("stored") == "link" for f in self._files.values())
        if linked and any("content changed" in b or " bytes, logged " in b for b in bad):
            hint = (
                " (a file stored as a hard link changes when its source is edited in place; "
                "log with mode='copy' (artifacts.mode: copy) to keep versions independent)"
            )
        return ArtifactCorruptedError(
            f"{self.qualified_name} at {self.path} no longer matches its manifest: {shown}{hint}"
        )

    def _raise_if(self, bad: list[str]) -> None:
        if bad:
            raise self._corrupted(bad)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: name, version, digest, type, aliases, metadata, size, path, files
        count, references count, created_at, run."""
        return {
            "name": self.name,
            "version": self.version,
            "digest": self.digest,
            "type": self.type,
            "aliases": list(self.aliases),
            "metadata": dict(self.metadata),
            "size": self.size,
            "path": str(self.path),
            "files": len(self._files),
            "references": len(self._refs),
            "created_at": self.created_at,
            "run": self.run_info,
        }

    def __repr__(self) -> str:
        return (
            f"ArtifactVersion({self.qualified_name!r}, type={self.type!r}, "
            f"digest={self.digest[:12]!r}, files={len(self._files)})"
        )
