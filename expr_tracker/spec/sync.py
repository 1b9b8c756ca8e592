"""The run spec's ``sync`` section: upload the run to a bucket while it trains
(docs/team.md "Sync during training")."""

from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field

from expr_tracker.spec.fields import FORBID
from expr_tracker.spec.units import Duration

#: smallest ``sync.interval``, seconds (100 ms: a test may sync often; a real bucket wants
#: a minute or more, each pass costing a few requests per changed producer)
SYNC_MIN_INTERVAL = 0.1


_INTERVAL_RULE = (
    f"must be at least {SYNC_MIN_INTERVAL:g} s (100ms), e.g. 60s or 5m: each pass asks the "
    "bucket about every producer that changed"
)


def _sync_interval(value: float) -> float:
    if not value >= SYNC_MIN_INTERVAL:
        raise ValueError(_INTERVAL_RULE)
    return value


def _sync_interval_sign(value: Any) -> Any:
    """A negative interval gets the interval's own rule, not a duration's ``>= 0`` (this
    runs before the duration is parsed)."""
    negative = (isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0) or (
        isinstance(value, str) and value.strip().startswith("-")
    )
    if negative:
        raise ValueError(_INTERVAL_RULE)
    return value


def _sync_url(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    scheme, _, rest = value.partition("://")
    if scheme not in ("s3", "file") or not rest.strip("/"):
        raise ValueError(
            "not a sync URL: use s3://bucket/prefix or file:///path (a folder on a shared "
            "file system)"
        )
    if "@" in rest.split("/", 1)[0]:
        raise ValueError(
            "a sync URL holds no credentials (user@ or key:secret@): they come from the "
            "AWS chain (AWS_ACCESS_KEY_ID ..., AWS_PROFILE, instance roles)"
        )
    return value


class SyncSpec(BaseModel):
    """Background sync: a thread of each process uploads the files it writes (its stream
    and rank, and the system stream where this process samples) to ``url`` every
    ``interval``, with the upload of ``et sync``, and once more at finish (waiting at most
    ``finish_timeout``). Never blocks ``et.log()``; a failed pass warns once and is retried
    at the next interval."""

    model_config = FORBID

    url: Annotated[Optional[str], AfterValidator(_sync_url)] = Field(
        None, description="s3://bucket/prefix or file:///path; null: no background sync"
    )
    interval: Annotated[
        Duration, AfterValidator(_sync_interval), BeforeValidator(_sync_interval_sign)
    ] = Field(60.0, description="seconds between two uploads (at least 100ms)")
    finish_timeout: Duration = Field(
        30.0,
        ge=0,
        description="seconds finish() waits for the last upload; past it the run ends and "
        "`et sync DIR URL` uploads the rest",
    )
    endpoint_url: Optional[str] = Field(
        None,
        description="an S3-compatible store's endpoint (default: the AWS_ENDPOINT_URL "
        "variable); no credentials here: they come from the AWS chain",
    )
