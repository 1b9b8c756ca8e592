"""``RunArtifacts``: what ``build`` attaches to a run as ``run.artifacts``. ``Run.log_artifact``
and ``Run.use_artifact`` (and ``et.log_artifact``/``et.use_artifact``) delegate here: the
store call, the lineage line, the ``"artifact"`` event, the counters in ``et.info()``."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from expr_tracker.artifacts.errors import ArtifactError, ArtifactNotFoundError, ArtifactTypeError
from expr_tracker.artifacts.lineage import append_lineage, current_step
from expr_tracker.artifacts.model import Artifact, ArtifactVersion, check_metadata, version_digest
from expr_tracker.artifacts.names import parse_ref, validate_name, validate_type
from expr_tracker.artifacts.store import ArtifactStore, check_mode


class RunArtifacts:
    """A run's view of its project's :class:`ArtifactStore`.

    ``run`` is duck-typed: ``project``, ``name``, ``stream``, ``rank``, ``dir``,
    ``history`` (for the step), ``emit(event, payload)`` and ``warner``.
    """

    def __init__(self, run: Any, store: ArtifactStore, lineage_path: Path) -> None:
        self.run = run
        self.store = store
        self.lineage_path = lineage_path
        self._lock = threading.Lock()  # one lineage append at a time
        self.logged = 0
        self.used = 0
        self.lineage_errors = 0
        self.rewritten = 0  # linked files of earlier versions found rewritten in place
        self.index_lines_skipped = 0  # bad lines in the store's index, last seen

    def log_artifact(
        self,
        artifact_or_path: Artifact | str | os.PathLike[str],
        name: str | None = None,
        type: str | None = None,  # noqa: A002 - wandb's keyword
        aliases: Any = None,
        metadata: dict[str, Any] | None = None,
        mode: str | None = None,
    ) -> ArtifactVersion:
        """See :func:`expr_tracker.api.log_artifact`."""
        if mode is not None:
            check_mode(mode)  # before anything is read
        self._check_not_in_run_dir()
        artifact = as_artifact(artifact_or_path, name, type)
        merged = None
        if metadata is not None:
            merged = {**artifact.metadata, **check_metadata(metadata)}
        version, new = self.store.log(
            artifact, aliases=aliases, metadata=merged, run=self._identity(), mode=mode
        )
        if artifact is artifact_or_path:
            artifact.resolve(version)
        self._warn_skipped()
        for notice in self.store.notices:
            self.rewritten += 1
            self.run.warner.warn(
                ("artifacts", "rewritten", version.name),
                "expr_tracker: %s",
                notice,
            )
        self.logged += 1
        self._record("logged", version, new=new)
        return version

    def use_artifact(
        self,
        ref: str | ArtifactVersion | Artifact,
        type: str | None = None,  # noqa: A002
    ) -> ArtifactVersion | Artifact:
        """See :func:`expr_tracker.api.use_artifact`. An ``ArtifactVersion`` or ``Artifact``
        given is the object returned, resolved (refreshed from the store)."""
        if type is not None:
            validate_type(type, "type")
        given: ArtifactVersion | Artifact | None = None
        if isinstance(ref, ArtifactVersion):
            given = ref
            self._check_same_store(ref)
            version = self._same_contents(ref.name, ref.version, ref.digest)
        elif isinstance(ref, Artifact):
            given = ref
            version = self._resolve_artifact(ref)
        else:
            name, selector = parse_ref(ref)
            version = self.store.get(name, selector)
        if type is not None and version.type != type:
            shown = ref if isinstance(ref, str) else version.qualified_name
            raise ArtifactTypeError(
                f"artifact {version.qualified_name} has type {version.type!r}, not {type!r} "
                f"(use_artifact({shown!r}, type={version.type!r}), or no type= to take any)"
            )
        self._warn_skipped()
        version.check()
        self.used += 1
        self._record("used", version)
        if isinstance(given, ArtifactVersion):
            given.refresh_from(version)
            return given
        if isinstance(given, Artifact):
            given.resolve(version)
            return given
        return version

    def _check_same_store(self, ref: ArtifactVersion) -> None:
        # the same name and number in this project's store may be other contents
        store = Path(ref.path).absolute().parent.parent
        if store != self.store.root.absolute():
            raise ArtifactNotFoundError(
                f"{ref.qualified_name} is a version of the store {store}, not of this run's "
                f"project ({self.store.root}); use_artifact reads the run's own project"
            )

    def _same_contents(self, name: str, number: int, digest: str) -> ArtifactVersion:
        """``name:v<number>`` of the store, which must still hold ``digest``.

        Raises:
            ArtifactNotFoundError: it is gone, or the store's version holds other contents
                (its index was replaced or edited since the object was made).
        """
        version = self.store.get(name, f"v{number}")
        if version.digest != digest:
            raise ArtifactNotFoundError(
                f"{version.qualified_name} of {self.store.root} now holds other contents "
                f"(digest {version.digest[:16]}..., not {digest[:16]}...): the version given "
                "is no longer in the store"
            )
        return version

    def _resolve_artifact(self, artifact: Artifact) -> ArtifactVersion:
        """The stored version an ``et.Artifact`` stands for: the one ``log_artifact`` made
        of it (when it was logged and not changed since), else the newest version of its name
        whose digest is that of its contents as they are now (every file hashed).

        Raises:
            ArtifactNotFoundError: no version of its name holds these contents.
            ArtifactError: a source file cannot be read.
        """
        done = artifact.resolved
        if done is not None:
            self._check_same_store(done)
            return self._same_contents(done.name, done.version, done.digest)
        digest = content_digest(artifact)
        item = self.store.catalog().get(artifact.name) or {"versions": {}}
        found = [v for v, rec in item["versions"].items() if rec.get("digest") == digest]
        if not found:
            raise ArtifactNotFoundError(
                f"no version of artifact {artifact.name!r} in {self.store.root} holds the "
                f"contents of this et.Artifact (digest {digest[:16]}...): log it first "
                "(et.log_artifact(artifact))"
            )
        return self.store.get(artifact.name, f"v{max(found)}")

    def _warn_skipped(self) -> None:
        """One warning (counted in ``et.info()["warnings"]``) when the index read last held
        bad lines: someone else's damage, skipped, never a reason to fail."""
        skipped = self.store.skipped
        if skipped:
            self.index_lines_skipped = skipped
            self.run.warner.warn(
                ("artifacts", "index", "bad lines"),
                "expr_tracker: artifact index %s: %d bad line(s) skipped (not JSON, nested too "
                "deeply, or not a version or alias record with valid names)",
                self.store.root / "index.jsonl",
                skipped,
            )

    def _check_not_in_run_dir(self) -> None:
        """A run directory named ``artifacts`` is where the project's store would go: its
        versions would mix with the run's files (an artifact ``metrics.jsonl`` takes the
        run's metric file) and ``et runs`` would take the run for the store."""
        if Path(self.run.dir).absolute() == self.store.root.absolute():
            raise ArtifactError(
                f"cannot log an artifact from a run whose directory is the project's "
                f"artifact store ({self.store.root}): the run is named 'artifacts'; give "
                "the run another name (or run_dir=); nothing was logged"
            )

    def stats(self) -> dict[str, Any]:
        """``et.info()["artifacts"]``: versions logged and used, lineage lines that failed,
        the store's folder as ``root`` (the spec's name) and ``store`` (the same path)."""
        return {
            "root": str(self.store.root),
            "logged": self.logged,
            "used": self.used,
            "lineage_errors": self.lineage_errors,
            "rewritten_in_place": self.rewritten,
            "index_lines_skipped": self.index_lines_skipped,
            "store": str(self.store.root),
            "mode": self.store.mode,
        }

    def _identity(self) -> dict[str, Any]:
        run = self.run
        return {
            "project": run.project,
            "name": run.name,
            "stream": run.stream,
            "rank": run.rank,
            "dir": str(Path(run.dir).absolute()),
        }

    def _record(self, action: str, version: ArtifactVersion, *, new: bool | None = None) -> None:
        step = current_step(self.run)
        line: dict[str, Any] = {
            "action": action,
            "name": version.name,
            "version": version.version,
            "digest": version.digest,
            "type": version.type,
            "aliases": list(version.aliases),
            "step": step,
            "time": time.time(),
            "path": str(version.path),
        }
        if new is not None:
            line["new"] = new
        try:
            with self._lock:
                self.lineage_path.parent.mkdir(parents=True, exist_ok=True)
                append_lineage(self.lineage_path, line)
        except OSError as exc:
            # the version is complete and returned; the lineage line is measurement
            self.lineage_errors += 1
            self.run.warner.warn(
                ("artifacts", "lineage", type(exc).__name__),
                "expr_tracker: cannot write %s (%s); artifact lineage is not recorded",
                self.lineage_path,
                exc,
            )
        self.run.emit(
            "artifact",
            {
                "action": action,
                "name": version.name,
                "version": version.version,
                "type": version.type,
                "digest": version.digest,
                "path": str(version.path),
                "aliases": list(version.aliases),
                "metadata": dict(version.metadata),
                "step": step,
            },
        )


