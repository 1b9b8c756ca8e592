"""The run spec's recording sections: ``HistorySpec`` (with ``BufferSpec``, ``CacheSpec``) and
``SpansSpec`` (with ``PluginSpec`` and the ``print`` setting)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    WithJsonSchema,
)
from pydantic.json_schema import SkipJsonSchema

from expr_tracker.spec.fields import (
    FORBID,
    NonEmpty,
    RedactedRepr,
)
from expr_tracker.spec.redact import redact_options
from expr_tracker.spec.units import Duration, OptionalDuration, Size

# --- history ------------------------------------------------------------------------------


class BufferSpec(BaseModel):
    """Write buffering of one JSONL file: flush after ``size`` records, every ``interval``
    seconds, and never hold a record longer than ``max_seconds`` (None: no bound)."""

    model_config = FORBID

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

    model_config = FORBID

    bytes: Size = Field(1 << 30, description="bytes of encoded rows kept in memory")
    rows: int = Field(2_000_000, ge=0, description="rows kept in memory")


class HistorySpec(BaseModel):
    """The metric history: commit rules, caching and buffering."""

    model_config = FORBID

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
    query_cache: bool = Field(
        True,
        description="the run extends the query cache of each file it writes past 8 MiB, "
        "so the first et query reads none of it (docs/query.md)",
    )


# --- spans --------------------------------------------------------------------------------


class PluginSpec(RedactedRepr, BaseModel):
    """A span plugin named by its registered ``type`` (``cpu_time``, ``torch_memory``, ...).
    ``options`` are checked by name and type when ``et.init`` or ``et config validate``
    runs: ``gpu_stats`` takes ``index`` (an integer >= 0) and ``interval`` (seconds > 0),
    ``torch_memory`` takes ``device`` (null, an index, ``cuda`` or ``cuda:N``), ``cpu_time``
    none."""

    model_config = FORBID
    __redacted_fields__ = {"options": redact_options}

    type: NonEmpty
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
