"""The run spec's ``alerts`` section: ``AlertsSpec``, ``PolicySpec``, ``ChannelSpec`` (with
per-channel ``PolicyOverrides``), ``RuleSpec`` and ``effective_policy``.

Public at the top level as ``et.AlertConfig`` (``AlertsSpec``), ``et.ChannelConfig``
(``ChannelSpec``) and ``et.WebhookPolicy`` (``PolicySpec``): built in Python and handed to
``et.configure_alert(cfg)`` / ``et.configure_alert(**cfg)`` / ``et.init(alert=cfg)``, where
:func:`~expr_tracker.spec.plain.alerts_data` turns them back into the values that were set on them.
"""

from __future__ import annotations

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
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from expr_tracker.spec.fields import FORBID, Level, NonEmpty, RedactedRepr
from expr_tracker.spec.plain import IDENTIFIER, named_entries
from expr_tracker.spec.redact import redact_options
from expr_tracker.spec.units import Duration

# --- alerts -------------------------------------------------------------------------------


#: smallest ``alerts.watchdog_interval``, seconds (10 ms: a test or a short job may want
#: time-based rules checked often; below it the thread only burns CPU)
WATCHDOG_MIN_INTERVAL = 0.01


def _watchdog_interval(value: float) -> float:
    if not value >= WATCHDOG_MIN_INTERVAL:
        raise ValueError(
            f"must be at least {WATCHDOG_MIN_INTERVAL:g} s (10ms), e.g. 1s or 30s: the watchdog "
            "wakes up this often to check time-based rules (no_data, age, elapsed), and a "
            "shorter interval only burns CPU"
        )
    return value


class PolicySpec(BaseModel):
    """Delivery policy of a channel: timeouts, retries and backoff, rate limit, dedup and
    queue. Set under ``alerts.policy`` for every channel, or per channel under its ``policy``
    (which wins field by field)."""

    model_config = FORBID

    async_send: bool = Field(
        True,
        description="false: et.alert() and rule alerts wait until this channel sent the "
        "message (rule alerts on the committing thread, before et.log returns)",
    )
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

    model_config = FORBID

    @model_serializer(mode="wrap")
    def _only_given(self, handler: Any) -> dict[str, Any]:
        full = handler(self)
        return {k: v for k, v in full.items() if k in self.model_fields_set}


def _make_policy_overrides() -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for name, info in PolicySpec.model_fields.items():
        args = (info.annotation, *info.metadata)  # Annotated[args]: Annotated[type, *metadata]
        inner = Annotated[args] if info.metadata else info.annotation
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


def _policy_as_overrides(value: Any) -> Any:
    """A ``PolicySpec`` given as a channel's ``policy``: the fields set on it override."""
    if isinstance(value, PolicySpec):
        return value.model_dump(exclude_unset=True)
    return value


class ChannelSpec(RedactedRepr, BaseModel):
    """One alert destination. ``name`` defaults to ``type`` (give names to have several
    channels of one type). ``type``, the names and types of ``options`` and ``url`` are
    checked when ``et.init`` or ``et config validate`` runs, also for a channel that is
    disabled or off (``url_env`` unset); see docs/channels.md. ``repr()`` and ``str()`` hide
    ``url``, ``secret``, header values and secret-looking options (an SMTP ``password``)."""

    model_config = FORBID
    __redacted_fields__ = {"options": redact_options}

    type: Annotated[str, Field(pattern=IDENTIFIER.pattern)] = Field(
        description="lark, slack, dingtalk, wecom, webhook, email, callable, console, memory (tests), "
        "or a registered type"
    )
    name: Optional[NonEmpty] = None
    url: Optional[SecretStr] = Field(None, description="webhook URL (redacted everywhere)")
    url_env: Optional[NonEmpty] = Field(None, description="environment variable holding the URL")
    secret: Optional[SecretStr] = Field(None, description="signing secret (Lark, DingTalk)")
    enabled: bool = True
    min_level: Optional[Level] = None
    levels: Optional[list[Level]] = Field(None, description="exact allowlist of levels")
    tags: Optional[list[str]] = Field(None, description="route only alerts carrying one of these")
    options: dict[str, Any] = Field(default_factory=dict)
    policy: Annotated[_PolicyOverridesField, BeforeValidator(_policy_as_overrides)] = Field(
        default_factory=PolicyOverrides
    )

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

    name: Optional[NonEmpty] = None
    condition: NonEmpty = Field(
        validation_alias=AliasChoices("condition", "expr"),
        description="DSL condition, e.g. zscore(loss[50]) > 4",
    )
    level: Optional[Level] = Field(
        None, description="the level it is delivered at; default warning, error with an action"
    )
    action: Optional[Literal["stop", "prune"]] = Field(
        None,
        description="taken when the rule fires: stop (et.should_stop() turns true, "
        "integrations stop their trainer) or prune (the Optuna trial is pruned); "
        "docs/alerts.md Actions",
    )
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
    stream: Optional[Literal["system"]] = Field(
        None,
        description="the rows the rule reads: null, the run's own (et.log); system, the "
        "system sampler's (gpu0/memory_used_pct, disk/used_pct ...; docs/system.md)",
    )


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


