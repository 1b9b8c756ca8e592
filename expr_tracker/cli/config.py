"""``et config``: check spec files, show the resolved spec, render the configuration reference.

- ``et config validate FILE...`` — each file on its own (a run spec, or an alerts file, told
  apart by its keys or ``--kind``): ``SUCCESS: FILE`` or ``FAILED: FILE`` followed by every
  problem as ``file:line:column: path: ...``. Exit 0 when every file is valid, 1 otherwise.
- ``et config show [FILE] [--overrides k=v ...]`` — the spec a run would get (defaults <
  environment < ``ET_ALERT_CONFIG`` < ``ET_CONFIG`` < FILE < overrides), one row per value
  with its source (``default``, ``env VAR``, ``ET_ALERT_CONFIG``, ``ET_CONFIG``, ``file``,
  ``override``) and, for a value read from a file, ``file:line:column``; secrets are ``***``.
  ``--format json`` prints the same as one JSON array, ``--format jsonl`` one object per line.
- ``et config run RUN [--baseline OTHER] [--all] [--dir DIR]`` — a run's config: the keys
  that are not defaults (a Hydra job's: the keys its overrides set; other runs: every key;
  ``--all`` every key), and with ``--baseline`` the baseline run's values beside them, only
  the keys that differ unless ``--all`` (``query/configview.py``). Exit 0, 1 no such run.
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

    c = verbs.add_parser(
        "run",
        help="a run's config: defaults hidden, differences to a --baseline run",
        description=(
            "Show a run's config. Defaults are hidden where they are known (a Hydra job: the "
            "keys no override set); with --baseline OTHER only the keys whose values differ "
            "from OTHER's are listed, both values side by side. --all shows every key."
        ),
    )
    c.add_argument("run", metavar="RUN", help="a run directory, or project/name or name")
    c.add_argument("--baseline", default=None, metavar="OTHER", help="a run to diff against")
    c.add_argument("--all", action="store_true", help="every key (defaults, equal values)")
    c.add_argument("--dir", default="runs", help="where names are looked up (default ./runs)")
    output.add_format_option(c, "table", what="{key, value, default, baseline, differs}")
    c.set_defaults(func=cmd_run)

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


def cmd_validate(args: argparse.Namespace) -> int:
    """Exit codes: 0 every file valid, 1 any problem (including a missing file)."""
    from expr_tracker.assemble.check import check_file
    from expr_tracker.spec.resolve import detect_kind, interpolation_issues

    failed = 0
    for file in args.files:
        package = appconfig.package_of(file, args.package)
        kind = detect_kind(file, package) if args.kind == "auto" else args.kind
        issues = check_file(file, kind, package=package)
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


def source_label(source: str) -> str:
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
        rows.append((path, value, source_label(source), where))
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


# ------------------------------------------------------------------ run


def shown_config_rows(view: dict, show_all: bool) -> list[dict]:
    """The rows of a :func:`~expr_tracker.query.configview.config_view` a reader sees: all
    with ``show_all``; else with a baseline the keys that differ (the baseline's own keys
    too, ``value`` missing), without one the keys that are not defaults."""
    rows = list(view["rows"])
    if view["baseline"]:
        rows += [
            {"key": r["key"], "value": None, "missing": True, "default": None,
             "baseline": r["baseline"], "in_baseline": True, "differs": True}
            for r in view["only_in_baseline"]
        ]  # fmt: skip
        return rows if show_all else [r for r in rows if r["differs"]]
    return rows if show_all else [r for r in rows if r["default"] is not True]


def cmd_run(args: argparse.Namespace) -> int:
    """Exit codes: 0 shown, 1 no such run (or a name that names several)."""
    from expr_tracker.history.values import json_safe
    from expr_tracker.query.compare import CompareError, run_config_view

    try:
        view = run_config_view(args.run, args.baseline, root=args.dir)
    except CompareError as exc:
        print(f"et config run: {exc}", file=sys.stderr)
        return 1
    for w in view["warnings"]:
        print(f"et config run: warning: {w}", file=sys.stderr)
    rows = shown_config_rows(view, args.all)
    hidden = len(view["rows"]) + len(view["only_in_baseline"]) - len(rows)
    if output.is_machine(args.format):
        keep = ("key", "value", "default", "baseline", "differs")
        data = [{k: r.get(k) for k in keep if k != "baseline" or view["baseline"]} for r in rows]
        output.write_records(json_safe(data, "null"), args.format)
        return 0
    from rich.table import Table

    from expr_tracker.cli.history import table_width

    title = f"config of {view['run']}"
    if view["baseline_run"]:
        title += f" against {view['baseline_run']}"
    table = Table(title=title, expand=False)
    table.add_column("key", no_wrap=True)
    table.add_column("value", overflow="fold")
    if view["baseline"]:
        table.add_column(f"baseline {view['baseline_run']}", overflow="fold")
    for r in rows:
        cells = ["—" if r.get("missing") else _cell(r["value"])]
        if view["baseline"]:
            cells.append(_cell(r["baseline"]) if r["in_baseline"] else "—")
        table.add_row(r["key"], *cells, style="dim" if r["default"] else None)
    console = output.console(width=table_width(sys.stdout, None), highlight=False)
    console.print(table)
    if hidden:
        why = "equal to the baseline" if view["baseline"] else "defaults (no override set them)"
        console.print(f"{hidden} keys {why} not shown (--all shows them)", markup=False)
    elif not view["baseline"] and not view["defaults_known"] and not args.all:
        console.print("defaults unknown (not a Hydra job): every key shown", markup=False)
    return 0


def _cell(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)


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
