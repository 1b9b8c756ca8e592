"""``check(resolved)``: everything a spec can get wrong beyond its schema, with no side
effect (span plugins, alert rules, channels), each problem a ``SpecIssue`` with its path,
source and location. ``build``, ``et.configure_alert`` and ``et config validate`` call it.
"""

from __future__ import annotations

import os
from typing import Any


def check(
    resolved: Any,
    environ: Any = None,
    *,
    stream: str | None = None,
    rank: int = 0,
    channels: bool = True,
) -> Any:
    """Everything a spec can get wrong beyond its schema, checked with no side effect: span
    plugins (types and options: each built-in plugin is constructed), alert rules (compiled)
    and channels (types, options and URLs of every channel; the ones that are on built with
    ``environ``, not started). ``et.init`` (through :func:`build`), ``et.configure_alert``
    and ``et config validate`` all call this, so they accept and reject the same specs.

    Returns the alert engine with the rules compiled, for :func:`build` to use; None when
    alerts are disabled or :func:`deferrable_alerts` (a run builds that engine on first
    need, docs/architecture.md "Cold start"). ``channels=False`` skips the channels.

    Raises:
        SpecError: every problem found, each with its spec path
            (``spans.plugins[0].options.interval``, ``alerts.rules.r.condition``,
            ``alerts.channels.ops.options.port``), its source and ``file:line:column``.
    """
    from expr_tracker.spec import SpecError

    spec = resolved.spec
    env = os.environ if environ is None else environ
    issues = _plugin_issues(resolved)
    engine = None
    try:
        if not deferrable_alerts(spec):
            engine = make_engine(resolved, stream, rank)
    except SpecError as exc:
        issues.extend(exc.issues)
    try:  # the rules on the system sampler's rows (docs/system.md): compiled, then dropped
        system_engine = make_engine(resolved, "system", rank, rule_stream="system")
        if system_engine is not None:
            system_engine.close()
    except SpecError as exc:
        issues.extend(exc.issues)
    from expr_tracker.assemble.sync import sync_issue

    why = sync_issue(spec)
    if why is not None:
        issues.append(_issue(resolved, "sync.url", why, value=spec.sync.url))
    if channels and spec.alerts.enabled and spec.alerts.channels:
        issues.extend(_channel_issues(resolved, env))
    if issues:
        if engine is not None:
            engine.close()
        raise SpecError(issues)
    return engine


