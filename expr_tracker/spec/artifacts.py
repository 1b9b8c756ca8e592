"""The run spec's ``artifacts`` section: how ``et.log_artifact`` stores files."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from expr_tracker.spec.fields import FORBID


class ArtifactsSpec(BaseModel):
    """Artifacts: versioned files per project, in ``<dir>/<project>/artifacts/``."""

    model_config = FORBID

    mode: Literal["copy", "link"] = Field(
        "copy",
        description="copy: store a read-only copy of each file (a reflink clone where the "
        "file system has one), so rewriting a source in place never changes a logged "
        "version; link: hard-link files into the store when the file system allows, copy "
        "otherwise (no copy, but an in-place edit of a linked source, as torch.save to the "
        "same path does, changes the stored version)",
    )
