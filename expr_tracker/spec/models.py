"""The run spec: Pydantic v2 models for everything a run does.

``RunSpec`` is the root; its sections are ``HistorySpec``, ``SpansSpec`` and ``AlertsSpec``
(with ``PolicySpec``, ``ChannelSpec`` and ``RuleSpec``). Every model forbids unknown keys and
is frozen once validated. Sizes are bytes and durations seconds; both accept units
(``"64MiB"``, ``"500ms"``, see ``expr_tracker.spec.units``).

Loading, merging and provenance live in ``expr_tracker.spec`` (yaml, merge, sources, resolve); nothing here imports the
runtime.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Optional, Union, get_args

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    WithJsonSchema,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from expr_tracker.ruletext import split_rule
from expr_tracker.spec.errors import redact_config, redact_options
from expr_tracker.spec.units import Duration, OptionalDuration, Size
from expr_tracker.units import LEVEL_ALIASES, LEVELS, level_rank, normalize_level

__all__ = [
    "LEVELS",
    "LEVEL_ALIASES",
    "NAMED_LISTS",
    "AlertsSpec",
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
    "effective_policy",
    "entry_name",
    "level_rank",
    "named_entries",
    "named_entry",
    "normalize_level",
    "omegaconf_to_plain",
]

# --- levels -------------------------------------------------------------------------------

# LEVELS, LEVEL_ALIASES, normalize_level and level_rank: the one table of expr_tracker.units

#: An alert level; aliases and any case are accepted and stored as the canonical name.
Level = Annotated[
    Literal["debug", "info", "warning", "error", "critical"], BeforeValidator(normalize_level)
]

# --- lists of named things ----------------------------------------------------------------

#: Dotted paths of the lists whose entries merge by name (and may be written as mappings).
NAMED_LISTS: frozenset[str] = frozenset({"alerts.rules", "alerts.channels"})


def entry_name(list_path: str, entry: Any) -> str | None:
    """Name of an entry of a named list: its ``name``; for channels, else its ``type``;
    a string rule is its own name. None when the entry has no name."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, Mapping):
        name = entry.get("name")
        if name is None and list_path.endswith("channels"):
            name = entry.get("type")
        return name if isinstance(name, str) and name else None
    name = getattr(entry, "name", None)
    return name if isinstance(name, str) else None


def named_entries(value: Any) -> Any:
    """Normalise a named list written as a mapping ``{name: entry}`` to a list of entries
    (each as :func:`named_entry` makes it; a ``None`` entry is dropped: how a later source
    removes an entry). Lists and anything else are returned unchanged."""
    if not isinstance(value, Mapping):
        return value
    return [named_entry(key, entry) for key, entry in value.items() if entry is not None]


def named_entry(key: Any, entry: Any) -> Any:
    """One entry of a named list written as a mapping, with its name from ``key``.

    A mapping gets ``name`` filled from the key (an explicit ``name`` wins). A string is a
    rule in the one-line form (``"cond => level: message"``, read as ``et rules check`` and
    ``AlertRule.parse`` read it) and becomes ``{"name": key, "condition": cond, "level":
    level, "message": message}`` (level and message only when written). Anything else is
    returned unchanged.
    """
    if isinstance(entry, str):
        return {"name": key, **_one_line_rule(entry)}
    if isinstance(entry, Mapping):
        return {"name": key, **entry} if entry.get("name") is None else dict(entry)
    return entry


def _one_line_rule(text: str) -> dict[str, Any]:
    cond, level, message = split_rule(text)
    out: dict[str, Any] = {"condition": cond if level is not None else text}
    if level is not None:
        out["level"] = level
    if message is not None:
        out["message"] = message
    return out


# --- shared pieces ------------------------------------------------------------------------

_FORBID = ConfigDict(extra="forbid", frozen=True)


class _RedactedRepr:
    """Mixed into a model whose free-form fields may hold secrets: ``repr()`` and ``str()``
    show those fields redacted (``__redacted_fields__``: field -> function), as ``spec.json`` does."""

    __redacted_fields__: Any = {}

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():  # type: ignore[misc]
            redact = self.__redacted_fields__.get(name)
            yield name, (redact(value) if redact is not None and value is not None else value)


