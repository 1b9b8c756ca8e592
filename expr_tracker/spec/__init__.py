"""The run spec: Pydantic models, units, sources, merge and provenance.

``resolve()`` builds a validated, frozen ``RunSpec`` from every source (defaults, webhook
environment variables, ``ET_ALERT_CONFIG``, ``ET_CONFIG``, ``configure_alert()``,
``init(spec=...)``, ``init`` keywords) and remembers where each value came from. A bad spec
raises ``SpecError`` listing every problem. This package imports nothing from the runtime.

Sources, merging, resolving and errors need no Pydantic; the models (and the unit types,
PyYAML's ``load_yaml``) load on first use (PEP 562), so that a plain spec starts a run
without them (docs/architecture.md "Cold start").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# bound here, not on first use: `merge` and `resolve` are also submodule names, which the
# import of those submodules would otherwise leave on the package
from expr_tracker.spec.errors import SpecError, SpecIssue
from expr_tracker.spec.merge import Layer, merge, merge_layers
from expr_tracker.spec.resolve import ResolvedSpec, resolve, validate_file
from expr_tracker.spec.sources import KEYWORDS, kwargs_to_dict, load_file

if TYPE_CHECKING:
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
    from expr_tracker.spec.units import (
        Duration,
        OptionalDuration,
        Size,
        parse_duration,
        parse_size,
    )
    from expr_tracker.spec.yaml import load_yaml

_HOMES = {
    "models": (
        "LEVELS",
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
        "level_rank",
        "normalize_level",
    ),
    "units": ("Duration", "OptionalDuration", "Size", "parse_duration", "parse_size"),
    "yaml": ("load_yaml",),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

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


def __getattr__(name: str) -> Any:  # PEP 562
    """Each name from its module on first use: Pydantic (the models) and PyYAML
    (``load_yaml``) stay out of a run that does not need them."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"expr_tracker.spec.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
