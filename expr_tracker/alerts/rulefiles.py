"""Rule files checked without a run: ``check_file`` (every rule compiled as the engine
would, each entry through the spec models, problems at their line and column) and ``lint``
(valid rules that are almost certainly mistakes), for ``et rules check``, ``et rules test``
and ``et config validate``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from expr_tracker.spec.yaml import LocatedYaml, yaml_error

__all__ = [
    "DEFAULT_ALERT_WINDOW",
    "alert_window",
    "build_rule",
    "check_file",
    "lint",
    "looks_like_file",
    "one_line",
    "rule_entries",
    "rule_problems",
    "rules_from",
]


def lint(rule) -> list[str]:
    """Problems that do not make a rule invalid but are almost certainly mistakes."""
    from expr_tracker.alerts import ast

    out = []
    for node in rule.condition.walk():
        if isinstance(node, ast.Name) and node.name.lower() in ("nan", "inf"):
            out.append(f"'{node.name}' is read as a metric name: test NaN with isnan()/isinf()")
        if isinstance(node, (ast.Name, ast.Window)) and "/" in node.name:
            last = node.name.rsplit("/", 1)[1]
            if re.fullmatch(r"[\d.]+", last):
                out.append(
                    f"'{node.name}' is one metric name; to divide, put spaces around '/' "
                    f"({node.name.replace('/', ' / ')})"
                )
        if (
            isinstance(node, ast.Compare)
            and node.op in (">", ">=")
            and isinstance(node.left, ast.Call)
            and node.left.func == "zscore"
            and node.left.args
            and isinstance(node.left.args[0], ast.Window)
            and node.left.args[0].size is not None
            and isinstance(node.right, ast.Number)
        ):
            n = node.left.args[0].size
            bound = math.sqrt(n - 1) if n > 1 else 0.0
            if node.right.value >= bound:
                out.append(
                    f"zscore over {n} points is at most sqrt({n} - 1) = {bound:.3g} (the latest "
                    f"value is in the window), so '> {node.right.value:g}' can never fire; "
                    f"use at least {math.ceil(node.right.value**2) + 2} points"
                )
    if rule.mode == "level" and rule.cooldown == 0:
        out.append("level mode with cooldown 0 notifies on every step while firing")
    return out


def rule_entries(rules, base):
    """(path, entry as make_rule input, explicit name?) for a list or name-keyed mapping."""
    if isinstance(rules, dict):
        for key, entry in rules.items():
            path = (*base, key)
            if entry is None:
                continue
            if isinstance(entry, str):
                yield path, ("text", entry, {"name": str(key)}), True
            elif isinstance(entry, dict):
                data = dict(entry)
                data.setdefault("name", str(key))
                yield path, ("dict", data, {}), True
            else:
                yield path, ("bad", entry, {}), True
    elif isinstance(rules, list):
        for i, entry in enumerate(rules):
            path = (*base, i)
            if isinstance(entry, str):
                yield path, ("text", entry, {}), False
            elif isinstance(entry, dict):
                yield path, ("dict", entry, {}), bool(entry.get("name"))
            else:
                yield path, ("bad", entry, {}), False
    elif rules is not None:
        yield base, ("bad", rules, {}), False


def build_rule(kind, value, extra):
    from expr_tracker.alerts import RuleError, make_rule

    if kind == "bad":
        raise RuleError(f"a rule is a string or a mapping, got {type(value).__name__}")
    return make_rule(value, **extra)


def _cond_path(path, kind):
    return (*path, "condition") if kind == "dict" else path


DEFAULT_ALERT_WINDOW = 4096


def alert_window(data) -> int:
    """``history.alert_window`` of a whole run spec file, else the default (4096)."""
    history = data.get("history") if isinstance(data, dict) else None
    value = history.get("alert_window") if isinstance(history, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return DEFAULT_ALERT_WINDOW


def check_file(path: str, known: set[str] | None = None, package: str | None = None) -> dict:
    """Validate one rules file: ``{"file", "status", "errors", "warnings", "rules"}``;
    each problem is ``{"line", "column", "message"}``, at the key or value at fault.

    Point windows are capped by ``history.alert_window`` when the file is a whole run spec
    (it has an ``alerts`` section), by the default 4096 otherwise. ``package`` (dotted) is
    the section of the file that holds the rules file or run spec (``tracker`` in a Hydra
    app's config); lines and columns stay those of the file."""
    from expr_tracker.spec.yaml import duplicate_key_message

    result = {"file": path, "errors": [], "warnings": [], "rules": 0}

    def problem(bucket, line, col, message, path=None):
        record = {"line": line, "column": col, "message": message}
        if path is not None:  # the dotted path at fault, as et.init and et config validate say
            record["path"] = _dotted(path)
        result[bucket].append(record)

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        problem("errors", 0, 0, f"cannot read: {exc.strerror or exc}")
        return _status(result)
    try:
        doc = LocatedYaml(text)
    except Exception as exc:  # yaml.YAMLError carries a mark (a reader error a position)
        what, at = yaml_error(exc, text) if isinstance(exc, yaml.YAMLError) else (exc, None)
        problem("errors", *(at or (1, 1)), f"invalid YAML: {what}")
        return _status(result)
    data = doc.data
    base: tuple = ()
    for key in package.split(".") if package else ():
        if not isinstance(data, dict) or key not in data:
            keys = ", ".join(map(str, data)) if isinstance(data, dict) else "none"
            message = f"no section {'.'.join((*base, key))!r} (--package {package}; keys: {keys})"
            problem("errors", *doc.where(base), message)
            return _status(result)
        data, base = data[key], (*base, key)
    window = DEFAULT_ALERT_WINDOW
    if isinstance(data, dict) and isinstance(data.get("alerts"), dict):
        base, section = (*base, "alerts"), data["alerts"]
        window = alert_window(data)
    elif isinstance(data, dict):
        section = data
    else:
        problem("errors", 1, 1, "expected a mapping with 'rules' (or 'alerts: {rules: ...}')")
        return _status(result)
    if "rules" not in section:
        problem("warnings", *doc.where(base), "no 'rules' in this file")

    rules_node = doc.node((*base, "rules"))
    rule_keys = set()
    if rules_node is not None and rules_node.tag.endswith(":map"):
        rule_keys = {id(k.start_mark) for k, _ in rules_node.value}
    for key, mark, first in doc.duplicates:
        line, col = mark.line + 1, mark.column + 1
        if id(mark) in rule_keys:
            message = (
                f"duplicate rule name {key!r} (first at line {first.line + 1}): "
                "YAML would keep only the last one"
            )
        else:
            message = duplicate_key_message(key, first)
        problem("errors", line, col, message)

    problems, result["rules"] = rule_problems(doc, section, base, window, known)
    for p in problems:
        problem(p["severity"], p["line"], p["column"], p["message"], p["path"])

    # each rule entry through the spec model too (RuleSpec, what et.init validates), so a
    # value the rule compiler would take (tags: a string, level: null, for_steps: true) is
    # rejected here as it is there; a field the compiler already faulted is not repeated
    faulted = {p["path"] for p in problems if p["severity"] == "errors"}
    for message, loc in _validate_rules(section):
        path = (*base, *loc)
        if not any(path[: len(f)] == f or f[: len(path)] == path for f in faulted):
            problem("errors", *doc.where(path), message, path)
    for message, loc in _validate_section(section):
        problem("errors", *doc.where((*base, *loc)), message, (*base, *loc))
    return _status(result)


def _dotted(path) -> str:
    from expr_tracker.spec.errors import join_path

    out = ""
    for part in path:
        out = join_path(out, part)
    return out


def _validate_rules(section: dict):
    """The dict entries of ``section["rules"]`` through ``RuleSpec``. Yields ``(message,
    loc)`` with ``loc`` relative to ``section``."""
    from pydantic import ValidationError

    from expr_tracker.spec.errors import issues_from_validation_error
    from expr_tracker.spec.models import RuleSpec

    rules = section.get("rules")
    if isinstance(rules, dict):
        entries = [(k, v) for k, v in rules.items()]
    elif isinstance(rules, list):
        entries = list(enumerate(rules))
    else:
        return
    for key, entry in entries:
        if not isinstance(entry, dict):
            continue  # one-line rules and bad entries: the rule compiler's errors
        try:
            RuleSpec.model_validate(entry)
        except ValidationError as exc:
            for issue in issues_from_validation_error(exc, entry, root=RuleSpec):
                parts = re.findall(r"\[(\d+)\]|([^.\[\]]+)", issue.path)
                loc = tuple(int(i) if i else name for i, name in parts)
                yield issue.format(), ("rules", key, *loc)


def rule_problems(doc, section, base=(), window=DEFAULT_ALERT_WINDOW, known=None):
    """Compile every rule of an alerts ``section`` (``doc``: a ``LocatedYaml`` document, the
    section at ``base`` in it) as the engine would: ``(problems, number of valid rules)``.

    Each problem is ``{"severity": "errors"|"warnings", "line", "column", "message",
    "path"}`` with ``path`` the tuple of keys at fault in the document. Shared by
    ``et rules check``, ``et rules test`` (inline rules) and ``et config validate``."""
    from expr_tracker.alerts import RuleError, compile_expr
    from expr_tracker.alerts.rules import entry_errors
    from expr_tracker.spec.yaml import interpolated_leaves, interpolation_note

    problems: list[dict] = []
    count = 0

    def problem(severity, path, where, message):
        line, col = where
        problems.append(
            {"severity": severity, "line": line, "column": col, "message": message, "path": path}
        )

    names: dict[str, tuple[int, int]] = {}
    rules = section.get("rules") if isinstance(section, dict) else None
    for rpath, (kind, value, extra), named in rule_entries(rules, (*base, "rules")):
        # ${...} of a Hydra group file (a shipped rule set): only the composed config says
        # what the rule is, so it is not compiled here; a warning at each such value says so
        held = interpolated_leaves(value) if kind in ("dict", "text") else []
        for key_path, text in held:
            path = (*rpath, *key_path)
            problem("warnings", path, doc.where(path), interpolation_note(text))
        if held:
            continue
        if kind == "dict":
            errors = entry_errors(value, window=window, known_metrics=known)
            for exc in errors:
                key = exc.field
                if key not in value and key not in ("condition", "expr"):
                    path, where = rpath, doc.where(rpath)  # e.g. a name derived from the key
                elif key in value and key not in _FIELDS:  # an unknown field: its key
                    path, where = (*rpath, key), doc.where_key((*rpath, key))
                else:
                    path = (*rpath, key)
                    where = doc.where(path, getattr(exc, "column", None))
                problem("errors", path, where, one_line(exc))
            if errors:
                continue
        try:
            rule = build_rule(kind, value, extra)
            compile_expr(rule.condition, window=window, text=rule.source, known_metrics=known)
        except RuleError as exc:
            path = _cond_path(rpath, kind)
            problem("errors", path, doc.where(path, getattr(exc, "column", None)), one_line(exc))
            continue
        count += 1
        where = doc.where(rpath)
        if rule.name in names:
            first = names[rule.name]
            message = f"duplicate rule name {rule.name!r} (first at line {first[0]})"
            problem("errors", rpath, where, message)
        else:
            names[rule.name] = where
        if not named:
            message = (
                f"rule has no name (derived: {rule.name!r}); name it so edits keep its identity"
            )
            problem("warnings", rpath, where, message)
        for w in lint(rule):
            path = _cond_path(rpath, kind)
            problem("warnings", path, doc.where(path), w)
    return problems, count


_FIELDS = frozenset(
    (
        "name condition expr level title message mode for_steps cooldown max_fires "
        "notify_recovery channels tags enabled"
    ).split()
)


def one_line(exc) -> str:
    message = getattr(exc, "message", None) or str(exc).splitlines()[0]
    label = getattr(exc, "label", None)
    text = getattr(exc, "text", "")
    if text:
        message += f" in {text!r}"
    if label is None and hasattr(exc, "expected") and exc.expected:
        message += f" (expected: {', '.join(exc.expected)})"
    return message


def _validate_section(section: dict):
    """Channels, policy and the other alerts fields through the spec models (rules are
    checked above). Yields ``(message, loc)``."""
    try:
        from pydantic import ValidationError

        from expr_tracker.spec.models import AlertsSpec
    except Exception:  # the spec package is not importable: channels unchecked
        yield from ()
        return
    if "window" in section:
        yield "window: there is no alerts.window: set history.alert_window", ("window",)
    rest = {k: v for k, v in section.items() if k not in ("rules", "window")}
    try:
        AlertsSpec.model_validate(rest)
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(err.get("loc", ()))
            dotted = ".".join(str(p) for p in loc)
            message = f"{dotted}: {err.get('msg')}"
            if err.get("type") == "string_type" and isinstance(err.get("input"), bool):
                message += "; YAML reads off/on/yes/no as booleans: quote it"
            yield message, tuple(p for p in loc if not _is_tag(p))


def _is_tag(part) -> bool:
    return isinstance(part, str) and part.startswith(("function-", "tagged-union"))


def _status(result: dict) -> dict:
    result["status"] = "FAILED" if result["errors"] else "SUCCESS"
    return result


def looks_like_file(target: str) -> bool:
    """A rules or test file name (not a rule): ends in .yaml, .yml or .json."""
    return Path(target).suffix.lower() in (".yaml", ".yml", ".json")


def rules_from(target: str) -> list:
    """A rule string, or every rule of a rules file (same shapes as ``check``)."""
    from expr_tracker.alerts import RuleError

    path = Path(target)
    if not looks_like_file(target):
        from expr_tracker.alerts import make_rule

        return [make_rule(target)]
    result = check_file(str(path))
    if result["errors"]:
        e = result["errors"][0]
        raise RuleError(f"{path}:{e['line']}:{e['column']}: {e['message']}")
    data = LocatedYaml(path.read_text(encoding="utf-8")).data
    section = data.get("alerts", data) if isinstance(data, dict) else {}
    base = ("rules",)
    return [build_rule(k, v, x) for _, (k, v, x), _ in rule_entries(section.get("rules"), base)]


def rule_issues(file: str, kind: str, found: list, package: str | None = None) -> list:
    """Compile the alert rules of ``file`` as ``et.init`` would, with the checks of
    ``et rules check`` (``alerts.rulefiles.rule_problems``): a ``SpecIssue`` per error, at its
    ``file:line:column`` with its spec path (``alerts.rules.bad.condition``). Problems at a
    path that ``found`` (the spec validation's issues) already reports are left out, and so
    is everything when the file could not be read."""
    from expr_tracker.spec import SpecIssue
    from expr_tracker.spec.resolve import file_section, spec_path_of

    if any(not issue.path or issue.path == "alerts" for issue in found):
        return []  # unreadable, not a mapping, duplicate keys, or a bad alerts section
    doc, data, prefix = file_section(file, package)
    if data is None:
        return []
    window = DEFAULT_ALERT_WINDOW
    if kind == "run" or isinstance(data.get("alerts"), dict):
        base, section = (*prefix, "alerts"), data.get("alerts")
        window = alert_window(data) if kind == "run" else window
    else:
        base, section = prefix, data
    if not isinstance(section, dict):
        return []
    problems, _ = rule_problems(doc or _Unlocated(), section, base, window)
    reported = {issue.path for issue in found}
    out = []
    for p in problems:
        if p["severity"] != "errors":
            continue
        inner = p["path"][len(prefix) :]  # the path within the spec (the section)
        parts = inner if len(base) > len(prefix) else ("alerts", *inner)
        path = spec_path_of(parts, data if len(base) > len(prefix) else {"alerts": data})
        if path in reported or any(r.startswith((path + ".", path + "[")) for r in reported):
            continue
        location = (file, p["line"], p["column"]) if doc is not None else None
        out.append(SpecIssue(path, p["message"], location=location))
    return out


class _Unlocated:
    """Stands in for a located document (TOML): no line or column for anything."""

    def where(self, *args: Any) -> tuple[None, None]:
        return None, None

    where_key = where