def rule_entry_data(rule: Any) -> Any:
    """A rule object as a ``rules`` entry (the spec stays plain data; duck-typed, as the
    spec imports nothing from ``alerts``): an ``M`` expression becomes its DSL text, an
    ``AlertRule`` (``et.AlertRule``) its field mapping. Anything else is returned as it is."""
    if hasattr(rule, "to_source") and hasattr(rule, "node"):  # an M expression
        return rule.to_source()
    if hasattr(rule, "to_dict") and hasattr(rule, "for_steps"):  # an AlertRule
        data = rule.to_dict()
        if not data.get("condition") and hasattr(rule.condition, "to_source"):
            data["condition"] = rule.condition.to_source()
        return data
    return rule


def _rule_entries(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [rule_entry_data(v) for v in value]
    return value


def check_on_rank(value: Any) -> Any:
    """``on_rank``/``backend_on_rank``: a rank, a list of ranks, ``"all"``; None (YAML
    ``null``) means every rank, as ``"all"`` does, and becomes ``"all"``."""
    if value is None:
        return "all"
    ok = (
        value == "all"
        or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
        or (
            isinstance(value, (list, tuple))
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        )
    )
    if not ok:
        raise ValueError("must be a rank (an integer >= 0), a list of ranks, or 'all' (null: all)")
    return list(value) if isinstance(value, tuple) else value


class AlertsSpec(BaseModel):
    """Alert rules, channels and the delivery policy."""

    model_config = FORBID

    enabled: bool = True
    on_rank: Annotated[
        Union[int, list[int], Literal["all"], None], BeforeValidator(check_on_rank)
    ] = Field(
        0,
        description="ranks that deliver alerts (a rank, a list of ranks, or 'all'; null is "
        "'all'); rules are evaluated and recorded on every rank",
    )
    # AlertEngine.start_watchdog needs > 0; below 10 ms the watchdog thread only burns CPU
    watchdog_interval: Annotated[Duration, AfterValidator(_watchdog_interval)] = Field(
        30.0,
        description="seconds between time-based checks (no_data, age, elapsed); at least "
        "10ms (0.01)",
    )
    policy: PolicySpec = Field(default_factory=PolicySpec)
    channels: Annotated[list[ChannelSpec], BeforeValidator(named_entries)] = Field(
        default_factory=list, description="a list, or a mapping name -> channel"
    )
    rules: Annotated[
        list[RuleEntry], BeforeValidator(_rule_entries), BeforeValidator(named_entries)
    ] = Field(default_factory=list, description="a list, or a mapping name -> rule")
    guard_metric: NonEmpty = Field(
        "loss",
        description="the metric the shipped Hydra rule sets (tracker/alerts=nan_guard, "
        "divergence) guard: their conditions read it, so tracker.alerts.guard_metric="
        "train/loss points them at the app's own metric name",
    )
    notify_on: list[Literal["finish", "failure"]] = Field(default_factory=list)

    def keys(self) -> list[str]:
        """The fields set on this object (so ``et.configure_alert(**cfg)`` and ``dict(cfg)``
        pass on what was given, not the defaults)."""
        return [name for name in type(self).model_fields if name in self.model_fields_set]

    def __getitem__(self, key: str) -> Any:
        if key not in type(self).model_fields:
            raise KeyError(key)
        return getattr(self, key)

    @field_validator("channels")
    @classmethod
    def _unique_channel_names(cls, value: list[ChannelSpec]) -> list[ChannelSpec]:
        names = [c.name for c in value]
        dupes = sorted({n for n in names if names.count(n) > 1 if n})
        if dupes:
            raise ValueError(f"channel names must be unique; repeated: {', '.join(dupes)}")
        return value
