"""``et rules``: explain, check and test alert rules without a training job (for CI).

    et rules explain "<rule>" [--format text|json|jsonl]
    et rules check FILE... [--run DIR] [--package P] [--format text|json|jsonl] [--lint-fatal]
    et rules test RULE|FILE --run DIR [-n N] [--format text|json|jsonl]   replay history
    et rules test TESTFILE.yaml                      rule unit tests (like promtool test rules)
    et rules backtest RULES DIR [--label status|COLUMN] [--format table|json|jsonl]

Exit codes (stable, CONVENTIONS.md "Rule checking in CI"): 0 success, 1 invalid rules or
failed tests, 2 usage error, 3 lint warnings only with ``--lint-fatal`` (without it
warnings are printed as ``WARNING`` and exit 0, as promtool does).

``--format json`` prints one JSON document (``check``: an array with one result per file;
``test --run``: an array of firings; ``explain``: the rule's description), ``--format
jsonl`` one object per line (``cli/output.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# the rule files and their pydantic models are imported by the commands that read them:
# every other `et` command builds this parser too (cold start, docs/architecture.md)
from expr_tracker.cli import appconfig, output
from expr_tracker.history import read_history, resolve_run_path

__all__ = ["read_metrics", "register"]

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

    p = sub.add_parser(
        "backtest",
        help="run rules over every past run and score them against how the runs ended",
        description=(
            "Evaluate every rule of RULES (a rules file or one rule) over every run under DIR, "
            "as the per-step engine would have, and report per rule: runs where it fired, "
            "the median first firing step, how many steps before the end of each bad run "
            "it fired (lead time) and how many runs that finished fine it fired on (false "
            "positives). A run is bad when its status is failed, crashed or diverged (or "
            "as --label says). Exit 0 done, 1 invalid rules, 2 usage error."
        ),
    )
    p.add_argument("rules", metavar="RULES", help="a rules file (as et rules check) or a rule")
    p.add_argument("dir", metavar="DIR", help="a folder of runs (or one run directory)")
    p.add_argument(
        "--label",
        default="status",
        metavar="status|COLUMN",
        help="what makes a run bad: its status (default), or a column of the runs view "
        "(summary.diverged, config.x, or the key alone): true, non-zero, failed, crashed, "
        "diverged, bad, yes is bad; false, zero, finished, ok, good, no is fine",
    )
    output.add_format_option(p, "table", what="rules")
    p.set_defaults(func=cmd_backtest)

    parser.set_defaults(func=lambda args: _usage(parser))


def _usage(parser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _out(text: str = "") -> None:
    """One or more lines for people: names and messages from files (a rule's message, a
    metric name) are escaped for the terminal, line by line (``output.printable``)."""
    sys.stdout.write("\n".join(map(output.printable, text.split("\n"))) + "\n")


# -- explain ----------------------------------------------------------------------------------


def cmd_explain(args) -> int:
    from expr_tracker.alerts import RuleError, compile_expr, make_rule
    from expr_tracker.alerts.rulefiles import lint

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
        "condition": rule.condition.to_source(),
        "level": rule.level,
        "message": rule.message,
        "metrics": {name: n for name, n in compiled.needs.items()},
        "functions": list(rule.condition.functions()),
        "time_based": compiled.time_based,
        "warnings": lint(rule),
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


def cmd_check(args) -> int:
    from expr_tracker.alerts.rulefiles import check_rules_file

    known = None
    if args.run:
        try:
            rows = read_metrics(args.run)
        except OSError as exc:
            sys.stderr.write(f"et rules check: cannot read run {args.run}: {exc}\n")
            return EXIT_USAGE
        known = {k for row in rows for k in row if not k.startswith("_")}
    results = [
        check_rules_file(f, known, appconfig.package_of(f, args.package)) for f in args.files
    ]
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


def read_metrics(run: str) -> list[dict]:
    """Every row of a run (a directory or a metrics file), merged by ``_step``, through the
    history reader. Raises ``OSError`` (``FileNotFoundError``) when there is no metrics file."""
    return read_history(run, output_type="dicts")


# -- test -------------------------------------------------------------------------------------


def cmd_test(args) -> int:
    from expr_tracker.alerts import RuleError
    from expr_tracker.alerts.rulefiles import looks_like_file, rules_from

    path = Path(args.target)
    if looks_like_file(args.target) and not path.is_file():
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
        rules = rules_from(args.target)
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
    _out(f"{len(fired)} firing(s) over {len(rows)} steps of {resolve_run_path(args.run)}")
    return EXIT_OK


def _unit_tests(path: Path, args) -> int:
    """Run a rule unit-test file (``alerts.unittests``) and print the outcome: a record
    (json/jsonl: one per file, as ``check``) or text lines; exit 1 on any failure."""
    from expr_tracker.alerts.unittests import run_unit_tests

    failures, warned, tests = run_unit_tests(path)
    fmt = getattr(args, "format", "text")
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


# -- backtest ---------------------------------------------------------------------------------


def cmd_backtest(args) -> int:
    """``et rules backtest``: rules (alerts/backtest.py) over runs read from the cache
    (query/runseries.py); docs/alerts.md "Backtesting"."""
    from expr_tracker.alerts import RuleError
    from expr_tracker.alerts.backtest import (
        Frame,
        RunOutcome,
        backtest_frame,
        score_rules,
    )
    from expr_tracker.alerts.compiled import CompiledRule
    from expr_tracker.alerts.rulefiles import looks_like_file, rules_from
    from expr_tracker.query.runseries import LabelError, labelled_runs, read_series
    from expr_tracker.query.tables import Problems

    target = args.rules
    if looks_like_file(target) and not Path(target).is_file():
        sys.stderr.write(f"et rules backtest: {target}: no such file\n")
        return EXIT_USAGE
    try:
        rules = rules_from(target)
        names: set[str] = set()
        for rule in rules:
            compiled = CompiledRule(rule, 4096)
            names.update(compiled.keys)
    except RuleError as exc:
        _out(f"FAILED: {exc}")
        return EXIT_INVALID
    problems = Problems()
    try:
        runs = labelled_runs(args.dir, label=args.label, problems=problems)
    except (FileNotFoundError, LabelError) as exc:
        sys.stderr.write(f"et rules backtest: {exc}\n")
        return EXIT_USAGE

    def one(run):
        """Read one run and backtest every rule over it (None: unreadable, in problems);
        its arrays are dropped once scored."""
        if not read_series(run, names, problems=problems):
            return None
        frame = Frame(run.steps, run.times, run.columns)
        last = int(run.steps.max()) if run.steps.size else None
        outcome = RunOutcome(run.run, run.label, last, backtest_frame(rules, frame))
        run.steps = run.times = None
        run.columns = {}
        return outcome

    # numpy, pyarrow and the Parquet reads release the GIL: a run per core at a time
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        outcomes = [o for o in pool.map(one, runs) if o is not None]
    if problems:
        output.PrintableStream(sys.stderr).write((problems.message() or "") + "\n")
    report = score_rules(outcomes) if outcomes else []
    if output.is_machine(args.format):
        output.write_records(report, args.format)
        return EXIT_OK
    if not outcomes:
        _out(f"no runs with metrics under {args.dir}")
        return EXIT_OK
    console = output.console(file=sys.stdout)
    console.print(backtest_renderable(report))
    for r in report:
        if r["engine"] != "vector":
            where = "" if r["engine"] == "replay" else " on some runs"
            _out(f"replay: {r['rule']} ran through the per-step engine{where} ({r['reason']})")
    bad = sum(o.label is True for o in outcomes)
    fine = sum(o.label is False for o in outcomes)
    _out(
        f"{len(outcomes)} runs: {bad} bad, {fine} fine, {len(outcomes) - bad - fine} "
        f"unlabelled (--label {args.label})"
    )
    return EXIT_OK


def backtest_renderable(report: list[dict]):
    """The ``et rules backtest`` table (a rich ``Table``): one row per rule."""
    from rich.table import Table
    from rich.text import Text

    def num(v) -> str:
        if v is None:
            return "-"
        return str(int(v)) if float(v).is_integer() else f"{v:.1f}"

    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("rule", overflow="fold", ratio=1, min_width=12)
    table.add_column("engine", no_wrap=True, min_width=6)
    for head in ("fired", "caught", "false pos", "first step", "lead"):
        table.add_column(head, justify="right", no_wrap=True, min_width=len(head))
    for r in report:
        lead = "-"
        if r["lead_median"] is not None:
            lead = f"{num(r['lead_median'])} ({num(r['lead_min'])}-{num(r['lead_max'])})"
        table.add_row(
            Text(output.printable(str(r["rule"]))),
            Text(r["engine"], style="" if r["engine"] == "vector" else "yellow"),
            f"{r['fired']}/{r['runs']}",
            f"{r['caught']}/{r['bad_runs']}",
            f"{r['false_positives']}/{r['fine_runs']}",
            num(r["first_step_median"]),
            lead,
        )
    return table