_UNSAFE_NAME = re.compile(r"[/\\\x00-\x1f\x7f]")
_STREAM = re.compile(r"^[A-Za-z0-9_\-]+$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_RANK_LIKE = re.compile(r"^rank[0-9]+$", re.IGNORECASE)
#: bound on ``project`` and ``name`` (each one directory name; 255 is the usual file system
#: limit, the rest is room for names built from them, such as Hydra job names)
MAX_NAME_BYTES = 200
#: bound on ``stream``: ``.metrics.<stream>.rank<N>.meta.json.<pid>.<thread>.tmp`` (the
#: sidecar's temporary name, the longest file a producer writes) stays under 255 bytes
MAX_STREAM_CHARS = 64


def _fs_name(value: Any) -> Any:
    if value is None or not isinstance(value, str):
        return value
    if not value or value.strip() != value or value in (".", "..") or _UNSAFE_NAME.search(value):
        raise ValueError(
            "must be a non-empty name usable as one directory: no '/', '\\', control "
            "characters or surrounding spaces, and not '.' or '..'"
        )
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise ValueError(
            f"must be at most {MAX_NAME_BYTES} bytes in UTF-8 (this one has {size}): it names "
            "a directory, and file systems allow 255 bytes per name, with room kept for the "
            "names made from it"
        )
    return value


def _stream_name(value: Any) -> Any:
    if value is None or not isinstance(value, str):
        return value
    if not _STREAM.match(value):
        raise ValueError(
            "must be letters, digits, '_' or '-' only (a stream names files inside the run "
            "directory, so '/', '.' and '..' are not allowed)"
        )
    if len(value) > MAX_STREAM_CHARS:
        raise ValueError(
            f"must be at most {MAX_STREAM_CHARS} characters (this one has {len(value)}): every "
            "file of the stream (metrics.<stream>.rankN.meta.json, its lock and temporary "
            "names) must fit the file system's 255-byte name limit"
        )
    if _RANK_LIKE.match(value):
        raise ValueError(
            f"{value!r} would be read as a rank suffix (metrics.{value}.jsonl is the file of "
            "rank " + value[4:] + " of the main stream): choose another stream name, e.g. "
            f"'w{value}' or 'worker{value[4:]}'"
        )
    return value


def _path_str(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _is_omegaconf(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "omegaconf"


def _keep_literal(key_path: str, exc: Exception, raw: Any) -> Any:
    import warnings

    reason = str(getattr(exc, "msg", exc)).splitlines()[0]
    warnings.warn(
        f"{key_path}: interpolation {raw!r} could not be resolved ({reason}); kept literally",
        stacklevel=4,
    )
    return raw


def omegaconf_to_plain(node: Any, on_error: Any = None, key_path: str = "") -> Any:
    """An OmegaConf DictConfig/ListConfig as plain dicts/lists, each value resolved on its own.

    Args:
        node: the container (anything else is returned unchanged).
        on_error: ``on_error(key_path, exc, raw) -> value`` for a value that cannot be resolved
            (a broken interpolation; ``raw`` is its text) or is missing (``???``; ``raw`` is
            ``"???"``); return ``_SKIP`` to leave the key out. Default: keep the raw text,
            with one warning naming the key.
        key_path: dotted key of ``node`` (for messages).
    """
    from omegaconf import DictConfig, ListConfig, OmegaConf

    on_error = on_error or _keep_literal
    if isinstance(node, DictConfig):
        if node._is_none():
            return None
        keys: list[Any] = list(node.keys())
        out: Any = {}
    elif isinstance(node, ListConfig):
        if node._is_none():
            return None
        keys = list(range(len(node)))
        out = []
    else:
        return node
    for key in keys:
        child_path = f"{key_path}.{key}" if key_path else str(key)
        try:
            value = node[key]
        except Exception as exc:  # InterpolationResolutionError, MissingMandatoryValue, ...
            raw = node._get_node(key)._value()
            value = on_error(child_path, exc, raw)
            if value is _SKIP:
                continue
        if OmegaConf.is_config(value):
            value = omegaconf_to_plain(value, on_error, child_path)
        if isinstance(out, dict):
            out[key] = value
        else:
            out.append(value)
    return out


_SKIP: Any = object()


def _config_dict(value: Any) -> Any:
    """Accept OmegaConf containers, argparse namespaces, dataclasses and models as ``config``.

    An OmegaConf interpolation that cannot be resolved stays literal, with a warning.
    """
    if value is None:
        return {}
    if _is_omegaconf(value):
        return omegaconf_to_plain(value, key_path="config")
    if isinstance(value, BaseModel):
        return value.model_dump()
    if hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        import dataclasses

        return dataclasses.asdict(value)
    if type(value).__name__ == "Namespace" and hasattr(value, "__dict__"):
        return dict(vars(value))
    return value


_FsName = Annotated[str, AfterValidator(_fs_name)]
_PathStr = Annotated[str, BeforeValidator(_path_str)]
_NonEmpty = Annotated[str, Field(min_length=1)]

# --- history ------------------------------------------------------------------------------


class BufferSpec(BaseModel):
    """Write buffering of one JSONL file: flush after ``size`` records, every ``interval``
    seconds, and never hold a record longer than ``max_seconds`` (None: no bound)."""

    model_config = _FORBID

    size: int = Field(50, ge=1, description="records buffered before a flush")
    interval: Duration = Field(1.0, description="seconds between background flushes")
    max_seconds: OptionalDuration = Field(
        5.0, description="seconds a record may wait unflushed; null disables"
    )
    max_pending_records: int = Field(
        100_000, ge=1, description="records held while the disk fails before the oldest drop"
    )


class CacheSpec(BaseModel):
    """In-memory cache of committed rows (queries read it instead of the disk)."""

    model_config = _FORBID

    bytes: Size = Field(1 << 30, description="bytes of encoded rows kept in memory")
    rows: int = Field(2_000_000, ge=0, description="rows kept in memory")


class HistorySpec(BaseModel):
    """The metric history: commit rules, caching and buffering."""

    model_config = _FORBID

    step_policy: Literal["monotonic", "allow"] = Field(
        "monotonic", description="monotonic: a backward step is dropped with a warning"
    )
    max_open_seconds: OptionalDuration = Field(
        60.0, description="seconds before an idle open row is written to disk; null disables"
    )
    rank_aware: bool = Field(
        True, description="suffix file names with .rankN under torch.distributed"
    )
    cache: CacheSpec = Field(default_factory=CacheSpec)
    buffer: BufferSpec = Field(default_factory=BufferSpec)
    alert_window: int = Field(4096, ge=1, description="largest point window a rule may use")


# --- spans --------------------------------------------------------------------------------


class PluginSpec(_RedactedRepr, BaseModel):
    """A span plugin named by its registered ``type`` (``cpu_time``, ``torch_memory``, ...).
    ``options`` are checked by name and type when ``et.init`` or ``et config validate``
    runs: ``gpu_stats`` takes ``index`` (an integer >= 0) and ``interval`` (seconds > 0),
    ``torch_memory`` takes ``device`` (null, an index, ``cuda`` or ``cuda:N``), ``cpu_time``
    none."""

    model_config = _FORBID
    __redacted_fields__ = {"options": redact_options}

    type: _NonEmpty
    options: dict[str, Any] = Field(default_factory=dict)


_PRINT_WORDS = ("stdout", "stderr", "logging")


def _check_print(value: Any) -> Any:
    if value is None or isinstance(value, bool) or callable(value):
        return value
    if isinstance(value, str):
        if value in _PRINT_WORDS or (value.startswith("logger:") and len(value) > len("logger:")):
            return value
    raise ValueError(
        "must be null, true/false, 'stdout', 'stderr', 'logging', 'logger:<name>' "
        "or (from Python) a callable taking one string"
    )


#: spans.print: how span enter/exit lines are printed.
SpanPrint = Annotated[
    Any,
    AfterValidator(_check_print),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "null"},
                {"type": "boolean"},
                {"enum": list(_PRINT_WORDS)},
                {"type": "string", "pattern": "^logger:.+$"},
            ],
            "description": "null/false: off; true or stdout/stderr; logging; logger:<name>",
        }
    ),
]


