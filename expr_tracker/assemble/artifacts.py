"""Artifacts of a run: the project's store and the run's lineage file, attached as
``run.artifacts`` (``Run.log_artifact``/``use_artifact`` delegate to it). Nothing is created
on disk until the run logs or uses an artifact, and the artifact package is imported on the
first access of ``run.artifacts`` (docs/architecture.md "Cold start")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from expr_tracker.history.paths import file_name


def store_root(run_dir: Path) -> Path:
    """The project's store, beside the run: ``<dir>/<project>/artifacts`` (with ``run_dir=``,
    ``artifacts/`` beside the run directory)."""
    return Path(run_dir).absolute().parent / "artifacts"


def build_artifacts(run: Any, spec: Any, run_dir: Path, stream: str | None, file_rank: int) -> None:
    """Attach ``run.artifacts`` (a :class:`~expr_tracker.artifacts.RunArtifacts`, built on
    its first access) and its ``et.info()`` section."""
    mode = spec.artifacts.mode
    lineage = run_dir / file_name("artifacts", stream, file_rank)

    def make() -> Any:
        from expr_tracker.artifacts import ArtifactStore, RunArtifacts

        return RunArtifacts(run, ArtifactStore(store_root(run_dir), mode=mode), lineage)

    run.defer_artifacts(make)
    run.add_stats("artifacts", lambda: run.artifacts.stats())
