"""The run spec: Pydantic v2 models for everything a run does.

``RunSpec`` (here) is the root; its sections are ``HistorySpec``, ``SpansSpec``,
``AlertsSpec`` (with ``PolicySpec``, ``ChannelSpec`` and ``RuleSpec``), ``ArtifactsSpec``,
``SystemSpec`` and ``SyncSpec``. Every model forbids unknown keys and
is frozen once validated. The sections live in ``spec.recording`` (history, spans) and
``spec.alerting`` (alerts), the shared field types in ``spec.fields``; this module
re-exports them all. Sizes are bytes and durations seconds; both accept units
(``"64MiB"``, ``"500ms"``, see ``expr_tracker.spec.units``).

Loading, merging and provenance live in ``expr_tracker.spec`` (yaml, merge, sources, resolve); nothing here imports the
runtime.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
)

from expr_tracker.spec.alerting import (
    AlertsSpec,
    ChannelSpec,
    PolicyOverrides,
    PolicySpec,
    RuleSpec,
    check_on_rank,
    effective_policy,
)
from expr_tracker.spec.artifacts import ArtifactsSpec
from expr_tracker.spec.fields import FORBID, FsName, Level, PathStr, RedactedRepr
from expr_tracker.spec.mirroring import (
    backends_as_list,
    check_backend_entry,
    check_backend_kwargs,
    redact_backend_kwargs,
)
from expr_tracker.spec.plain import (
    NAMED_LISTS,
    check_fs_name,
    check_stream_name,
    config_to_dict,
    entry_name,
    named_entries,
    named_entry,
    omegaconf_to_plain,
)
from expr_tracker.spec.recording import (
    BufferSpec,
    CacheSpec,
    HistorySpec,
    PluginSpec,
    SpansSpec,
)
from expr_tracker.spec.redact import redact_config, redact_options
from expr_tracker.spec.sync import SyncSpec
from expr_tracker.spec.system import SystemSpec
from expr_tracker.spec.units import Duration
from expr_tracker.units import LEVEL_ALIASES, LEVELS, level_rank, normalize_level

__all__ = [
    "LEVELS",
    "LEVEL_ALIASES",
    "NAMED_LISTS",
    "AlertsSpec",
    "ArtifactsSpec",
    "BufferSpec",
    "CacheSpec",
    "ChannelSpec",
    "HistorySpec",
    "Level",
    "PluginSpec",
    "PolicyOverrides",
    "PolicySpec",
    "RuleSpec",
    "RunSpec",
    "SpansSpec",
    "SyncSpec",
    "SystemSpec",
    "effective_policy",
    "entry_name",
    "level_rank",
    "named_entries",
    "named_entry",
    "normalize_level",
    "omegaconf_to_plain",
]

# --- the run ------------------------------------------------------------------------------


class RunSpec(RedactedRepr, BaseModel):
    """Everything a run does. ``name`` None gets a unique default from ``resolve()``.
    ``repr()`` and ``str()`` hide secrets (channel URLs and options, credentials in
    ``config`` and ``backends``)."""

    model_config = FORBID
    __redacted_fields__ = {
        "config": redact_config,
        "backends": redact_options,
        "backend_kwargs": redact_backend_kwargs,
    }

    project: Annotated[str, AfterValidator(check_fs_name)] = "default"
    name: Optional[FsName] = Field(
        None, description="run name; default: a timestamp and a random suffix"
    )
    dir: PathStr = Field("./runs", description="runs live in <dir>/<project>/<name>/")
    run_dir: Optional[PathStr] = Field(None, description="the run directory itself")
    group: Optional[str] = None
    tags: list[str] = Field(default_factory=list)
    notes: Optional[str] = None
    entity: Optional[str] = Field(
        None, description="who the run belongs to (a team or user; recorded in run.json)"
    )
    job_type: Optional[str] = Field(
        None, description="what kind of job this is (train, eval ...; recorded in run.json)"
    )
    mode: Literal["offline", "online", "disabled"] = Field(
        "offline",
        description="disabled: a no-op run that writes nothing; online is offline here "
        "(local files only)",
    )
    stream: Optional[Annotated[str, AfterValidator(check_stream_name)]] = Field(
        None, description="producer name: letters, digits, '_' and '-'"
    )
    resume: Literal["allow", "never", "must"] = Field(
        "allow",
        description="an existing run of this name: allow: continued if started with the same "
        "config, else <name>-2 starts; must: continued whatever the config (the change "
        "recorded in run.json); never: always a new run",
    )
    config: Annotated[dict[str, Any], BeforeValidator(config_to_dict)] = Field(default_factory=dict)
    history: HistorySpec = Field(default_factory=HistorySpec)
    spans: SpansSpec = Field(default_factory=SpansSpec)
    alerts: AlertsSpec = Field(default_factory=AlertsSpec)
    artifacts: ArtifactsSpec = Field(default_factory=ArtifactsSpec)
    system: SystemSpec = Field(default_factory=SystemSpec)
    sync: SyncSpec = Field(default_factory=SyncSpec)
    # mirrors (spec/mirroring.py; docs/mirrors.md)
    backends: Annotated[
        list[Annotated[Union[str, dict[str, Any]], AfterValidator(check_backend_entry)]],
        BeforeValidator(backends_as_list),
    ] = Field(
        default_factory=list,
        description="mirrors: wandb, trackio (jsonl: the local files, always written), or "
        "{type: wandb, <init keywords>}",
    )
    backend_kwargs: Annotated[dict[str, dict[str, Any]], BeforeValidator(check_backend_kwargs)] = (
        Field(
            default_factory=dict,
            description="init keywords per backend: {wandb: {entity: ...}, trackio: {...}} (docs/mirrors.md)",
        )
    )
    backend_on_rank: Annotated[
        Union[int, list[int], Literal["all"], None], BeforeValidator(check_on_rank)
    ] = Field(0, description="ranks that mirror (a rank, a list of ranks, or 'all'; null is 'all')")
    backend_queue_size: int = Field(
        10_000, ge=1, description="rows a mirror holds while its backend is busy; more are dropped"
    )
    backend_finish_timeout: Duration = Field(
        30.0,
        ge=0,
        description="seconds finish() waits for the mirrors to drain (one deadline for all; docs/mirrors.md)",
    )
