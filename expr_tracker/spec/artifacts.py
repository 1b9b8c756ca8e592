"""The run spec's ``artifacts`` section: how ``et.log_artifact`` stores files."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from expr_tracker.spec.fields import _FORBID


class ArtifactsSpec(BaseModel):
    """Artifacts: versioned files per project, in ``<dir>/<project>/artifacts/``."""

    model_config = _FORBID

    mode: Literal["link", "copy"] = Field(
        "link",
        description="link: hard-link files into the store when the file system allows, "
        "copy otherwise (an in-place edit of a linked source changes the stored version); "
        "copy: always copy (read-only copies)",
    )