def _location(resolved: Any, path: str) -> Any:
    """``(file, line, column)`` of ``path``, else of its nearest enclosing value, else None."""
    locations = getattr(resolved, "locations", None) or {}
    while path:
        if path in locations:
            return locations[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return None


def _issue(resolved: Any, path: str, message: str, **extra: Any) -> Any:
    from expr_tracker.spec import SpecIssue

    source = resolved.source_of(path) if hasattr(resolved, "source_of") else None
    return SpecIssue(
        path=path,
        message=message,
        source=source,
        location=_location(resolved, path),
        **extra,
    )


def _plugin_issues(resolved: Any) -> list[Any]:
    """Span plugins: unknown types (with close matches), unknown options and options of the
    wrong type, each a SpecIssue at ``spans.plugins[i].<field>`` (nothing built is kept)."""
    entries = list(resolved.spec.spans.plugins or ())
    if not any(getattr(e, "type", None) is not None for e in entries):
        return []
    from expr_tracker.spans.recorder import plugin_problems

    issues = []
    for p in plugin_problems(entries):
        path = f"spans.plugins[{p['index']}].{p['field']}"
        extra = {"suggestion": p.get("suggestion")}
        if "value" in p:
            extra["value"] = p["value"]
        issues.append(_issue(resolved, path, p["message"], **extra))
    return issues


def _channel_path(name: Any, field: str | None) -> str:
    from expr_tracker.spec.errors import join_path

    path = join_path("alerts.channels", name)
    for part in (field or "").split(".") if field else ():
        path = join_path(path, part)
    return path


def channel_issue(resolved: Any, exc: Any) -> Any:
    """A SpecIssue for a ``ChannelConfigError`` (its text never holds a secret)."""
    name = getattr(exc, "channel", None)
    if name is None:
        return _issue(resolved, "alerts.channels", str(exc))
    return _issue(resolved, _channel_path(name, exc.field), exc.problem or str(exc))


def _channel_issues(resolved: Any, env: Any) -> list[Any]:
    """Every channel's problems (``alerts.channels.channel_problems``) as SpecIssues."""
    from expr_tracker.alerts.delivery.channels import channel_problems

    issues: list[Any] = []
    for channel in resolved.spec.alerts.channels:
        issues.extend(channel_issue(resolved, exc) for exc in channel_problems(channel, env))
    return issues


def deferrable_alerts(spec: Any) -> bool:
    """Whether a run's alert engine and delivery may wait for their first need: alerts on
    with no rule on the run's rows, no channel and nothing in ``notify_on``, so that until
    a rule is added or an alert sent they would never do anything."""
    a = spec.alerts
    return bool(
        a.enabled
        and not a.channels
        and not a.notify_on
        and all(getattr(rule, "stream", None) is not None for rule in a.rules)
    )


def make_engine(
    resolved: Any, stream: str | None, rank: int, *, rule_stream: str | None = None
) -> Any:
    """The alert engine with every rule compiled; no thread, no file.

    ``rule_stream``: the rules taken are those whose ``stream`` is this (None: the run's own
    rows; ``"system"``: the system sampler's, docs/system.md); a one-line rule reads the
    run's own. None (no engine) when alerts are off, or when ``rule_stream`` is given and
    no rule reads it.

    Raises:
        SpecError: listing every rule that does not compile, each with its path
            (``alerts.rules.<name>.condition``), its source and file:line:column.
    """
    spec = resolved.spec
    a = spec.alerts
    if not a.enabled:
        return None
    chosen = [
        (i, rule) for i, rule in enumerate(a.rules) if getattr(rule, "stream", None) == rule_stream
    ]
    if rule_stream is not None and not chosen:
        return None
    from expr_tracker.alerts.baseline import Baselines
    from expr_tracker.alerts.delivery import rank_alerts
    from expr_tracker.alerts.engine import AlertEngine
    from expr_tracker.alerts.parse import RuleError

    engine = AlertEngine(
        (),
        window=spec.history.alert_window,
        run_info={"project": spec.project, "run": spec.name, "stream": stream, "rank": rank},
        deliver=rank_alerts(a.on_rank, rank),
        # baseline() tables: read by build_alerts once the run directory is chosen
        baselines=Baselines(project=spec.project),
    )
    issues = []
    for i, rule in chosen:
        try:
            engine.add_rule(rule)
        except RuleError as exc:
            issues.append(_rule_issue(resolved, i, rule, exc))
    if issues:
        from expr_tracker.spec import SpecError

        raise SpecError(issues)
    return engine


def _rule_issue(resolved: Any, index: int, rule: Any, exc: Exception) -> Any:
    """A SpecIssue for a rule that does not compile: where it is, where it came from."""
    from expr_tracker.spec import SpecIssue
    from expr_tracker.spec.errors import join_path

    # the spec names entries of `alerts.rules` by name; a one-line string rule is its own name
    name = rule if isinstance(rule, str) else getattr(rule, "name", None)
    base = join_path("alerts.rules", name) if name else f"alerts.rules[{index}]"
    field = getattr(exc, "field", None) or "condition"
    if field == "expr":
        field = "condition"
    path = base if isinstance(rule, str) else join_path(base, field)
    text = rule if isinstance(rule, str) else getattr(rule, field, None)
    locations = getattr(resolved, "locations", {}) or {}
    return SpecIssue(
        path=path,
        message=str(exc).replace("\n", "\n    "),
        value=text,
        source=resolved.source_of(path) if hasattr(resolved, "source_of") else None,
        location=locations.get(path) or locations.get(base),
    )


def check_file(file: str, kind: str, environ: Any = None, package: str | None = None) -> list[Any]:
    """Every problem ``et.init(spec=file)`` would raise for ``file`` (an alerts file: as the
    ``alerts`` section of a run spec), from the same checks: the schema, then
    ``assemble.check`` (span plugins and their options, rules, channels with their options and
    URLs; ``url_env``/``*_env`` variables read from ``environ``, default ``os.environ``);
    ``package`` is the dotted section of a Hydra app's config holding the spec.
    Rule problems are shown as ``et rules check`` shows them (the column of the error in the
    file); with a schema error, rules are still compiled so every problem shows at once."""
    from expr_tracker.alerts.rulefiles import rule_issues
    from expr_tracker.spec import SpecError, SpecIssue
    from expr_tracker.spec.resolve import resolve_file

    try:
        resolved = resolve_file(file, kind, package)
    except SpecError as exc:
        return exc.issues + rule_issues(file, kind, exc.issues, package)
    try:
        check(resolved, os.environ if environ is None else environ)
    except SpecError as exc:
        issues = exc.issues
    except Exception as exc:  # noqa: BLE001 - et.init would raise it too: report, no traceback
        return [SpecIssue("", f"cannot be checked: {type(exc).__name__}: {exc}")]
    else:
        return []
    # the same problems, rules shown at their column (et rules check's wording)
    located = {i.path: i for i in rule_issues(file, kind, [], package)}
    return [located.get(i.path, i) if i.path.startswith("alerts.rules") else i for i in issues]
