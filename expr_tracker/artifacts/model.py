"""What an artifact is: :class:`Artifact` (being built: files, directories, references) and
:class:`ArtifactVersion` (one stored version, read back: manifest, files, download, verify)."""

from __future__ import annotations

import os
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
from expr_tracker.artifacts.names import validate_entry_name, validate_name, validate_type
from expr_tracker.history.paths import QUERY_CACHE_DIR


class Artifact:
    """A set of files (and references) to log as the next version of ``name``.

    ``et.Artifact("digits", type="dataset", description=None, metadata=None)``; add content
    with :meth:`add_file`, :meth:`add_dir`, :meth:`add_reference`, then
    ``et.log_artifact(artifact, aliases=["best"])``. Files are read when logged, not when
    added (only their existence is checked here).

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

    def add_dir(self, local_path: str | os.PathLike[str], name: str | None = None) -> list[str]:
        """Add every regular file under directory ``local_path`` (symbolic links to files
        are followed, links to directories are not), named by its path relative to it,
        under the prefix ``name`` when given (``add_dir("out", name="ckpt")`` adds
        ``ckpt/model.pt``). Other special files (sockets, FIFOs) are skipped, and so are a
        project's artifact store below (``artifacts/`` with its ``index.jsonl``) and a run's
        query cache (``.et-cache/``: derived from the run's JSONL, rebuilt on demand). Returns
        the names added, sorted.

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
        return sorted(entry for entry, _ in found)

    def add_reference(self, uri: str, name: str | None = None) -> str:
        """Record ``uri`` (``s3://bucket/key``, ``https://...``, a path) by name, never
        copied or read. ``name`` defaults to the last part of the URI's path. Returns it.

        Raises:
            ArtifactNameError: an empty URI, a control character in it, or a bad name.
        """
        if (
            not isinstance(uri, str)
            or not uri
            or any(ord(c) < 32 or 0xD800 <= ord(c) <= 0xDFFF for c in uri)
        ):
            raise ArtifactNameError(
                f"reference uri {uri!r} is not valid: use a non-empty string without "
                "control characters or lone surrogates (s3://bucket/key, https://host/path, /data/x)"
            )
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


class ArtifactVersion:
    """One stored version of an artifact (what ``et.log_artifact`` and ``et.use_artifact``
    return).

    Attributes:
        name, type, description: as logged. ``version``: the number (``int``, from 1).
        qualified_name: ``"name:v3"``.
        digest: sha256 (hex) over the sorted manifest entries (see docs/artifacts.md).
        aliases: the aliases pointing here, ``latest`` included when it is the newest.
        metadata: dict. ``size``: bytes of the stored files. ``created_at``: epoch seconds.
        path: the version directory (``Path``): the files, as named in the artifact.
        manifest: the whole manifest (dict). ``run``: the run that logged it (dict or None).
    """

    def __init__(self, path: Path, manifest: dict[str, Any], aliases: list[str], mode: str):
        self.path = path
        self.manifest = manifest
        self.name: str = manifest["name"]
        self.version: int = int(manifest["version"])
        self.digest: str = manifest["digest"]
        self.type: str = manifest.get("type", "")
        self.description: str | None = manifest.get("description")
        self.metadata: dict[str, Any] = dict(manifest.get("metadata") or {})
        self.size: int = int(manifest.get("size") or 0)
        self.created_at: float | None = manifest.get("created_at")
        self.run: dict[str, Any] | None = manifest.get("run")
        self.aliases = list(aliases)
        self._mode = mode
        self._files = {f["name"]: f for f in manifest.get("files", [])}
        self._refs = {r["name"]: r["uri"] for r in manifest.get("references", [])}

    @property
    def qualified_name(self) -> str:
        return f"{self.name}:v{self.version}"

    def files(self) -> list[str]:
        """The names of the stored files (relative, ``/``-separated), sorted. References
        are not files: see :meth:`references`."""
        return sorted(self._files)

    def references(self) -> dict[str, str]:
        """name -> URI of every reference (recorded, never copied)."""
        return dict(self._refs)

    def get_path(self, name: str) -> Path | str:
        """The stored file ``name`` (a ``Path`` inside the version directory); for a
        reference, its URI (a ``str``) as recorded.

        Raises:
            ArtifactNotFoundError: no file or reference of that name (the message lists
                some that exist).
        """
        if name in self._files:
            return self.path / name
        if name in self._refs:
            return self._refs[name]
        names = sorted([*self._files, *self._refs])
        shown = ", ".join(names[:10]) + (" ..." if len(names) > 10 else "")
        raise ArtifactNotFoundError(
            f"{self.qualified_name} has no file {name!r}; it has: {shown or 'nothing'}"
        )

    def download(self, root: str | os.PathLike[str] | None = None) -> Path:
        """The files on local disk. ``root`` None: the version directory itself (the files
        are already local; do not edit them). Else every file is hard-linked (store mode
        ``link``, same file system) or copied into ``root`` under its name, replacing a file
        there; returns ``root`` as a ``Path``. References are not downloaded.

        Raises:
            ArtifactError: ``root`` cannot be written (nothing half-written stays there
                for the file that failed).
        """
        if root is None:
            return self.path
        from expr_tracker.artifacts.files import link_or_copy

        out = Path(root)
        try:  # root exists afterwards, also for a version of references only
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ArtifactError(f"cannot download {self.qualified_name} to {out}: {exc}") from exc
        for name in self.files():
            dst = out / name
            # a short name: the file's own may already be at the 255-byte limit
            tmp = dst.with_name(f".et-download-{os.getpid()}-{uuid.uuid4().hex[:12]}")
            try:
                dst.parent.mkdir(parents=True, exist_ok=True)
                if tmp.exists():
                    tmp.unlink()
                link_or_copy(self.path / name, tmp, self._mode)
                os.replace(tmp, dst)
            except OSError as exc:
                try:
                    tmp.unlink()
                except OSError:
                    pass
                raise ArtifactError(
                    f"cannot download {self.qualified_name} to {out}: {exc}"
                ) from exc
        return out

    def check(self) -> None:
        """The cheap integrity check ``use_artifact`` runs: every stored file exists with its
        recorded size; a file whose modification time changed since it was logged is
        re-hashed. Raises :class:`ArtifactCorruptedError` naming the files that differ."""
        from expr_tracker.artifacts.files import hash_file

        bad = []
        for name, entry in self._files.items():
            p = self.path / name
            try:
                st = p.stat()
            except OSError:
                bad.append(f"{name} (missing)")
                continue
            if st.st_size != entry["size"]:
                bad.append(f"{name} (size {st.st_size} bytes, logged {entry['size']})")
            elif entry.get("mtime_ns") is not None and st.st_mtime_ns != entry["mtime_ns"]:
                if hash_file(p)[1] != entry["sha256"]:
                    bad.append(f"{name} (content changed)")
        self._raise_if(bad)

    def verify(self) -> bool:
        """Re-hash every stored file against the manifest; True when all match.

        Raises:
            ArtifactCorruptedError: naming every file missing or changed.
        """
        from expr_tracker.artifacts.files import hash_file

        bad = []
        for name, entry in self._files.items():
            try:
                size, sha = hash_file(self.path / name)
            except OSError:
                bad.append(f"{name} (missing)")
                continue
            if (size, sha) != (entry["size"], entry["sha256"]):
                bad.append(f"{name} (content changed)")
        self._raise_if(bad)
        return True

    def _raise_if(self, bad: list[str]) -> None:
        if bad:
            shown = ", ".join(bad[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
            raise ArtifactCorruptedError(
                f"{self.qualified_name} at {self.path} no longer matches its manifest: "
                f"{shown} (a file stored as a hard link changes when its source is edited "
                "in place; use artifacts.mode: copy to keep versions independent)"
            )

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
            "run": self.run,
        }

    def __repr__(self) -> str:
        return (
            f"ArtifactVersion({self.qualified_name!r}, type={self.type!r}, "
            f"digest={self.digest[:12]!r}, files={len(self._files)})"
        )