def _plugin_kind(value: Any) -> str:
    return "spec" if isinstance(value, (Mapping, str, PluginSpec)) else "object"


def _plugin_spec_input(value: Any) -> Any:
    return {"type": value} if isinstance(value, str) else value


def _check_plugin_object(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, bytes, list, tuple)):
        raise ValueError(
            "must be a plugin: {type: NAME, options: {...}}, a plugin name, or (from Python) "
            "an object with start(span)/end(span) or a callable fn(span) -> dict"
        )
    if not (callable(value) or callable(getattr(value, "end", None))):
        raise ValueError("a plugin object needs an end(span) method or must be callable")
    return value


class _OrPluginName:
    """JSON Schema of a plugin entry: a PluginSpec or a plugin name."""

    @staticmethod
    def __get_pydantic_json_schema__(core_schema: Any, handler: Any) -> dict[str, Any]:
        return {"anyOf": [{"type": "string", "minLength": 1}, handler(core_schema)]}


#: One entry of spans.plugins: a PluginSpec (from YAML) or a plugin object/callable (from Python).
PluginEntry = Annotated[
    Union[
        Annotated[PluginSpec, BeforeValidator(_plugin_spec_input), _OrPluginName, Tag("spec")],
        Annotated[SkipJsonSchema[Any], AfterValidator(_check_plugin_object), Tag("object")],
    ],
    Discriminator(_plugin_kind),
]