def as_artifact(
    artifact_or_path: Any,
    name: str | None = None,
    type: str | None = None,  # noqa: A002
) -> Artifact:
    """An :class:`Artifact` as given (``name``/``type`` override its own), or one made from a
    file or directory path (``name`` defaults to the path's last part, ``type`` to
    ``dataset``).

    Raises:
        ArtifactNameError: a bad name or type (for a path whose last part is not a valid
            name, the message asks for ``name=``).
        ArtifactError: a path that is neither a file nor a directory; another object.
    """
    if isinstance(artifact_or_path, Artifact):
        art = artifact_or_path
        if name is None and type is None:
            return art
        copy = Artifact(
            validate_name(name) if name is not None else art.name,
            validate_type(type) if type is not None else art.type,
            art.description,
            art.metadata,
        )
        for entry, src in art.files.items():
            copy.add_file(src, entry)
        for entry, uri in art.references.items():
            copy.add_reference(uri, entry)
        return copy
    if not isinstance(artifact_or_path, (str, os.PathLike)):
        raise ArtifactError(
            "log_artifact takes an et.Artifact or a path to a file or directory, not "
            f"{artifact_or_path.__class__.__name__}"
        )
    path = Path(artifact_or_path)
    if not path.exists():
        raise ArtifactError(f"log_artifact: {str(path)!r} does not exist")
    if name is None:
        from expr_tracker.artifacts.errors import ArtifactNameError

        try:
            name = validate_name(path.resolve().name, "artifact name (from the path)")
        except ArtifactNameError as exc:
            raise ArtifactNameError(f"{exc}; pass name= to log_artifact") from None
    art = Artifact(name, type if type is not None else "dataset")
    if path.is_dir():
        art.add_dir(path)
    elif path.is_file():
        art.add_file(path)
    else:
        raise ArtifactError(f"log_artifact: {str(path)!r} is not a regular file or directory")
    return art


def content_digest(artifact: Artifact) -> str:
    """The digest the store would give ``artifact``'s contents as they are now (every file
    hashed; see docs/artifacts.md "On disk").

    Raises:
        ArtifactError: a source file cannot be read.
    """
    from expr_tracker.artifacts.files import hash_file

    files = []
    for entry, src in sorted(artifact.files.items()):
        try:
            size, sha = hash_file(src)
        except OSError as exc:
            raise ArtifactError(
                f"artifact file {entry!r}: cannot read {str(src)!r}: {exc}"
            ) from exc
        files.append({"name": entry, "size": size, "sha256": sha})
    refs = [{"name": k, "uri": v} for k, v in sorted(artifact.references.items())]
    return version_digest(files, refs)
