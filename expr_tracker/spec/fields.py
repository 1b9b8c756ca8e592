"""Pieces every part of the run spec uses: the ``Level`` field type (over the level table of
``expr_tracker.units``), the lists whose entries merge by name, and the shared validators
(file-system names, paths, ``config`` as plain data, secret-hiding ``repr``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
)

from expr_tracker.spec.plain import check_fs_name, path_str
from expr_tracker.units import normalize_level

# --- levels -------------------------------------------------------------------------------

# LEVELS, LEVEL_ALIASES, normalize_level and level_rank: the one table of expr_tracker.units

#: An alert level; aliases and any case are accepted and stored as the canonical name.
Level = Annotated[
    Literal["debug", "info", "warning", "error", "critical"], BeforeValidator(normalize_level)
]
# --- shared pieces ------------------------------------------------------------------------

FORBID = ConfigDict(extra="forbid", frozen=True)


class RedactedRepr:
    """Mixed into a model whose free-form fields may hold secrets: ``repr()`` and ``str()``
    show those fields redacted (``__redacted_fields__``: field -> function), as ``spec.json`` does."""

    __redacted_fields__: Any = {}

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():  # type: ignore[misc]
            redact = self.__redacted_fields__.get(name)
            yield name, (redact(value) if redact is not None and value is not None else value)


FsName = Annotated[str, AfterValidator(check_fs_name)]
PathStr = Annotated[str, BeforeValidator(path_str)]
NonEmpty = Annotated[str, Field(min_length=1)]
