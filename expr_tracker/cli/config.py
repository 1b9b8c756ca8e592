"""``et config``: check spec files, show the resolved spec, render the configuration reference.

- ``et config validate FILE...`` — each file on its own (a run spec, or an alerts file, told
  apart by its keys or ``--kind``): ``SUCCESS: FILE`` or ``FAILED: FILE`` followed by every
  problem as ``file:line:column: path: ...``. Exit 0 when every file is valid, 1 otherwise.
- ``et config show [FILE] [--overrides k=v ...]`` — the spec a run would get (defaults <
  environment < ``ET_ALERT_CONFIG`` < ``ET_CONFIG`` < FILE < overrides), one row per value
  with its source (``default``, ``env VAR``, ``ET_ALERT_CONFIG``, ``ET_CONFIG``, ``file``,
  ``override``) and, for a value read from a file, ``file:line:column``; secrets are ``***``.
  ``--format json`` prints the same as one JSON array, ``--format jsonl`` one object per line.
- ``et config reference [-o FILE] [--check]`` — the Markdown configuration reference
  (``docs/configuration.md``), generated from the models so it cannot drift.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from expr_tracker.cli import appconfig, output

# ------------------------------------------------------------------ parser


def register(subparsers: Any) -> None:
    """Add the ``config`` command group to ``subparsers`` (sets ``func`` on each verb)."""
    p = subparsers.add_parser(
        "config",
        help="validate spec files, show the resolved spec, print the configuration reference",
        description="Run spec tooling: validate, show, reference.",
    )
    verbs = p.add_subparsers(dest="config_command", metavar="VERB")
    p.set_defaults(func=lambda args: _usage(p))

    v = verbs.add_parser(
        "validate",
        help="check spec files (exit 1 on any problem)",
        description=(
            "Validate each file on its own: a run spec (YAML, JSON or TOML) or an alerts file. "
            "Problems are printed as file:line:column: path: message."
        ),
    )
    v.add_argument("files", nargs="+", metavar="FILE")
    v.add_argument(
        "--kind",
        choices=("auto", "run", "alerts"),
        default="auto",
        help="run: a whole run spec; alerts: an alerts file; auto (default): by its keys",
    )
    appconfig.add_package_option(v)
    v.set_defaults(func=cmd_validate)

    s = verbs.add_parser(
        "show",
        help="print the resolved spec with the source of every value",
        description=(
            "Resolve the spec as et.init(spec=FILE) would, with ET_CONFIG, ET_ALERT_CONFIG and "
            "the webhook environment variables applied, then --overrides on top. Secrets are "
            "shown as ***."
        ),
    )
    s.add_argument("file", nargs="?", default=None, metavar="FILE")
    s.add_argument(
        "--overrides",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="dotted spec paths (history.buffer.size=100) or et.init keyword names "
        "(buffer_size=100); values are read as YAML",
    )
    appconfig.add_package_option(s)
    output.add_format_option(s, "table", what="{path, value, source, location}")
    s.add_argument(
        "--width",
        type=int,
        default=None,
        help="table width (default: the terminal's; piped: $COLUMNS or 200, as et history)",
    )
    s.set_defaults(func=cmd_show)

    r = verbs.add_parser(
        "reference",
        help="print the configuration reference (Markdown), generated from the models",
        description=(
            "Print the Markdown configuration reference (every run-spec field with its type, "
            "default and description), generated from the models so it cannot drift; "
            "-o FILE writes it to FILE; -o FILE --check exits 1 when FILE is stale and writes "
            "nothing."
        ),
    )
    r.add_argument("-o", "--output", default=None, metavar="FILE", help="write FILE instead")
    r.add_argument(
        "--check", action="store_true", help="with -o: exit 1 if FILE differs (write nothing)"
    )
    r.set_defaults(func=cmd_reference)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


# ------------------------------------------------------------------ validate


def detect_kind(path: str | Path, package: str | None = None) -> str:
    """``"alerts"`` when the file's top-level keys (of its ``package`` section, when given)
    are all alerts-section keys (``rules``, ``channels``, ``policy`` ...) and not run-spec
    keys, else ``"run"`` (also when the file cannot be read: validation then reports why)."""
    from expr_tracker.spec import AlertsSpec, RunSpec, SpecError, load_file

    try:
        data, _ = load_file(path, package=package)
    except SpecError:
        return "run"
    keys = set(data)
    if keys and keys <= set(AlertsSpec.model_fields) and not keys <= set(RunSpec.model_fields):
        return "alerts"
    return "run"


def cmd_validate(args: argparse.Namespace) -> int:
    """Exit codes: 0 every file valid, 1 any problem (including a missing file)."""
    failed = 0
    for file in args.files:
        package = appconfig.package_of(file, args.package)
        kind = detect_kind(file, package) if args.kind == "auto" else args.kind
        issues = file_issues(file, kind, package=package)
        # a value holding ${...} (a Hydra group file) is not checked: a warning at its path
        # says so instead of the errors its literal ${...} text makes (see appconfig)
        notes, unchecked = interpolation_issues(file, kind, package)
        issues = [i for i in issues if not _under(i.path, unchecked)]
        if not issues:
            print(
                f"SUCCESS: {file} ({kind} spec)" if kind == "run" else f"SUCCESS: {file} (alerts)"
            )
        else:
            failed += 1
            print(f"FAILED: {file}")
        for issue in issues:
            print(f"  {_issue_line(issue, file)}")
        for note in notes:
            print(f"  warning: {_issue_line(note, file)}")
    return 1 if failed else 0


def _issue_line(issue: Any, file: str) -> str:
    if issue.source == f"file:{file}":
        issue = replace(issue, source=None)  # the line names the file already
    text = issue.format()
    return text if issue.location is not None else f"{file}: {text}"


def _under(path: str, roots: set[str]) -> bool:
    """``path`` is one of ``roots`` or inside one."""
    return any(path == r or path.startswith((r + ".", r + "[")) for r in roots)


def interpolation_issues(file: str, kind: str, package: str | None = None) -> tuple[list, set[str]]:
    """A ``SpecIssue`` (at the value's spec path and ``file:line:column``) for every value of
    ``file`` holding an OmegaConf interpolation ``${...}``, which only Hydra's composition
    resolves; and the spec paths left unchecked for it: the value, or for a rule the whole
    rule (``alerts.rules.NAME``), whose problems are artifacts of the literal ``${...}``."""
    from expr_tracker.spec import SpecIssue
    from expr_tracker.spec.yaml import interpolated_leaves, interpolation_note

    doc, data, prefix = _section(file, package)
    if data is None:
        return [], set()
    wrapped = not (kind == "run" or isinstance(data.get("alerts"), dict))
    spec_data = {"alerts": data} if wrapped else data
    notes, unchecked = [], set()
    for parts, text in interpolated_leaves(spec_data):
        path = _dotted(parts, spec_data)
        root = parts[:3] if parts[:2] == ("alerts", "rules") and len(parts) > 2 else parts
        unchecked.add(_dotted(root, spec_data))
        location = None
        if doc is not None:
            line, column = doc.where((*prefix, *(parts[1:] if wrapped else parts)))
            location = (file, line, column)
        notes.append(SpecIssue(path, interpolation_note(text), location=location))
    return notes, unchecked


def file_issues(file: str, kind: str, environ: Any = None, package: str | None = None) -> list:
    """Every problem ``et.init(spec=file)`` would raise for ``file`` (an alerts file: as the
    ``alerts`` section of a run spec), from the same checks: the schema, then
    ``build.check`` (span plugins and their options, rules, channels with their options and
    URLs; ``url_env``/``*_env`` variables read from ``environ``, default ``os.environ``);
    ``package`` is the dotted section of a Hydra app's config holding the spec.
    Rule problems are shown as ``et rules check`` shows them (the column of the error in the
    file); with a schema error, rules are still compiled so every problem shows at once."""
    import os

    from expr_tracker.build import check
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


def rule_issues(file: str, kind: str, found: list, package: str | None = None) -> list:
    """Compile the alert rules of ``file`` as ``et.init`` would, with the checks of
    ``et rules check`` (``alerts.rulefiles.rule_problems``): a ``SpecIssue`` per error, at its
    ``file:line:column`` with its spec path (``alerts.rules.bad.condition``). Problems at a
    path that ``found`` (the spec validation's issues) already reports are left out, and so
    is everything when the file could not be read."""
    from expr_tracker.alerts.rulefiles import DEFAULT_ALERT_WINDOW, alert_window, rule_problems
    from expr_tracker.spec import SpecIssue

    if any(not issue.path or issue.path == "alerts" for issue in found):
        return []  # unreadable, not a mapping, duplicate keys, or a bad alerts section
    doc, data, prefix = _section(file, package)
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
        path = _dotted(parts, data if len(base) > len(prefix) else {"alerts": data})
        if path in reported or any(r.startswith((path + ".", path + "[")) for r in reported):
            continue
        location = (file, p["line"], p["column"]) if doc is not None else None
        out.append(SpecIssue(path, p["message"], location=location))
    return out


def _section(file: str, package: str | None) -> tuple[Any, dict | None, tuple]:
    """``(located document or None for TOML, the spec's mapping in it, its key path)`` for
    ``file`` and its dotted ``package``; the mapping is None when the file cannot be read
    or the section is not a mapping (the spec validation says why)."""
    from expr_tracker.spec import load_file
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


class _Unlocated:
    """Stands in for a located document (TOML): no line or column for anything."""

    def where(self, *args: Any) -> tuple[None, None]:
        return None, None

    where_key = where


def _dotted(parts: tuple, data: Any) -> str:
    """The spec path of document keys ``parts``: list items of named lists by entry name."""
    from expr_tracker.spec.errors import join_path
    from expr_tracker.spec.merge import item_key

    path, node = "", data
    for part in parts:
        if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            key, node = item_key(path, node[part], part), node[part]
        else:
            key, node = part, node.get(part) if isinstance(node, dict) else None
        path = join_path(path, key)
    return path


# ------------------------------------------------------------------ show


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["history.buffer.size=100", "buffer_size=10"]`` -> ``et.init``-style keyword dict.

    A dotted key becomes nested mappings under its first part (a RunSpec field); a plain key
    is kept as is (an ``et.init`` keyword such as ``buffer_size``). Values are parsed as YAML
    scalars (``100`` -> 100, ``null`` -> None, ``[a, b]`` -> a list).

    Raises:
        ValueError: an item without ``=`` or with an empty key.
    """
    import yaml

    from expr_tracker.spec import merge

    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"override {item!r} is not KEY=VALUE")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        parts = key.split(".")
        nested: Any = value
        for part in reversed(parts[1:]):
            nested = {part: nested}
        out = merge(out, {parts[0]: nested})
    return out


def describe(source: str) -> str:
    """Short source label for ``et config show``: ``default``, ``env VAR``, ``ET_CONFIG``,
    ``ET_ALERT_CONFIG``, ``file``, ``override`` (the location column names the file)."""
    kind, _, rest = source.partition(":")
    if source == "init":
        return "override"
    if kind == "env":
        return f"env {rest}"
    return kind


def _as_override(exc: Any) -> Any:
    """A ``SpecError`` from the ``--overrides`` values (``et.init`` keywords to ``resolve``)
    worded for the command line: their source is ``override``."""
    from expr_tracker.spec import SpecError

    issues = []
    for issue in exc.issues:
        if issue.source == "init":
            message = issue.message
            if message == "unknown keyword argument of et.init()":
                message = "unknown override key (a dotted spec path or an et.init keyword)"
            issue = replace(issue, source="override", message=message, location=None)
        issues.append(issue)
    title = exc.title
    if title == "invalid et.init() arguments":
        title = "invalid --overrides"
    return SpecError(issues, title=title)


def show_rows(
    file: str | None, overrides: list[str], package: str | None = None
) -> list[tuple[str, Any, str, str]]:
    """``(path, redacted value, source label, location)`` for every spec leaf; the location
    is ``file:line:col`` (``file`` alone when the file has no line numbers, as TOML) for a
    value read from a file, else empty.

    Raises:
        SpecError: the file, an environment source or an override is invalid.
        ValueError: a malformed override.
    """
    from expr_tracker.spec import SpecError, resolve
    from expr_tracker.spec.sources import file_layer

    kwargs = parse_overrides(overrides)
    try:
        spec = file_layer(file, "run", package) if file and package else file
        resolved = resolve(spec, kwargs=kwargs or None)
    except SpecError as exc:
        raise _as_override(exc) from None
    rows = []
    for path, value, source, location in resolved.rows():
        kind, _, origin = source.partition(":")
        where = ""
        if kind in ("ET_CONFIG", "ET_ALERT_CONFIG", "file") and origin:
            where = origin
            if location and location[0] == origin:
                where = f"{origin}:{location[1]}:{location[2]}"
        rows.append((path, value, describe(source), where))
    return rows


def render_table(rows: list[tuple[str, Any, str, str]]) -> Any:
    """A rich ``Table`` of ``show_rows`` output (path, value, source, location)."""
    from rich.table import Table

    table = Table(title="resolved run spec", show_lines=False, expand=False)
    table.add_column("path", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("source", overflow="fold")
    table.add_column("location", overflow="fold")
    for path, value, source, where in rows:
        shown = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
        style = "dim" if source == "default" else None
        table.add_row(path, shown, source, where, style=style)
    return table


def cmd_show(args: argparse.Namespace) -> int:
    """Exit codes: 0 shown, 1 the spec is invalid, 2 a malformed override."""
    from expr_tracker.spec import SpecError

    try:
        package = appconfig.package_of(args.file, args.package) if args.file else None
        rows = show_rows(args.file, args.overrides, package)
    except ValueError as exc:
        if isinstance(exc, SpecError):
            print(f"et config show: {exc}", file=sys.stderr)
            return 1
        print(f"et config show: {exc}", file=sys.stderr)
        return 2
    if output.is_machine(args.format):
        data = [{"path": p, "value": v, "source": s, "location": w or None} for p, v, s, w in rows]
        output.write_records(data, args.format)
        return 0
    from expr_tracker.cli.history import table_width

    # piped: $COLUMNS or 200 columns, as et history and et runs (rich alone would use 80)
    console = output.console(width=table_width(sys.stdout, args.width), highlight=True)
    console.print(render_table(rows))
    return 0


# ------------------------------------------------------------------ reference


def cmd_reference(args: argparse.Namespace) -> int:
    """Exit codes: 0 printed/written/up to date, 1 stale (``--check``) or not writable,
    2 ``--check`` without ``--output``."""
    from expr_tracker.spec.reference import reference_markdown

    text = reference_markdown()
    if args.output is None:
        if args.check:
            print("et config reference: --check needs --output FILE", file=sys.stderr)
            return 2
        sys.stdout.write(text)
        return 0
    path = Path(args.output)
    if args.check:
        try:
            current = path.read_text(encoding="utf-8")
        except OSError:
            current = None
        if current != text:
            print(
                f"stale: {path}; run `et config reference -o {path}` to regenerate",
                file=sys.stderr,
            )
            return 1
        print(f"up to date: {path}")
        return 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"et config reference: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0