#: smallest ``alerts.watchdog_interval``, seconds
WATCHDOG_MIN_INTERVAL = 0.1


def _watchdog_interval(value: float) -> float:
    if not value >= WATCHDOG_MIN_INTERVAL:
        raise ValueError(
            f"must be at least {WATCHDOG_MIN_INTERVAL:g} s (100ms), e.g. 1s or 30s: the watchdog "
            "wakes up this often to check time-based rules (no_data, age, elapsed), and a "
            "shorter interval only burns CPU"
        )
    return value


class SpansSpec(BaseModel):
    """Spans: timing regions recorded as metrics and into the span file."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    enabled: bool = Field(True, description="record spans at all")
    metrics: bool = Field(True, description="add time_ms/<path> to the metric history")
    count: bool = Field(False, description="add count/<path> to the metric history")
    print: SpanPrint = Field(None, description="print span enter/exit lines")
    async_write: bool = Field(True, description="write the span file from the background flusher")
    plugins: list[PluginEntry] = Field(default_factory=list)
    buffer: BufferSpec = Field(default_factory=BufferSpec)
    # bounds of SpanRecorder (it raises ValueError on a count < 1): rejected here first
    max_record_bytes: Size = Field(8 * 1024**2, ge=1, description="largest span record written")
    max_pending_bytes: Size = Field(
        64 * 1024**2, ge=1, description="span bytes held before dropping"
    )


# --- alerts -------------------------------------------------------------------------------


class PolicySpec(BaseModel):
    """Delivery policy of a channel: timeouts, retries and backoff, rate limit, dedup and
    queue. Set under ``alerts.policy`` for every channel, or per channel under its ``policy``
    (which wins field by field)."""

    model_config = _FORBID

    async_send: bool = Field(True, description="direct et.alert() calls return before sending")
    timeout: Duration = Field(
        10.0,
        description="seconds for the connection (incl. TLS) and again for the exchange "
        "(request, status, headers); one attempt takes at most twice this",
    )
    max_retries: int = Field(3, ge=0)
    backoff_initial: Duration = Field(0.5, description="seconds before the first retry")
    backoff_factor: float = Field(2.0, ge=1.0)
    backoff_max: Duration = Field(30.0, description="longest wait between retries")
    jitter: float = Field(0.1, ge=0.0, le=1.0, description="fraction of random spread on waits")
    retry_on_status: list[Annotated[int, Field(ge=100, le=599)]] = Field(
        default_factory=lambda: [408, 429, 500, 502, 503, 504]
    )
    respect_retry_after: bool = True
    rate_limit_per_minute: Optional[Annotated[float, Field(gt=0.0)]] = Field(
        20.0, description="token bucket rate; null disables"
    )
    on_rate_limited: Literal["drop", "queue", "coalesce"] = "coalesce"
    dedup_window: Duration = Field(
        300.0, description="seconds a duplicate is suppressed; 0 disables"
    )
    queue_size: int = Field(1000, ge=1)
    on_queue_full: Literal["drop_oldest", "drop_new", "block"] = "drop_oldest"
    fail_silently: bool = True


class _Overrides(BaseModel):
    """Base of PolicyOverrides: dumps only the fields that were given."""

    model_config = _FORBID

    @model_serializer(mode="wrap")
    def _only_given(self, handler: Any) -> dict[str, Any]:
        full = handler(self)
        return {k: v for k, v in full.items() if k in self.model_fields_set}


def _make_policy_overrides() -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for name, info in PolicySpec.model_fields.items():
        inner = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        fields[name] = (Optional[inner], Field(None, description=info.description))
    return create_model(
        "PolicyOverrides",
        __base__=_Overrides,
        __module__=__name__,
        __doc__="Per-channel policy overrides: only the fields given replace alerts.policy.",
        **fields,
    )


PolicyOverrides = _make_policy_overrides()


def _check_override_nulls(value: BaseModel) -> BaseModel:
    for name in value.model_fields_set:
        nullable = type(None) in get_args(PolicySpec.model_fields[name].annotation)
        if getattr(value, name) is None and not nullable:
            raise ValueError(f"policy.{name} may not be null")
    return value


_PolicyOverridesField = Annotated[PolicyOverrides, AfterValidator(_check_override_nulls)]


class ChannelSpec(_RedactedRepr, BaseModel):
    """One alert destination. ``name`` defaults to ``type`` (give names to have several
    channels of one type). ``type``, the names and types of ``options`` and ``url`` are
    checked when ``et.init`` or ``et config validate`` runs, also for a channel that is
    disabled or off (``url_env`` unset); see docs/channels.md. ``repr()`` and ``str()`` hide
    ``url``, ``secret``, header values and secret-looking options (an SMTP ``password``)."""

    model_config = _FORBID
    __redacted_fields__ = {"options": redact_options}

    type: Annotated[str, Field(pattern=_IDENTIFIER.pattern)] = Field(
        description="lark, slack, dingtalk, wecom, webhook, email, callable, console, memory (tests), "
        "or a registered type"
    )
    name: Optional[_NonEmpty] = None
    url: Optional[SecretStr] = Field(None, description="webhook URL (redacted everywhere)")
    url_env: Optional[_NonEmpty] = Field(None, description="environment variable holding the URL")
    secret: Optional[SecretStr] = Field(None, description="signing secret (Lark, DingTalk)")
    enabled: bool = True
    min_level: Optional[Level] = None
    levels: Optional[list[Level]] = Field(None, description="exact allowlist of levels")
    tags: Optional[list[str]] = Field(None, description="route only alerts carrying one of these")
    options: dict[str, Any] = Field(default_factory=dict)
    policy: _PolicyOverridesField = Field(default_factory=PolicyOverrides)

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        if (
            isinstance(data, Mapping)
            and data.get("name") is None
            and isinstance(data.get("type"), str)
        ):
            return {**data, "name": data["type"]}
        return data


def effective_policy(alerts: AlertsSpec, channel: ChannelSpec) -> PolicySpec:
    """The policy a channel runs with: ``alerts.policy`` with the channel's overrides on top."""
    overrides = channel.policy.model_dump(exclude_unset=True)
    if not overrides:
        return alerts.policy
    return PolicySpec.model_validate({**alerts.policy.model_dump(), **overrides})


