"""Resolve: every source merged (``sources``), validated once, with provenance.

Precedence (docs/configuration.md "Configuration reference"), later wins::

    defaults < webhook environment variables (one channel each) < ET_ALERT_CONFIG file (its
    alerts) < ET_CONFIG file < configure_alert() values < init(spec=...) < init keywords

``resolve()`` returns a ``ResolvedSpec``: the frozen ``RunSpec``, the source of every leaf
value (``sources``), YAML ``(file, line, column)`` per path where known (``locations``) and
``redacted()``, the JSON-able form saved as ``spec.json``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from expr_tracker.spec.errors import (
    SpecError,
    SpecIssue,
    is_secret_key,
    issues_from_validation_error,
    join_path,
    redact_config,
)
from expr_tracker.spec.merge import Layer, Location, item_key, leaves, lookup, merge_layers, nearest
from expr_tracker.spec.names import default_run_name
from expr_tracker.spec.plain import is_model, is_secret
from expr_tracker.spec.sources import (
    ALERT_CONFIG_ENV,
    CONFIG_ENV,
    alert_config_layer,
    config_file_layer,
    configure_alert_layer,
    env_layers,
    kwargs_to_dict,
    load_file,
    source_file_layer,
    spec_layer,
)

if TYPE_CHECKING:
    from expr_tracker.spec.models import RunSpec

__all__ = [
    "ResolvedSpec",
    "detect_kind",
    "file_section",
    "interpolation_issues",
    "resolve",
    "resolve_file",
    "spec_path_of",
    "validate_file",
]


def _jsonable(value: Any, free_form: bool, depth: int = 0) -> Any:
    if is_secret(value):
        return "***"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if is_model(value):
        value = value.model_dump()
    if isinstance(value, Mapping) and depth < 64:
        return {
            str(k): _redact_all(v)
            if free_form and str(k).lower() == "headers" and isinstance(v, Mapping)
            else "***"
            if free_form and is_secret_key(k) and v is not None
            else _jsonable(v, free_form, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)) and depth < 64:
        return [_jsonable(v, free_form, depth + 1) for v in value]
    return repr(value)


def _redact_all(headers: Mapping) -> dict[str, Any]:
    """HTTP headers: every value hidden (Authorization, X-Api-Key, cookies ... carry secrets
    under any name)."""
    return {str(k): "***" if v is not None else None for k, v in headers.items()}


@dataclass(frozen=True)
class ResolvedSpec:
    """The validated spec and where each value came from.

    Attributes:
        spec: the frozen ``RunSpec`` (``name`` filled by
            :func:`~expr_tracker.spec.names.default_run_name` when no source gave one: a
            ``YYYYmmdd-HHMMSS-xxxxxx`` timestamp and random suffix, shared by the ranks of
            one ``torchrun`` launch).
        sources: dotted leaf path -> provenance string, for every leaf of ``spec``
            (``"default"`` where no source gave the value).
        locations: dotted path -> ``(file, line, column)`` for values read from YAML.
    """

    spec: RunSpec
    sources: dict[str, str]
    locations: dict[str, Location] = field(default_factory=dict)

    def source_of(self, path: str) -> str:
        """Provenance of ``path`` (a leaf, or the nearest enclosing value that has one)."""
        found = lookup(self.sources, path)
        return found if found is not None else "default"

    def redacted(self) -> dict[str, Any]:
        """The spec as a JSON-able dict: secrets (``SecretStr`` fields, and keys matching
        password|token|secret|webhook|url|api_key inside ``options`` and ``backends``) are
        ``"***"``; ``config`` is redacted as ``config.json`` is (``redact_config``: credential
        keys, headers, ``user:password@`` of URLs, webhook URLs); callables and plugin
        objects are their ``repr``."""
        dumped = self.spec.model_dump()
        out = {}
        for key, value in dumped.items():
            if key == "config":  # as config.json: credentials hidden, hyper-parameters kept
                out[key] = _jsonable(redact_config(value), free_form=False)
            else:
                out[key] = _jsonable(value, free_form=key in ("backends", "backend_kwargs"))
        for section in ("spans", "alerts"):
            out[section] = _redact_options(dumped[section], section)
        return out

    def rows(self) -> list[tuple[str, Any, str, Location | None]]:
        """``(path, redacted value, source, location)`` for every leaf, for ``et config show``."""
        redacted = self.redacted()
        rows = []
        for path, value in leaves("", redacted):
            rows.append((path, value, self.source_of(path), nearest(self.locations, path)))
        return rows


def _redact_options(value: Any, path: str) -> Any:
    """JSON-able section with free-form ``options`` mappings redacted by key."""
    if isinstance(value, Mapping):
        out = {}
        for key, child in value.items():
            child_path = f"{path}.{key}"
            if key == "options" and isinstance(child, Mapping):
                out[key] = _jsonable(child, free_form=True)
            else:
                out[key] = _redact_options(child, child_path)
        return out
    if isinstance(value, (list, tuple)):
        return [_redact_options(v, path) for v in value]
    return _jsonable(value, free_form=False)


def _validate(
    merged: dict,
    sources: Mapping[str, str],
    locations: Mapping[str, Location],
    layers: Sequence[Layer],
) -> tuple[RunSpec | None, list[SpecIssue]]:
    from pydantic import ValidationError

    from expr_tracker.spec.models import RunSpec

    by_source = {layer.source: layer for layer in layers}

    def source_of(path: str) -> str | None:
        return lookup(sources, path)

    def location_of(path: str) -> Location | None:
        found = lookup(locations, path)
        source = source_of(path)
        if found is not None and source and not source.endswith(":" + found[0]):
            return None  # an enclosing value's place in a file this value did not come from
        return found

    try:
        return RunSpec.model_validate(merged), []
    except ValidationError as exc:
        issues = issues_from_validation_error(
            exc,
            merged,
            root=RunSpec,
            item_key=item_key,
            source_of=source_of,
            location_of=location_of,
        )
    out = []
    for issue in issues:
        layer = by_source.get(issue.source or "")
        if layer is not None and layer.config_key:
            issue = _with(issue, config_key=f"{layer.config_key}.{issue.path}")
        out.append(issue)
    return None, out


def check_stream(stream: Any, source: str = "history") -> None:
    """Raise the ``SpecError`` ``et.init`` gives for ``stream`` (the ``stream`` field's own
    validation), with ``source`` as where the value came from: a reader asked for a stream
    that no run can have (``et.history(stream=...)``) says why instead of failing on its
    file name. None and valid names pass."""
    from pydantic import ValidationError

    from expr_tracker.spec.models import RunSpec

    global _STREAM_FIELD
    if _STREAM_FIELD is None:
        from pydantic import TypeAdapter

        _STREAM_FIELD = TypeAdapter(RunSpec.model_fields["stream"].annotation)
    try:
        _STREAM_FIELD.validate_python(stream)
    except ValidationError as exc:
        issues = issues_from_validation_error(
            exc, stream, path_prefix="stream", source_of=lambda _path: source
        )
        raise SpecError(issues) from None


_STREAM_FIELD: Any = None


def _with(issue: SpecIssue, **changes: Any) -> SpecIssue:
    return replace(issue, **changes)


def resolve(
    spec: Any = None,
    *,
    kwargs: Mapping[str, Any] | None = None,
    configure_alert: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    quick: bool = False,
) -> ResolvedSpec:
    """Build the run's spec from every source, validate it once, and keep provenance.

    Args:
        spec: ``et.init(spec=...)``: a YAML/JSON/TOML path, a dict, an OmegaConf DictConfig
            (interpolations resolved) or a RunSpec; None for none.
        kwargs: the keyword arguments the caller gave ``et.init`` (flat names per ``KEYWORDS``).
        configure_alert: the values given to ``et.configure_alert()`` (the alerts section).
        environ: environment variables (default ``os.environ``): webhook URLs,
            ``ET_ALERT_CONFIG`` and ``ET_CONFIG``.
        quick: ``et.init``'s start: a spec that :func:`~expr_tracker.spec.quick.quick_check`
            vouches for is not validated by Pydantic, and ``spec`` is a
            :class:`~expr_tracker.spec.quick.SpecView` of it (docs/architecture.md "Cold
            start"); any other spec, a bad one included, is validated as without.

    Returns:
        ResolvedSpec.

    Raises:
        SpecError: listing every problem of every source at once, each with its path, the
            value, what is valid, its source, and ``file:line:column`` for YAML.
    """
    environ = os.environ if environ is None else environ
    issues: list[SpecIssue] = []
    layers: list[Layer] = [Layer("default", {})]
    layers += env_layers(environ)

    def add(make, *args: Any) -> None:
        try:
            layer = make(*args)
        except SpecError as exc:
            issues.extend(exc.issues)
            return
        if layer is not None:
            layers.append(layer)

    alert_file = environ.get(ALERT_CONFIG_ENV)
    if alert_file:
        add(alert_config_layer, alert_file)
    config_file = environ.get(CONFIG_ENV)
    if config_file:
        add(config_file_layer, config_file)
    if configure_alert:
        add(configure_alert_layer, configure_alert)
    add(spec_layer, spec)
    if kwargs:
        add(lambda kw: Layer("init", kwargs_to_dict(kw)), kwargs)

    merged, sources, locations = merge_layers(layers)
    model: Any = None
    if quick and not issues:
        from expr_tracker.spec.quick import SpecView, quick_check

        data = quick_check(merged)
        if data is not None:
            model = SpecView(data, merged)
    if model is None:
        model, problems = _validate(merged, sources, locations, layers)
        issues.extend(problems)
    if issues or model is None:
        raise SpecError(issues)
    if model.name is None:
        model = model.model_copy(update={"name": default_run_name(environ)})
    final = {
        path: sources.get(path) or nearest(sources, path) or "default"
        for path, _ in leaves("", model.model_dump())
    }
    return ResolvedSpec(model, final, dict(locations))


def validate_file(
    path: str | os.PathLike, kind: str = "run", package: str | None = None
) -> list[SpecIssue]:
    """Check one spec file on its own, for ``et config validate`` and ``et rules check``.

    Args:
        path: a YAML/JSON/TOML file.
        kind: ``"run"`` (a whole RunSpec) or ``"alerts"`` (the alerts section, or a mapping
            with an ``alerts`` key).
        package: a dotted section of the file holding the spec (``"tracker"``), as
            ``load_file``.

    Returns:
        Every problem (empty when valid); YAML problems carry ``location`` (file, line, col).

    Raises:
        ValueError: ``kind`` is neither ``"run"`` nor ``"alerts"``.
    """
    try:
        resolve_file(path, kind, package)
    except SpecError as exc:
        return exc.issues
    return []


def resolve_file(
    path: str | os.PathLike, kind: str = "run", package: str | None = None
) -> ResolvedSpec:
    """One spec file on its own (no environment, no other source) as a ``ResolvedSpec``,
    for ``et config validate`` to run the checks ``et.init`` runs (``assemble.check``).

    Args:
        path: a YAML/JSON/TOML file.
        kind: ``"run"`` (a whole RunSpec) or ``"alerts"`` (the alerts section, or a mapping
            with an ``alerts`` key).
        package: a dotted section of the file holding the spec (``"tracker"``), as
            ``load_file``.

    Raises:
        SpecError: every problem (YAML problems carry ``location``).
        ValueError: ``kind`` is neither ``"run"`` nor ``"alerts"``.
    """
    if kind not in ("run", "alerts"):
        raise ValueError(f"kind must be 'run' or 'alerts', not {kind!r}")
    file = os.fspath(path)
    layer = source_file_layer(file, f"file:{file}", kind, package)
    merged, sources, locations = merge_layers([layer])
    model, issues = _validate(merged, sources, locations, [layer])
    if issues or model is None:
        raise SpecError(issues)
    final = {
        p: sources.get(p) or nearest(sources, p) or "default"
        for p, _ in leaves("", model.model_dump())
    }
    return ResolvedSpec(model, final, dict(locations))


# ------------------------------------------------------------------ one file (et config validate)


def detect_kind(path: str | Path, package: str | None = None) -> str:
    """``"alerts"`` when the file's top-level keys (of its ``package`` section, when given)
    are all alerts-section keys (``rules``, ``channels``, ``policy`` ...) and not run-spec
    keys, else ``"run"`` (also when the file cannot be read: validation then reports why)."""
    try:
        data, _ = load_file(path, package=package)
    except SpecError:
        return "run"
    from expr_tracker.spec.models import AlertsSpec, RunSpec

    keys = set(data)
    if keys and keys <= set(AlertsSpec.model_fields) and not keys <= set(RunSpec.model_fields):
        return "alerts"
    return "run"


def interpolation_issues(file: str, kind: str, package: str | None = None) -> tuple[list, set[str]]:
    """A ``SpecIssue`` (at the value's spec path and ``file:line:column``) for every value of
    ``file`` holding an OmegaConf interpolation ``${...}``, which only Hydra's composition
    resolves; and the spec paths left unchecked for it: the value, or for a rule the whole
    rule (``alerts.rules.NAME``), whose problems are artifacts of the literal ``${...}``."""
    from expr_tracker.spec.yaml import interpolated_leaves, interpolation_note

    doc, data, prefix = file_section(file, package)
    if data is None:
        return [], set()
    wrapped = not (kind == "run" or isinstance(data.get("alerts"), dict))
    spec_data = {"alerts": data} if wrapped else data
    notes, unchecked = [], set()
    for parts, text in interpolated_leaves(spec_data):
        path = spec_path_of(parts, spec_data)
        root = parts[:3] if parts[:2] == ("alerts", "rules") and len(parts) > 2 else parts
        unchecked.add(spec_path_of(root, spec_data))
        location = None
        if doc is not None:
            line, column = doc.where((*prefix, *(parts[1:] if wrapped else parts)))
            location = (file, line, column)
        notes.append(SpecIssue(path, interpolation_note(text), location=location))
    return notes, unchecked


def file_section(file: str, package: str | None) -> tuple[Any, dict | None, tuple]:
    """``(located document or None for TOML, the spec's mapping in it, its key path)`` for
    ``file`` and its dotted ``package``; the mapping is None when the file cannot be read
    or the section is not a mapping (the spec validation says why)."""
    from expr_tracker.spec.yaml import LocatedYaml

    doc = None
    try:
        if Path(file).suffix.lower() == ".toml":
            data, _ = load_file(file)
        else:
            doc = LocatedYaml(Path(file).read_text(encoding="utf-8"))
            data = doc.data
    except Exception:  # noqa: BLE001 - reported by the spec validation
        return None, None, ()
    prefix = tuple(package.split(".")) if package else ()
    for key in prefix:
        data = data.get(key) if isinstance(data, dict) else None
    return doc, data if isinstance(data, dict) else None, prefix


def spec_path_of(parts: tuple, data: Any) -> str:
    """The spec path of document keys ``parts``: list items of named lists by entry name."""
    path, node = "", data
    for part in parts:
        if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            key, node = item_key(path, node[part], part), node[part]
        else:
            key, node = part, node.get(part) if isinstance(node, dict) else None
        path = join_path(path, key)
    return path
