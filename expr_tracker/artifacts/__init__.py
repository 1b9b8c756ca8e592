"""Artifacts: versioned, content-addressed files per project, and per-run lineage.

``et.Artifact`` (being built) and ``et.log_artifact``/``et.use_artifact`` (through the
current run's :class:`RunArtifacts`) store versions in ``<dir>/<project>/artifacts/``
(:class:`ArtifactStore`); each run records what it logged and used in
``artifacts[.S][.rankN].jsonl`` (:mod:`.lineage`). See docs/artifacts.md.

Modules: ``names`` (validation), ``model`` (Artifact, ArtifactVersion), ``files`` (hashing,
link or copy, appends, locks), ``store`` (the store), ``lineage`` (per-run records),
``run_artifacts`` (what a run's ``log_artifact``/``use_artifact`` do), ``errors``.
Imports only leaves and ``history`` (``atomic_write``, ``normalize_value``).
"""

from __future__ import annotations

from expr_tracker.artifacts.errors import (
    ArtifactCorruptedError,
    ArtifactError,
    ArtifactNameError,
    ArtifactNotFoundError,
    ArtifactTypeError,
)
from expr_tracker.artifacts.lineage import read_lineage
from expr_tracker.artifacts.model import Artifact, ArtifactVersion
from expr_tracker.artifacts.run_artifacts import RunArtifacts
from expr_tracker.artifacts.store import MODES, ArtifactStore

__all__ = [
    "MODES",
    "Artifact",
    "ArtifactCorruptedError",
    "ArtifactError",
    "ArtifactNameError",
    "ArtifactNotFoundError",
    "ArtifactStore",
    "ArtifactTypeError",
    "ArtifactVersion",
    "RunArtifacts",
    "read_lineage",
]