class RuleSpec(BaseModel):
    """An alert rule: the condition is alert-DSL text (parsed by ``expr_tracker.alerts``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: Optional[_NonEmpty] = None
    condition: _NonEmpty = Field(
        validation_alias=AliasChoices("condition", "expr"),
        description="DSL condition, e.g. zscore(loss[50]) > 4",
    )
    level: Level = "warning"
    title: Optional[str] = None
    message: Optional[str] = None
    mode: Literal["edge", "level"] = "edge"
    # strict: true/false is not a count (YAML reads yes/no/on/off as booleans)
    for_steps: int = Field(1, ge=1, strict=True)
    cooldown: Duration = Field(300.0, description="seconds between re-notifications in level mode")
    max_fires: Optional[Annotated[int, Field(ge=1, strict=True)]] = None
    notify_recovery: bool = False
    channels: Optional[list[str]] = None
    tags: list[str] = Field(default_factory=list)
    enabled: bool = True


def _is_unquoted_rule(value: Any) -> bool:
    """YAML reads an unquoted ``- loss > 1 => error: high`` as ``{"loss > 1 => error": "high"}``."""
    return (
        isinstance(value, Mapping)
        and len(value) == 1
        and isinstance(next(iter(value)), str)
        and "=>" in next(iter(value))
    )


def _rule_kind(value: Any) -> str:
    if isinstance(value, str):
        return "text"
    return "unquoted" if _is_unquoted_rule(value) else "rule"


def _reject_unquoted(value: Any) -> Any:
    key, message = next(iter(value.items()))
    text = f"{key}: {message}"
    raise ValueError(
        f'looks like the one-line rule {text!r} read by YAML as a mapping; quote it: - "{text}"'
    )


#: One entry of alerts.rules: a RuleSpec, or a one-line DSL string kept as written.
RuleEntry = Annotated[
    Union[
        Annotated[Annotated[str, Field(min_length=1)], Tag("text")],
        Annotated[RuleSpec, Tag("rule")],
        Annotated[SkipJsonSchema[Any], AfterValidator(_reject_unquoted), Tag("unquoted")],
    ],
    Discriminator(_rule_kind),
]


def _on_rank(value: Any) -> Any:
    ok = (
        value == "all"
        or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
        or (
            isinstance(value, (list, tuple))
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        )
    )
    if not ok:
        raise ValueError("must be a rank (an integer >= 0), a list of ranks, or 'all'")
    return list(value) if isinstance(value, tuple) else value


class AlertsSpec(BaseModel):
    """Alert rules, channels and the delivery policy."""

    model_config = _FORBID

    enabled: bool = True
    on_rank: Annotated[Union[int, list[int], Literal["all"]], BeforeValidator(_on_rank)] = Field(
        0,
        description="ranks that deliver alerts (a rank, a list of ranks, or 'all'); rules are "
        "evaluated and recorded on every rank",
    )
    # AlertEngine.start_watchdog needs > 0; below 0.1 s the watchdog thread only burns CPU
    # (time-based conditions such as `no_log_for(5m)` are read at a seconds scale)
    watchdog_interval: Annotated[Duration, AfterValidator(_watchdog_interval)] = Field(
        30.0, description="seconds between time-based checks"
    )
    policy: PolicySpec = Field(default_factory=PolicySpec)
    channels: Annotated[list[ChannelSpec], BeforeValidator(named_entries)] = Field(
        default_factory=list, description="a list, or a mapping name -> channel"
    )
    rules: Annotated[list[RuleEntry], BeforeValidator(named_entries)] = Field(
        default_factory=list, description="a list, or a mapping name -> rule"
    )
    guard_metric: _NonEmpty = Field(
        "loss",
        description="the metric the shipped Hydra rule sets (tracker/alerts=nan_guard, "
        "divergence) guard: their conditions read it, so tracker.alerts.guard_metric="
        "train/loss points them at the app's own metric name",
    )
    notify_on: list[Literal["finish", "failure"]] = Field(default_factory=list)

    @field_validator("channels")
    @classmethod
    def _unique_channel_names(cls, value: list[ChannelSpec]) -> list[ChannelSpec]:
        names = [c.name for c in value]
        dupes = sorted({n for n in names if names.count(n) > 1 if n})
        if dupes:
            raise ValueError(f"channel names must be unique; repeated: {', '.join(dupes)}")
        return value


# --- the run ------------------------------------------------------------------------------


class RunSpec(_RedactedRepr, BaseModel):
    """Everything a run does. ``name`` None gets a unique default from ``resolve()``.
    ``repr()`` and ``str()`` hide secrets (channel URLs and options, credentials in
    ``config`` and ``backends``)."""

    model_config = _FORBID
    __redacted_fields__ = {"config": redact_config, "backends": redact_options}

    project: Annotated[str, AfterValidator(_fs_name)] = "default"
    name: Optional[_FsName] = Field(
        None, description="run name; default: a timestamp and a random suffix"
    )
    dir: _PathStr = Field("./runs", description="runs live in <dir>/<project>/<name>/")
    run_dir: Optional[_PathStr] = Field(None, description="the run directory itself")
    group: Optional[str] = None
    tags: list[str] = Field(default_factory=list)
    notes: Optional[str] = None
    stream: Optional[Annotated[str, AfterValidator(_stream_name)]] = Field(
        None, description="producer name: letters, digits, '_' and '-'"
    )
    resume: Literal["allow", "never", "must"] = "allow"
    config: Annotated[dict[str, Any], BeforeValidator(_config_dict)] = Field(default_factory=dict)
    history: HistorySpec = Field(default_factory=HistorySpec)
    spans: SpansSpec = Field(default_factory=SpansSpec)
    alerts: AlertsSpec = Field(default_factory=AlertsSpec)
    backends: list[Union[str, dict[str, Any]]] = Field(default_factory=list)
