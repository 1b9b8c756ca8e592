"""The sources of a run spec, each as a ``Layer``: defaults, webhook environment variables,
``ET_ALERT_CONFIG``, ``ET_CONFIG``, ``configure_alert()`` values, ``init(spec=...)`` (a file,
dict, DictConfig or RunSpec) and ``init`` keywords; ``load_file()`` reads YAML/JSON/TOML.

Provenance strings: ``"default"``, ``"env:ET_SLACK_WEBHOOK_URL"``, ``"ET_ALERT_CONFIG:<path>"``,
``"ET_CONFIG:<path>"``, ``"configure_alert"``, ``"file:<path>"`` (spec given as a path),
``"spec"`` (a dict or DictConfig given), ``"init"`` (keyword arguments).

``config_without_spec()`` keeps the spec given out of the run's config (``et.init(spec=
cfg.tracker, config=cfg)``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from expr_tracker.spec.errors import SpecError, SpecIssue, suggest
from expr_tracker.spec.merge import Layer, Location, copy_plain, merge, nest_path
from expr_tracker.spec.plain import (
    SKIP,
    alerts_data,
    is_model,
    is_omegaconf,
    keep_literal,
    omegaconf_to_plain,
)

__all__ = [
    "ALERT_CONFIG_ENV",
    "APP_PACKAGE",
    "CONFIG_ENV",
    "KEYWORDS",
    "RUN_FIELDS",
    "WEBHOOK_ENV",
    "alert_config_layer",
    "app_package",
    "config_file_layer",
    "config_without_spec",
    "configure_alert_layer",
    "env_layers",
    "file_layer",
    "kwargs_to_dict",
    "load_file",
    "spec_layer",
]

#: Environment variable naming a whole-RunSpec file.
CONFIG_ENV = "ET_CONFIG"
#: Environment variable naming a file holding the ``alerts`` section.
ALERT_CONFIG_ENV = "ET_ALERT_CONFIG"
#: Webhook environment variables -> channel type, in precedence order (later wins).
WEBHOOK_ENV: tuple[tuple[str, str], ...] = (
    ("WEBHOOK_URL", "lark"),  # legacy name
    ("ET_LARK_WEBHOOK_URL", "lark"),
    ("ET_SLACK_WEBHOOK_URL", "slack"),
    ("ET_DINGTALK_WEBHOOK_URL", "dingtalk"),
    ("ET_WECOM_WEBHOOK_URL", "wecom"),
    ("ET_WEBHOOK_URL", "webhook"),
)

#: The fields of ``RunSpec``, in its order (known here without building the model: a test
#: keeps the two equal).
RUN_FIELDS: tuple[str, ...] = (
    "project",
    "name",
    "dir",
    "run_dir",
    "group",
    "tags",
    "notes",
    "entity",
    "job_type",
    "mode",
    "stream",
    "resume",
    "config",
    "history",
    "spans",
    "alerts",
    "artifacts",
    "system",
    "sync",
    "backends",
    "backend_kwargs",
    "backend_on_rank",
    "backend_queue_size",
    "backend_finish_timeout",
)

#: Flat keyword arguments of ``et.init`` -> dotted spec paths. The top-level RunSpec field
#: names (project, name, dir, ..., history, spans, alerts) are accepted as themselves.
KEYWORDS: dict[str, str] = {
    "cache_bytes": "history.cache.bytes",
    "cache_rows": "history.cache.rows",
    "max_open_seconds": "history.max_open_seconds",
    "step_policy": "history.step_policy",
    "rank_aware": "history.rank_aware",
    "buffer_size": "history.buffer.size",
    "buffer_interval": "history.buffer.interval",
    "max_buffer_seconds": "history.buffer.max_seconds",
    "max_pending_records": "history.buffer.max_pending_records",
    "alert_window": "history.alert_window",
    "spans": "spans.enabled",  # a mapping given as spans= is the whole section
    "span_metrics": "spans.metrics",
    "span_count": "spans.count",
    "span_print_fn": "spans.print",
    "span_async_write": "spans.async_write",
    "span_plugins": "spans.plugins",
    "span_buffer_size": "spans.buffer.size",
    "span_buffer_interval": "spans.buffer.interval",
    "span_max_buffer_seconds": "spans.buffer.max_seconds",
    "max_record_bytes": "spans.max_record_bytes",
    "max_pending_bytes": "spans.max_pending_bytes",
    "alert": "alerts",  # a mapping merged deeply; True/False sets alerts.enabled
    "alert_rules": "alerts.rules",
    "alert_on_rank": "alerts.on_rank",
    "watchdog_interval": "alerts.watchdog_interval",
    "notify_on": "alerts.notify_on",
    "system": "system.enabled",  # a mapping given as system= is the whole section
    "system_interval": "system.interval",
    "system_gpu": "system.gpu",
    "sync": "sync.url",  # a mapping given as sync= is the whole section
    "sync_interval": "sync.interval",
}


def _load_toml(path: Path) -> Any:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef, unused-ignore]
        except ModuleNotFoundError:
            raise SpecError(
                [
                    SpecIssue(
                        "",
                        "reading TOML on Python 3.10 needs the `tomli` package "
                        "(pip install tomli), or use a .yaml or .json file",
                        source=f"file:{path}",
                    )
                ]
            ) from None
    with open(path, "rb") as f:
        return tomllib.load(f)


def load_file(
    path: str | os.PathLike,
    *,
    source: str | None = None,
    root: str = "",
    package: str | None = None,
) -> tuple[dict[str, Any], dict[str, Location]]:
    """Read a spec file: ``.yaml``/``.yml`` (safe loader), ``.json`` or ``.toml``.

    Args:
        path: the file; another suffix is read as YAML (which also reads JSON).
        source: provenance string put on errors (default ``"file:<path>"``).
        root: the dotted path the file's top level sits at, for ``locations``.
        package: a dotted section of the file to read instead of its top level (a Hydra
            app's config: ``"tracker"``); locations stay those of the file.

    Returns:
        ``(data, locations)``: the top-level mapping (``{}`` for an empty file) and, for
        YAML, dotted path (under ``root``) -> ``(file, line, column)``.

    Raises:
        SpecError: the file is missing or unreadable, does not parse (with its line and
            column), or its top level is not a mapping.
    """
    # PyYAML and the located loader: imported by the runs that read a file (cold start)
    import yaml

    from expr_tracker.spec.yaml import (
        compose_unique,
        duplicate_key_message,
        key_path,
        package_section,
        yaml_error,
        yaml_locations,
    )

    p = Path(path)
    file = str(path)
    source = source or f"file:{file}"
    locations: dict[str, Location] = {}
    duplicates: list[tuple[Any, yaml.Mark, yaml.Mark]] = []
    node = data = text = None
    suffix = p.suffix.lower()
    try:
        if suffix == ".json":
            text = p.read_text(encoding="utf-8")
            data = json.loads(text)
            try:  # JSON is (nearly always) YAML: its node marks give line and column
                node, _, duplicates = compose_unique(text)
                node, data = package_section(node, data, package, file, source)
                yaml_locations(node, data, root, file, locations)
            except yaml.YAMLError:
                locations.clear()
        elif suffix == ".toml":
            _, data = package_section(None, _load_toml(p), package, file, source)
        else:
            text = p.read_text(encoding="utf-8")
            node, data, duplicates = compose_unique(text)
            node, data = package_section(node, data, package, file, source)
            yaml_locations(node, data, root, file, locations)
    except SpecError:
        raise
    except FileNotFoundError:
        raise SpecError([SpecIssue(root, f"file not found: {file}", source=source)]) from None
    except OSError as exc:
        msg = f"cannot read {file}: {exc.strerror or exc}"
        raise SpecError([SpecIssue(root, msg, source=source)]) from None
    except yaml.YAMLError as exc:
        problem, at = yaml_error(exc, text)
        where = (file, *at) if at is not None else None
        raise SpecError(
            [SpecIssue(root, f"invalid YAML: {problem}", source=source, location=where)]
        ) from None
    except json.JSONDecodeError as exc:
        raise SpecError(
            [
                SpecIssue(
                    root,
                    f"invalid JSON: {exc.msg}",
                    source=source,
                    location=(file, exc.lineno, exc.colno),
                )
            ]
        ) from None
    except ValueError as exc:  # tomllib.TOMLDecodeError
        raise SpecError([SpecIssue(root, f"invalid TOML: {exc}", source=source)]) from None
    if duplicates:
        raise SpecError(
            [
                SpecIssue(
                    key_path(node, data, mark, root) or root,
                    duplicate_key_message(key, first),
                    source=source,
                    location=(file, mark.line + 1, mark.column + 1),
                )
                for key, mark, first in duplicates
            ]
        )
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise SpecError(
            [
                SpecIssue(
                    root,
                    f"the top level of {file} must be a mapping, not {type(data).__name__}",
                    source=source,
                    location=(file, 1, 1),
                )
            ]
        )
    return dict(data), locations


def _alerts_section(data: Mapping[str, Any], source: str, location_of=None) -> dict[str, Any]:
    """An alerts-file's content as RunSpec data: its top level is the ``alerts`` section,
    or a mapping whose only key is ``alerts``."""
    if "alerts" in data:
        others = [k for k in data if k != "alerts"]
        if others:
            issues = [
                SpecIssue(
                    str(k),
                    "unexpected key: an alerts file holds either the alerts section itself "
                    "or a mapping with only an `alerts` key",
                    source=source,
                    location=location_of(str(k)) if location_of else None,
                )
                for k in others
            ]
            raise SpecError(issues)
        section = data["alerts"]
        if section is None:
            section = {}
        return {"alerts": section}
    return {"alerts": dict(data)}


#: the section of a Hydra app's config that holds the tracker's spec (``+tracker=...``)
APP_PACKAGE = "tracker"


def app_package(data: Any) -> str | None:
    """The section of a file holding the run spec, from the file's top level ``data``:
    ``"tracker"`` when it has a top-level ``tracker:`` mapping (a Hydra app's config, as
    ``python app.py --cfg job`` prints it; no spec has that key), else None (the file is
    the spec). Used by ``et.init(spec=PATH)``, ``ET_CONFIG`` and the CLI commands reading
    a file (``et config validate``, ``et rules check`` ...) alike."""
    if (
        isinstance(data, Mapping)
        and isinstance(data.get(APP_PACKAGE), Mapping)
        and APP_PACKAGE not in RUN_FIELDS
    ):
        return APP_PACKAGE
    return None


def source_file_layer(
    path: str | os.PathLike,
    source: str,
    kind: str,
    package: str | None = None,
    *,
    find_package: bool = False,
) -> Layer:
    """``find_package``: with no ``package``, read a Hydra app config's ``tracker:``
    section (``app_package``)."""
    file = os.fspath(path)
    if kind == "run" and package is None and find_package:
        data, locations = load_file(file, source=source)
        package = app_package(data)
        if package is None:
            return Layer(source, data, locations)
    if kind == "alerts":
        probe, _ = load_file(file, source=source, package=package)
        wrapped = "alerts" in probe
        root = "" if wrapped else "alerts"
        data, locations = load_file(file, source=source, root=root, package=package)
        data = _alerts_section(data, source, locations.get)
    else:
        data, locations = load_file(file, source=source, package=package)
    return Layer(source, data, locations)


def file_layer(path: str | os.PathLike, kind: str = "run", package: str | None = None) -> Layer:
    """A spec file as a layer (source ``"file:<path>"``) to give ``resolve(spec=...)``:
    ``kind`` ``"run"`` (a RunSpec) or ``"alerts"``; ``package`` a dotted section of the file
    (``"tracker"`` in a Hydra app's config), as ``load_file``.

    Raises:
        SpecError: as ``load_file``.
    """
    return source_file_layer(path, f"file:{os.fspath(path)}", kind, package)


def alert_config_layer(path: str | os.PathLike) -> Layer:
    """The ``ET_ALERT_CONFIG`` file (its ``alerts``), source ``"ET_ALERT_CONFIG:<path>"``.

    Raises:
        SpecError: as ``load_file``, or when a file with an ``alerts`` key holds others too.
    """
    return source_file_layer(path, f"{ALERT_CONFIG_ENV}:{os.fspath(path)}", "alerts")


def config_file_layer(path: str | os.PathLike) -> Layer:
    """The ``ET_CONFIG`` file (a whole RunSpec, or a Hydra app's config whose top-level
    ``tracker:`` section is read: ``app_package``), source ``"ET_CONFIG:<path>"``.

    Raises:
        SpecError: as ``load_file``.
    """
    return source_file_layer(path, f"{CONFIG_ENV}:{os.fspath(path)}", "run", find_package=True)


def env_layers(environ: Mapping[str, str]) -> list[Layer]:
    """One layer per webhook variable set in ``environ`` (empty values ignored), each a
    channel ``{type, url}`` with source ``"env:<VARIABLE>"``. ``WEBHOOK_URL`` (legacy) comes
    before ``ET_LARK_WEBHOOK_URL``, so the latter wins for the ``lark`` channel."""
    layers = []
    for variable, channel_type in WEBHOOK_ENV:
        url = environ.get(variable)
        if url and url.strip():
            channel = {"type": channel_type, "url": url.strip()}
            layers.append(Layer(f"env:{variable}", {"alerts": {"channels": [channel]}}))
    return layers


def configure_alert_layer(values: Mapping[str, Any]) -> Layer:
    """``et.configure_alert(...)`` values: the ``alerts`` section (or ``{"alerts": {...}}``).

    ``values`` may be (or hold) models: an ``AlertsSpec`` (``et.AlertConfig``), channels as
    ``ChannelSpec``, a ``PolicySpec``; each stands for the fields set on it
    (:func:`~expr_tracker.spec.alerting.alerts_data`).

    Raises:
        SpecError: ``values`` is not a mapping.
    """
    values = alerts_data(values)
    if not isinstance(values, Mapping):
        raise SpecError(
            [
                SpecIssue(
                    "alerts",
                    "configure_alert values must be a mapping",
                    values,
                    source="configure_alert",
                )
            ]
        )
    return Layer("configure_alert", _alerts_section(copy_plain(values), "configure_alert"))


def _omegaconf_to_dict(cfg: Any) -> tuple[dict[str, Any], str | None]:
    """Resolve a DictConfig to a plain dict, reporting every broken interpolation and every
    missing (``???``) value at once, by their full config key. Inside ``config`` (the user's
    own values) a broken interpolation stays literal with a warning instead."""
    from omegaconf import DictConfig
    from omegaconf.errors import MissingMandatoryValue

    prefix = cfg._get_full_key("") or None
    issues: list[SpecIssue] = []

    def on_error(key_path: str, exc: Exception, raw: Any) -> Any:
        if (key_path == "config" or key_path.startswith("config.")) and not isinstance(
            exc, MissingMandatoryValue
        ):
            return keep_literal(key_path, exc, raw)
        if isinstance(exc, MissingMandatoryValue):
            message = "is required: it is marked missing (???) in the config"
        else:
            reason = str(getattr(exc, "msg", exc)).splitlines()[0]
            message = f"interpolation {raw!r} could not be resolved: {reason}"
        issues.append(
            SpecIssue(
                key_path,
                message,
                source="spec",
                config_key=f"{prefix}.{key_path}" if prefix else key_path,
            )
        )
        return SKIP

    if cfg is None or (isinstance(cfg, DictConfig) and cfg._is_none()):
        return {}, prefix
    if not isinstance(cfg, DictConfig):
        raise SpecError(
            [SpecIssue("", "spec must be a mapping (a DictConfig), not a list", source="spec")]
        )
    data = omegaconf_to_plain(cfg, on_error)
    if issues:
        raise SpecError(issues)
    return data, prefix


def spec_layer(spec: Any) -> Layer | None:
    """The ``spec=`` given to ``et.init``: a YAML/JSON/TOML path (``str`` or ``Path``;
    source ``"file:<path>"``; a Hydra app's config file gives its top-level ``tracker:``
    section, ``app_package``), a dict or an OmegaConf DictConfig (resolved; source
    ``"spec"``), or a ``RunSpec`` (only the values set on it). None gives None.

    Raises:
        SpecError: an unreadable or invalid file, a broken interpolation or missing value
            (named by its config key), or another type.
    """
    if spec is None:
        return None
    if isinstance(spec, Layer):  # file_layer(): a section of a file
        return spec
    if isinstance(spec, (str, os.PathLike)):
        path = os.fspath(spec)
        return source_file_layer(path, f"file:{path}", "run", find_package=True)
    models = sys.modules.get("expr_tracker.spec.models")  # no RunSpec exists before it
    if models is not None and isinstance(spec, models.RunSpec):
        return Layer("spec", spec.model_dump(exclude_unset=True))
    if is_omegaconf(spec):
        data, prefix = _omegaconf_to_dict(spec)
        return Layer("spec", data, config_key=prefix)
    if isinstance(spec, Mapping):
        return Layer("spec", copy_plain(spec))
    raise SpecError(
        [
            SpecIssue(
                "",
                "spec must be a path to a YAML/JSON/TOML file, a dict, an OmegaConf "
                f"DictConfig or a RunSpec, not {type(spec).__name__}",
                source="spec",
            )
        ]
    )


def kwargs_to_dict(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Map ``et.init`` keyword arguments onto a RunSpec-shaped dict through ``KEYWORDS``.

    ``spans=``, ``system=`` and ``alert=`` take a bool (``spans.enabled``,
    ``system.enabled``, ``alerts.enabled``) or a mapping (the whole section, merged
    deeply); ``sync=`` takes a URL (``sync.url``) or the whole section; a single string or object given as ``alert_rules``
    or ``span_plugins`` becomes a one-item list. Section-wide arguments apply first, so a
    flat keyword beats the same value inside ``alert={...}``. Pass only the arguments the
    caller actually gave: ``None`` is a value (``max_open_seconds=None`` disables).

    Raises:
        SpecError: listing every unknown keyword, each with close matches.
    """
    issues = []
    pieces: list[tuple[int, dict]] = []
    valid = sorted(set(KEYWORDS) | set(RUN_FIELDS))
    for key, value in kwargs.items():
        if key in ("spans", "system", "sync") and isinstance(value, Mapping):
            target = key
        elif key == "alert" and isinstance(value, bool):
            target = "alerts.enabled"
        elif key in KEYWORDS:
            target = KEYWORDS[key]
        elif key in RUN_FIELDS:
            target = key
        else:
            issues.append(
                SpecIssue(
                    key,
                    "unknown keyword argument of et.init()",
                    suggestion=suggest(key, valid),
                    source="init",
                )
            )
            continue
        if target == "alerts.rules" and (isinstance(value, str) or is_model(value)):
            value = [value]
        if target == "spans.plugins" and value is not None and not isinstance(value, (list, tuple)):
            value = [value]
        if isinstance(value, tuple):
            value = list(value)
        if target == "alerts" or target.startswith("alerts."):
            value = alerts_data(value)  # et.AlertConfig / ChannelConfig / ... as data
        pieces.append((target.count("."), nest_path(target, value)))
    if issues:
        raise SpecError(issues, title="invalid et.init() arguments")
    pieces.sort(key=lambda piece: piece[0])  # whole sections first, then single values
    return merge(*(p for _, p in pieces))


def config_without_spec(config: Any, spec: Any) -> Any:
    """``config`` without the run spec's own node, wherever it sits (docs/hydra.md).

    A Hydra app passes its whole config, ``et.init(spec=cfg.tracker, config=cfg)``: the
    tracker's settings are the spec (``spec.json``), not hyper-parameters, so they are left
    out of ``config.json`` whatever their key (``cfg.tracker``, ``cfg.logging.et``, an
    interpolation naming that node). Recognised are: an OmegaConf spec node inside an
    OmegaConf config (by identity: the node itself; the config is then returned resolved, as
    plain data), and in a plain mapping config (``OmegaConf.to_container(cfg,
    resolve=True)``, a YAML file read into a dict) a mapping value that is the spec or equals
    it (resolved), at any depth of nested mappings. A spec given as a file path, an empty
    spec, or a spec that is the whole config leaves ``config`` as it is.

    Args:
        config: what ``et.init(config=...)`` got (any accepted form; other forms pass).
        spec: what ``et.init(spec=...)`` got.

    Returns:
        ``config`` itself when it holds no such node, else a copy without it.
    """
    if spec is None or config is None or spec is config:
        return config
    spec_is_omegaconf = type(spec).__module__.startswith("omegaconf")
    if type(config).__module__.startswith("omegaconf"):
        if spec_is_omegaconf and _below(spec, config):
            return omegaconf_to_plain(config, key_path="config", skip=spec)
        return config
    if not isinstance(config, Mapping):
        return config
    if spec_is_omegaconf:
        plain = omegaconf_to_plain(spec, on_error=lambda _path, _exc, raw: raw)
    elif isinstance(spec, Mapping):
        plain = spec
    else:  # a path, a RunSpec: nothing to recognise in a mapping
        return config
    if not plain:
        return config
    return _drop_node(config, spec, plain)


def _below(node: Any, root: Any) -> bool:
    """Whether OmegaConf ``node`` sits (strictly) below container ``root``."""
    parent = node._get_parent()
    while parent is not None:
        if parent is root:
            return True
        parent = parent._get_parent()
    return False


def _drop_node(config: Mapping[str, Any], spec: Any, plain: Any) -> Any:
    """``config`` without its mapping values that are ``spec`` or equal ``plain``; the same
    object when there are none."""
    out: dict[Any, Any] = {}
    dropped = False
    for key, value in config.items():
        if value is spec or (isinstance(value, Mapping) and value and value == plain):
            dropped = True
            continue
        if isinstance(value, Mapping) and not type(value).__module__.startswith("omegaconf"):
            kept = _drop_node(value, spec, plain)
            dropped = dropped or kept is not value
            value = kept
        out[key] = value
    return out if dropped else config
