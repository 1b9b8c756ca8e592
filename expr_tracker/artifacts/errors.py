"""Errors of the artifacts package (all :class:`~expr_tracker.errors.ExprTrackerError`)."""

from __future__ import annotations

from expr_tracker.errors import ExprTrackerError


class ArtifactError(ExprTrackerError):
    """An artifact could not be logged or read: the store is not writable, the disk is full,
    a file cannot be read. Nothing half-done is left behind when it is raised."""


class ArtifactNameError(ArtifactError, ValueError):
    """A name (artifact, file inside an artifact, alias, type) that is not valid: the
    message names the field, the value and what is valid."""


class ArtifactNotFoundError(ArtifactError, LookupError, FileNotFoundError):
    """No such artifact, version, alias or file in the project's store.

    Also a ``LookupError`` and a ``FileNotFoundError`` (so an ``OSError``, with ``errno``
    None as for any ``FileNotFoundError("message")``): code written for a missing file
    (``except FileNotFoundError``) catches a missing artifact too."""


class ArtifactTypeError(ArtifactError, ValueError):
    """``use_artifact(..., type=...)`` asked for another type than the version has, or
    ``log_artifact`` logged a type other than the one the name already has (one type per
    artifact name)."""


class ArtifactCorruptedError(ArtifactError):
    """A stored version cannot be trusted: a stored file no longer matches its manifest
    (size or sha256: edited or removed after it was logged; with ``mode: link`` the store
    shares the source file), or the store was tampered with (a manifest that is not valid,
    a version directory or file that leads outside the store, a FIFO in place of a file).
    The message names the file or manifest entry; nothing was written when it is raised."""
