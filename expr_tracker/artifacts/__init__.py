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

from typing import Any

from expr_tracker.artifacts.errors import (
    ArtifactCorruptedError,
    ArtifactError,
    ArtifactNameError,
    ArtifactNotFoundError,
    ArtifactTypeError,
)
from expr_tracker.artifacts.model import Artifact, ArtifactVersion

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

#: names imported on first use, so ``import expr_tracker`` (which needs ``Artifact``) stays fast
_LAZY = {
    "MODES": "expr_tracker.artifacts.store",
    "ArtifactStore": "expr_tracker.artifacts.store",
    "RunArtifacts": "expr_tracker.artifacts.run_artifacts",
    "read_lineage": "expr_tracker.artifacts.lineage",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
