"""The run spec: Pydantic models, units, sources, merge and provenance.

``resolve()`` builds a validated, frozen ``RunSpec`` from every source (defaults, webhook
environment variables, ``ET_ALERT_CONFIG``, ``ET_CONFIG``, ``configure_alert()``,
``init(spec=...)``, ``init`` keywords) and remembers where each value came from. A bad spec
raises ``SpecError`` listing every problem. This package imports nothing from the runtime.
"""

from expr_tracker.spec.errors import SpecError, SpecIssue
from expr_tracker.spec.merge import Layer, merge, merge_layers
from expr_tracker.spec.models import (
    LEVELS,
    AlertsSpec,
    BufferSpec,
    CacheSpec,
    ChannelSpec,
    HistorySpec,
    Level,
    PluginSpec,
    PolicyOverrides,
    PolicySpec,
    RuleSpec,
    RunSpec,
    SpansSpec,
    effective_policy,
    level_rank,
    normalize_level,
)
from expr_tracker.spec.resolve import ResolvedSpec, resolve, validate_file
from expr_tracker.spec.sources import KEYWORDS, kwargs_to_dict, load_file
from expr_tracker.spec.units import Duration, OptionalDuration, Size, parse_duration, parse_size

__all__ = [
    "KEYWORDS",
    "LEVELS",
    "AlertsSpec",
    "BufferSpec",
    "CacheSpec",
    "ChannelSpec",
    "Duration",
    "HistorySpec",
    "Layer",
    "Level",
    "OptionalDuration",
    "PluginSpec",
    "PolicyOverrides",
    "PolicySpec",
    "ResolvedSpec",
    "RuleSpec",
    "RunSpec",
    "Size",
    "SpansSpec",
    "SpecError",
    "SpecIssue",
    "effective_policy",
    "kwargs_to_dict",
    "level_rank",
    "load_file",
    "load_yaml",
    "merge",
    "merge_layers",
    "normalize_level",
    "parse_duration",
    "parse_size",
    "resolve",
    "validate_file",
]


def __getattr__(name: str) -> object:  # PEP 562
    """``load_yaml`` on first use: PyYAML stays out of a run started without a spec file."""
    if name == "load_yaml":
        from expr_tracker.spec.yaml import load_yaml

        return load_yaml
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
