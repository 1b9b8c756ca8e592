"""``et rules``: explain, check and test alert rules without a training job (for CI).

    et rules explain "<rule>" [--format text|json|jsonl]
    et rules check FILE... [--run DIR] [--package P] [--format text|json|jsonl] [--lint-fatal]
    et rules test RULE|FILE --run DIR [-n N] [--format text|json|jsonl]   replay history
    et rules test TESTFILE.yaml                      rule unit tests (like promtool test rules)

Exit codes (stable, CONVENTIONS.md "Rule checking in CI"): 0 success, 1 invalid rules or
failed tests, 2 usage error, 3 lint warnings only with ``--lint-fatal`` (without it
warnings are printed as ``WARNING`` and exit 0, as promtool does).

``--format json`` prints one JSON document (``check``: an array with one result per file;
``test --run``: an array of firings; ``explain``: the rule's description), ``--format
jsonl`` one object per line (``cli/output.py``).
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

from expr_tracker.cli import appconfig, output

__all__ = ["expand_series", "read_metrics", "register"]

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_LINT = 0, 1, 2, 3


def register(subparsers) -> None:
    """Add ``et rules`` and its three verbs to the ``et`` parser."""
    parser = subparsers.add_parser(
        "rules", help="explain, check and test alert rules", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="rules_command", metavar="VERB")

    p = sub.add_parser(
        "explain",
        help="show how a rule parses",
        description=(
            "Parse one rule (the one-line form CONDITION => LEVEL: MESSAGE, or a bare "
            "condition) and print its condition as parsed, level, message, the metrics and "
            "windows it reads, its functions, whether it is time-based and its derived name. "
            "Exit 0 when it is valid, 1 when it is not (the error is printed)."
        ),
    )
    p.add_argument("rule", help='a rule, e.g. "zscore(loss[50]) > 4 => error: spike"')
    p.add_argument(
        "--format",
        choices=("text", *output.MACHINE_FORMATS),
        default="text",
        help="text (default); json: the description as one JSON object; jsonl: on one line",
    )
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser(
        "check",
        help="validate alert rule files (rules, channels, policy)",
        description=(
            "Validate alerts files (or run specs with an alerts section) as et.init would: "
            "every rule compiles, channels and policy are valid. Prints 'Checking FILE' then "
            "'SUCCESS: N rules found' or the errors, and lint warnings (rules that can never "
            "fire, suspicious names) as WARNING lines. Exit 0 valid (warnings too), 1 "
            "errors, 2 usage error, 3 warnings only with --lint-fatal."
        ),
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--run", metavar="DIR", help="a run: metric names unknown to it are errors")
    appconfig.add_package_option(p)
    output.add_format_option(p, "text", what="file results")
    p.add_argument("--lint-fatal", action="store_true", help="exit 3 when there are warnings")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser(
        "test",
        help="replay rules over a run, or run a rule unit-test file",
        description=(
            "With --run DIR: replay a rule (or every rule of a rules file) over the run's "
            "recorded metrics and print when it would have fired. Without --run: run a rule "
            "unit-test file (.yaml: input series and the alerts expected). Exit 0 replayed / "
            "tests passed, 1 invalid rules or failed tests, 2 usage error."
        ),
    )
    p.add_argument("target", metavar="RULE|FILE", help="a rule, a rules file, or a test file")
    p.add_argument("--run", metavar="DIR", help="run directory or metrics*.jsonl to replay")
    p.add_argument("-n", type=int, metavar="N", help="replay only the last N steps")
    output.add_format_option(p, "text", what="firings with --run, else of test-file results")
    p.set_defaults(func=cmd_test)

    parser.set_defaults(func=lambda args: _usage(parser))


def _usage(parser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


# -- explain ----------------------------------------------------------------------------------


def cmd_explain(args) -> int:
    from expr_tracker.alerts import RuleError, compile_expr, make_rule

    try:
        rule = make_rule(args.rule)
        compiled = compile_expr(rule.condition, text=rule.source)
    except RuleError as exc:
        if output.is_machine(args.format):
            output.write_object({"valid": False, "error": str(exc)}, args.format)
        else:
            _out(f"FAILED: {exc}")
        return EXIT_INVALID
    info = {
        "valid": True,
        "name": rule.name,
        "condition": _as_parsed(rule.condition),
        "level": rule.level,
        "message": rule.message,
        "metrics": {name: n for name, n in compiled.needs.items()},
        "functions": list(rule.condition.functions()),
        "time_based": compiled.time_based,
        "warnings": _lint(rule),
    }
    if output.is_machine(args.format):
        output.write_object(info, args.format)
        return EXIT_OK
    _out(f"condition:  {info['condition']}")
    _out(f"level:      {rule.level}")
    _out(f"message:    {rule.message if rule.message is not None else '(default: {expr})'}")
    metrics = ", ".join(
        f"{name} (last {n} values)" if n > 1 else name for name, n in compiled.needs.items()
    )
    _out(f"metrics:    {metrics or '(none)'}")
    _out(f"functions:  {', '.join(info['functions']) or '(none)'}")
    _out(f"time-based: {'yes (the watchdog evaluates it too)' if compiled.time_based else 'no'}")
    _out(f"name:       {rule.name}")
    for w in info["warnings"]:
        _out(f"WARNING: {w}")
    return EXIT_OK


def _as_parsed(node) -> str:
    """The condition as parsed: every operation in parentheses except the outermost one,
    numbers and durations as written (``zscore(loss[50]) > 4``, ``(a > 1) and (b < 1e-3)``)."""
    text = node.to_source()
    # to_source() wraps each compound node whole, so the outermost pair is always redundant
    if text.startswith("(") and text.endswith(")"):
        return text[1:-1]
    return text


# -- lint -------------------------------------------------------------------------------------


def _lint(rule) -> list[str]:
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


# -- YAML with locations ----------------------------------------------------------------------


class _Located:
    """A YAML document and the line:column of each path in it (node marks), parsed once
    with ``UniqueKeyLoader``: ``duplicates`` lists ``(key, mark, first_mark)`` of every
    mapping key written twice (plain YAML keeps the last one silently)."""

    def __init__(self, text: str):
        from expr_tracker.spec.yaml import compose_unique

        self.root, self.data, self.duplicates = compose_unique(text)

    def pair(self, path):
        """``(key_node, value_node)`` at ``path`` (key_node ``None`` for list items)."""
        key_node, node = None, self.root
        for key in path:
            if node is None:
                return None, None
            found = None, None
            if node.tag.endswith(":seq") and isinstance(node.value, list):
                if isinstance(key, int) and key < len(node.value):
                    found = None, node.value[key]
            elif isinstance(node.value, list):  # a mapping: the last of repeated keys wins
                for k, v in node.value:
                    if getattr(k, "value", None) == key:
                        found = k, v
                if found == (None, None) and isinstance(key, int) and key < len(node.value):
                    found = node.value[key]  # a named list written as a mapping, by position
            key_node, node = found
        return key_node, node

    def node(self, path):
        return self.pair(path)[1]

    def where_key(self, path) -> tuple[int, int]:
        """line:column of the key at ``path`` (of its value when it has no key node)."""
        key_node, _ = self.pair(path)
        if key_node is None:
            return self.where(path)
        return key_node.start_mark.line + 1, key_node.start_mark.column + 1

    def where(self, path, column_in_value: int | None = None) -> tuple[int, int]:
        node = self.node(path)
        while node is None and path:
            path = path[:-1]
            node = self.node(path)
        if node is None:
            return 1, 1
        line, col = node.start_mark.line + 1, node.start_mark.column + 1
        if column_in_value and getattr(node, "style", None) in (None, "", '"', "'"):
            if getattr(node, "style", None) in ('"', "'"):
                col += 1
            if node.start_mark.line == node.end_mark.line:
                col += column_in_value - 1
        return line, col


def _rule_entries(rules, base):
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


def _build(kind, value, extra):
    from expr_tracker.alerts import RuleError, make_rule

    if kind == "bad":
        raise RuleError(f"a rule is a string or a mapping, got {type(value).__name__}")
    return make_rule(value, **extra)


def _cond_path(path, kind):
    return (*path, "condition") if kind == "dict" else path


DEFAULT_ALERT_WINDOW = 4096


def _alert_window(data) -> int:
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
        doc = _Located(text)
    except Exception as exc:  # yaml.YAMLError carries a mark
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem("errors", line, col, f"invalid YAML: {getattr(exc, 'problem', exc)}")
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
        window = _alert_window(data)
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
    """Compile every rule of an alerts ``section`` (``doc``: a ``_Located`` document, the
    section at ``base`` in it) as the engine would: ``(problems, number of valid rules)``.

    Each problem is ``{"severity": "errors"|"warnings", "line", "column", "message",
    "path"}`` with ``path`` the tuple of keys at fault in the document. Shared by
    ``et rules check``, ``et rules test`` (inline rules) and ``et config validate``."""
    from expr_tracker.alerts import RuleError, compile_expr
    from expr_tracker.alerts.rules import entry_errors
    from expr_tracker.cli.appconfig import interpolated_leaves, interpolation_note

    problems: list[dict] = []
    count = 0

    def problem(severity, path, where, message):
        line, col = where
        problems.append(
            {"severity": severity, "line": line, "column": col, "message": message, "path": path}
        )

    names: dict[str, tuple[int, int]] = {}
    rules = section.get("rules") if isinstance(section, dict) else None
    for rpath, (kind, value, extra), named in _rule_entries(rules, (*base, "rules")):
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
                problem("errors", path, where, _one_line(exc))
            if errors:
                continue
        try:
            rule = _build(kind, value, extra)
            compile_expr(rule.condition, window=window, text=rule.source, known_metrics=known)
        except RuleError as exc:
            path = _cond_path(rpath, kind)
            problem("errors", path, doc.where(path, getattr(exc, "column", None)), _one_line(exc))
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
        for w in _lint(rule):
            path = _cond_path(rpath, kind)
            problem("warnings", path, doc.where(path), w)
    return problems, count


_FIELDS = frozenset(
    (
        "name condition expr level title message mode for_steps cooldown max_fires "
        "notify_recovery channels tags enabled"
    ).split()
)


def _one_line(exc) -> str:
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


def cmd_check(args) -> int:
    known = None
    if args.run:
        try:
            rows = read_metrics(args.run)
        except OSError as exc:
            sys.stderr.write(f"et rules check: cannot read run {args.run}: {exc}\n")
            return EXIT_USAGE
        known = {k for row in rows for k in row if not k.startswith("_")}
    results = [check_file(f, known, appconfig.package_of(f, args.package)) for f in args.files]
    failed = any(r["errors"] for r in results)
    warned = any(r["warnings"] for r in results)
    code = EXIT_INVALID if failed else (EXIT_LINT if warned and args.lint_fatal else EXIT_OK)
    if output.is_machine(args.format):
        output.write_records(results, args.format)  # the exit code says the rest
        return code
    for r in results:
        head = f"Checking {r['file']}"
        if r["errors"]:
            _out(f"{head}\n  FAILED:")
            for e in r["errors"]:
                _out(f"    {r['file']}:{e['line']}:{e['column']}: {e['message']}")
        else:
            _out(f"{head}\n  SUCCESS: {r['rules']} rules found")
        for w in r["warnings"]:
            _out(f"    {r['file']}:{w['line']}:{w['column']}: WARNING: {w['message']}")
    return code


# -- reading recorded history -----------------------------------------------------------------


def _metrics_file(run: str) -> Path:
    path = Path(run)
    if path.is_dir():
        candidate = path / "metrics.jsonl"
        if candidate.exists():
            return candidate
        found = sorted(path.glob("metrics*.jsonl"))
        if found:
            return found[0]
        raise FileNotFoundError(f"no metrics*.jsonl in {path}")
    if not path.exists():
        raise FileNotFoundError(f"no such run directory or file: {path}")
    return path


def read_metrics(run: str) -> list[dict]:
    """Rows of a run's ``metrics.jsonl`` in file order, patch lines merged by ``_step``.

    Tolerates ``NaN``/``Infinity`` (stdlib fallback) and a torn or garbled line (skipped).
    Raises ``OSError`` (``FileNotFoundError``) when there is no metrics file.
    """
    try:
        import orjson

        fast = orjson.loads
    except ImportError:  # pragma: no cover
        fast = json.loads
    rows: list[dict] = []
    by_step: dict = {}
    with open(_metrics_file(run), "rb") as fh:
        for raw in fh:
            raw = raw.strip()
            if not raw:
                continue
            try:
                row = fast(raw)
            except Exception:
                try:
                    row = json.loads(raw)
                except Exception:
                    continue  # a torn line
            if not isinstance(row, dict):
                continue
            step = row.get("_step")
            if step is not None and step in by_step:
                by_step[step].update({k: v for k, v in row.items() if k != "_time"})
                continue
            if step is not None:
                by_step[step] = row
            rows.append(row)
    return rows


# -- test -------------------------------------------------------------------------------------


def _looks_like_file(target: str) -> bool:
    """A rules or test file name (not a rule): ends in .yaml, .yml or .json."""
    return Path(target).suffix.lower() in (".yaml", ".yml", ".json")


def _rules_from(target: str) -> list:
    """A rule string, or every rule of a rules file (same shapes as ``check``)."""
    from expr_tracker.alerts import RuleError

    path = Path(target)
    if not _looks_like_file(target):
        from expr_tracker.alerts import make_rule

        return [make_rule(target)]
    result = check_file(str(path))
    if result["errors"]:
        e = result["errors"][0]
        raise RuleError(f"{path}:{e['line']}:{e['column']}: {e['message']}")
    data = _Located(path.read_text(encoding="utf-8")).data
    section = data.get("alerts", data) if isinstance(data, dict) else {}
    base = ("rules",)
    return [_build(k, v, x) for _, (k, v, x), _ in _rule_entries(section.get("rules"), base)]


def cmd_test(args) -> int:
    from expr_tracker.alerts import RuleError

    path = Path(args.target)
    if _looks_like_file(args.target) and not path.is_file():
        why = "is a directory" if path.is_dir() else "no such file"
        sys.stderr.write(f"et rules test: {args.target}: {why}\n")
        return EXIT_USAGE
    if args.run is None:
        if path.suffix in (".yaml", ".yml"):
            return _unit_tests(path, args)
        sys.stderr.write(
            "et rules test: a rule needs --run DIR to replay it over; "
            "without --run give a unit-test file (.yaml)\n"
        )
        return EXIT_USAGE
    try:
        rows = read_metrics(args.run)
    except OSError as exc:
        sys.stderr.write(f"et rules test: {exc}\n")
        return EXIT_USAGE
    known = {k for row in rows for k in row if not k.startswith("_")}
    try:
        rules = _rules_from(args.target)
        from expr_tracker.alerts import compile_expr

        for rule in rules:
            compile_expr(rule.condition, text=rule.source, known_metrics=known)
    except RuleError as exc:
        _out(f"FAILED: {exc}")
        return EXIT_INVALID
    if args.n is not None:
        if args.n < 1:
            sys.stderr.write("et rules test: -n must be >= 1\n")
            return EXIT_USAGE
        rows = rows[-args.n :]
    from expr_tracker.alerts.testing import replay

    cap = replay(rules, rows)
    fired = cap.fired()
    if output.is_machine(args.format):
        firings = [
            {"step": e.step, "rule": e.rule.name, "level": e.level, "message": e.message}
            for e in fired
        ]
        output.write_records(firings, args.format)
        return EXIT_OK
    for e in fired:
        _out(f"step {e.step}: [{e.level}] {e.rule.name}: {e.message}")
    _out(f"{len(fired)} firing(s) over {len(rows)} steps of {_metrics_file(args.run)}")
    return EXIT_OK


_NUM = r"[-+]?(?:nan|inf|\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"
_REPEAT = re.compile(rf"^(?P<a>{_NUM}|_)(?:(?P<sign>[-+])(?P<b>{_NUM}))?x(?P<n>\d+)$", re.I)


def expand_series(text) -> list[float | None]:
    """promtool series notation -> values (``None`` = no sample that step).

    ``"1 1 9"``; ``"0+1x3"`` -> 0 1 2 3 (n + 1 values); ``"5x2"`` -> 5 5 5; ``"1-1x2"``
    -> 1 0 -1; ``"_"`` one missing sample, ``"_x3"`` three; ``nan``, ``inf``, ``-inf``.
    Raises ``ValueError`` on anything else.
    """
    if isinstance(text, (int, float)):
        return [float(text)]
    if isinstance(text, list):
        return [None if v is None or v == "_" else float(v) for v in text]
    out: list[float | None] = []
    for token in str(text).split():
        if token == "_":
            out.append(None)
            continue
        m = _REPEAT.match(token)
        if m:
            n = int(m.group("n"))
            if m.group("a") == "_":
                if m.group("b"):
                    raise ValueError(f"'{token}': a missing sample cannot increase")
                out.extend([None] * n)
                continue
            a = float(m.group("a"))
            b = float(m.group("b") or 0.0) * (-1.0 if m.group("sign") == "-" else 1.0)
            out.extend(a + i * b for i in range(n + 1))
            continue
        if re.fullmatch(_NUM, token, re.I):
            out.append(float(token))
            continue
        raise ValueError(f"bad series value {token!r} (numbers, nan, inf, _, a+bxN, axN)")
    return out


def _seconds(value, default: float) -> float:
    from expr_tracker.alerts.rules import _seconds as parse

    return default if value is None else parse(value, "interval")


#: Keys of a unit-test file, of one test, and of one expected alert (aliases included).
_TEST_FILE_KEYS = ("rule_files", "rules", "interval", "evaluation_interval", "tests")
_TEST_KEYS = ("name", "interval", "input_series", "expected_alerts", "alerts")
_EXPECT_KEYS = ("rule", "alertname", "name", "steps", "step")


def _unknown_keys(doc, mapping, path, valid, what):
    """``(line, column, message)`` for each key of ``mapping`` not in ``valid``, at the key,
    with the closest valid key suggested."""
    import difflib

    out = []
    for key in mapping:
        if key in valid:
            continue
        close = difflib.get_close_matches(str(key), valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        message = f"unknown key {key!r} in {what}{hint}; valid: {', '.join(valid)}"
        out.append((*doc.where_key((*path, key)), message))
    return out


def _steps(exp) -> list[int]:
    """The steps of an expectation (``steps: [..]`` or ``step: N``); ValueError otherwise."""
    raw = exp.get("steps") if "steps" in exp else ([exp["step"]] if "step" in exp else [])
    if raw is None:
        raw = []
    if not isinstance(raw, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in raw
    ):
        raise ValueError(f"steps must be a list of step numbers (integers >= 0), got {raw!r}")
    return sorted(raw)


def _load_unit_file(path: Path):
    """Read and check a unit-test file without running it: ``(doc, rules, errors,
    warnings)``; problems are ``(line, column, message)`` in the test file, or a preformatted
    ``file:line:column: message`` string for problems inside a rule file."""
    from expr_tracker.alerts import RuleError
    from expr_tracker.spec.yaml import duplicate_key_message

    errors: list = []
    warnings: list = []
    rules: list = []
    doc = _Located(path.read_text(encoding="utf-8"))
    for key, mark, first in doc.duplicates:
        errors.append((mark.line + 1, mark.column + 1, duplicate_key_message(key, first)))
    spec = doc.data if doc.data is not None else {}
    if not isinstance(spec, dict):
        errors.append((1, 1, "a test file is a mapping with 'tests:' (a list)"))
        return doc, rules, errors, warnings
    errors += _unknown_keys(doc, spec, (), _TEST_FILE_KEYS, "a test file")
    if not isinstance(spec.get("tests"), list):
        errors.append((*doc.where(("tests",)), "a test file needs 'tests:' (a list)"))
    # rule files, relative to the test file; a file that cannot be read is an error
    files = spec.get("rule_files")
    if isinstance(files, str):
        files = [files]
        entries = [(("rule_files",), files[0])]
    elif isinstance(files, list):
        entries = [(("rule_files", i), name) for i, name in enumerate(files)]
    elif files is None:
        entries = []
    else:
        errors.append((*doc.where(("rule_files",)), "rule_files must be a list of file names"))
        entries = []
    for where_path, name in entries:
        label = "rule_files" if len(where_path) == 1 else f"rule_files[{where_path[1]}]"
        if not isinstance(name, str) or not name:
            errors.append((*doc.where(where_path), f"{label}: a file name, got {name!r}"))
            continue
        rule_file = path.parent / name
        if not rule_file.is_file():
            why = "is a directory" if rule_file.is_dir() else "file not found"
            errors.append((*doc.where(where_path), f"{label}: cannot read {name}: {why}"))
            continue
        checked = check_file(str(rule_file))
        if checked["errors"]:
            errors += [
                f"{rule_file}:{e['line']}:{e['column']}: {e['message']}" for e in checked["errors"]
            ]
            continue
        rules += _rules_from(str(rule_file))
    # inline rules: the same checks as `et rules check`, located in the test file
    if spec.get("rules") is not None:
        problems, _ = rule_problems(doc, spec)
        bad = [p for p in problems if p["severity"] == "errors"]
        errors += [(p["line"], p["column"], p["message"]) for p in bad]
        if not bad:
            rules += [
                _build(k, v, x) for _, (k, v, x), _ in _rule_entries(spec["rules"], ("rules",))
            ]
    for key in ("interval", "evaluation_interval"):
        try:
            _seconds(spec.get(key), 1.0)
        except RuleError as exc:
            errors.append((*doc.where((key,)), _one_line(exc)))
    # each test: known keys, and expectations that can be checked
    names = [r.name for r in rules]
    for i, test in enumerate(spec.get("tests") if isinstance(spec.get("tests"), list) else []):
        where = ("tests", i)
        if not isinstance(test, dict):
            errors.append((*doc.where(where), f"test #{i + 1} must be a mapping"))
            continue
        errors += _unknown_keys(doc, test, where, _TEST_KEYS, "a test")
        key = "expected_alerts" if "expected_alerts" in test else "alerts"
        expected = test.get(key)
        if not expected:
            label = test.get("name") or f"test #{i + 1}"
            warnings.append(
                (
                    *doc.where(where),
                    f"{label}: no expected_alerts: the test checks nothing "
                    "(list {rule: NAME, steps: []} to expect a rule quiet)",
                )
            )
            continue
        if not isinstance(expected, list):
            errors.append((*doc.where((*where, key)), f"{key} must be a list"))
            continue
        for j, exp in enumerate(expected):
            epath = (*where, key, j)
            if not isinstance(exp, dict):
                errors.append(
                    (*doc.where(epath), "an expected alert is {rule: NAME, steps: [...]}")
                )
                continue
            errors += _unknown_keys(doc, exp, epath, _EXPECT_KEYS, "an expected alert")
            rname = exp.get("rule") or exp.get("alertname") or exp.get("name")
            if not rname:
                errors.append((*doc.where(epath), "an expected alert needs 'rule: NAME'"))
            elif rules and rname not in names:
                import difflib

                close = difflib.get_close_matches(str(rname), names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                key = next(k for k in ("rule", "alertname", "name") if exp.get(k))
                errors.append(
                    (
                        *doc.where((*epath, key)),
                        f"no rule named {rname!r}{hint}; the rules: {', '.join(names)}",
                    )
                )
            try:
                _steps(exp)
            except ValueError as exc:
                errors.append(
                    (*doc.where((*epath, "steps" if "steps" in exp else "step")), str(exc))
                )
    return doc, rules, errors, warnings


def _unit_tests(path: Path, args) -> int:
    """Run a rule unit-test file; exit 1 with a diff when an expectation is not met, and
    without running anything when the file itself is invalid (unknown keys, a rule file
    that cannot be read, invalid rules)."""
    import yaml

    from expr_tracker.alerts import RuleError
    from expr_tracker.alerts.testing import replay, rows_from_series

    def at(problem) -> str:
        if isinstance(problem, str):
            return problem
        line, col, message = problem
        return f"{path}:{line}:{col}: {message}"

    fmt = getattr(args, "format", "text")

    def result(failures: list[str], warned: list, tests: int | None = None) -> int:
        """The outcome: a record (json/jsonl: one per file, as ``check``) or text lines."""
        warn = [f"{path}:{line}:{col}: {message}" for line, col, message in warned]
        if output.is_machine(fmt):
            status = "FAILED" if failures else "SUCCESS"
            record = {"file": str(path), "status": status, "tests": tests}
            output.write_records([{**record, "failures": failures, "warnings": warn}], fmt)
        elif failures:
            _out(f"{path}: FAILED:")
            for f in failures:
                _out("  " + f.replace("\n", "\n  "))
        else:
            _out(f"{path}: SUCCESS: {tests} tests passed")
        if not output.is_machine(fmt):
            for line, col, message in warned:
                _out(f"  {path}:{line}:{col}: WARNING: {message}")
        return EXIT_INVALID if failures else EXIT_OK

    try:
        doc, rules, errors, warnings = _load_unit_file(path)
    except OSError as exc:
        return result([f"cannot read: {exc.strerror or exc}"], [])
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        return result([f"{where}: invalid YAML: {getattr(exc, 'problem', None) or exc}"], [])
    if not errors and not rules:
        errors.append(f"{path}: no rules (give rule_files or rules)")
    if errors:
        return result([at(e) for e in errors], warnings)
    spec = doc.data
    default_interval = _seconds(spec.get("evaluation_interval", spec.get("interval")), 1.0)
    by_name = {r.name: r for r in rules}
    failures: list[str] = []
    for i, test in enumerate(spec["tests"]):
        label = test.get("name") or f"test #{i + 1}"
        try:
            interval = _seconds(test.get("interval"), default_interval)
            series = {k: expand_series(v) for k, v in (test.get("input_series") or {}).items()}
        except (ValueError, RuleError) as exc:
            failures.append(f"{label}: {exc}")
            continue
        cap = replay(rules, rows_from_series(series, interval=interval))
        expected = test.get("expected_alerts", test.get("alerts")) or []
        for exp in expected:
            rname = exp.get("rule") or exp.get("alertname") or exp.get("name")
            if rname not in by_name:
                failures.append(f"{label}: no rule named {rname!r} (have: {', '.join(by_name)})")
                continue
            want = _steps(exp)
            got = sorted(e.step for e in cap.fired() if e.rule.name == rname and e.notify)
            if want != got:
                diff = [f"{label}: rule {rname!r}"]
                diff += [f"  - expected firing at step {s}" for s in want if s not in got]
                diff += [f"  + got firing at step {s}" for s in got if s not in want]
                if not want:
                    diff.insert(1, "  expected quiet")
                failures.append("\n".join(diff))
    return result(failures, warnings, len(spec["tests"]))
