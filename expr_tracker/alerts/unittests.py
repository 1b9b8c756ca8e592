"""Rule unit tests, like ``promtool test rules``: a test file names rule files (or holds
rules inline) and tests, each with input series in promtool notation (``expand_series``)
and the steps each rule is expected to fire at. ``load_unit_file`` checks a file without
running it; ``run_unit_tests`` replays every test and returns the failures.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from expr_tracker.alerts.rulefiles import (
    build_rule,
    check_rules_file,
    one_line,
    rule_entries,
    rule_problems,
    rules_from,
)
from expr_tracker.spec.yaml import LocatedYaml, yaml_error

__all__ = [
    "ExpectedAlert",
    "UnitTest",
    "UnitTestFile",
    "expand_series",
    "load_unit_file",
    "run_unit_tests",
]


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
    from expr_tracker.alerts.rules import parse_seconds as parse

    return default if value is None else parse(value, "interval")


# -- the test file ------------------------------------------------------------------------------
# Values whose checks need the file's line and column (rule files, rules, intervals, steps)
# are checked by load_unit_file first, with promtool's aliases as fields of their own; the
# models then give the runner typed values and name the field of anything left over.


class ExpectedAlert(BaseModel):
    """One expectation: the rule (``rule``, or promtool's ``alertname``, or ``name``) and the
    steps it notifies at (``steps: [...]``, or ``step: N``; none: the rule stays quiet).
    With ``action`` (``stop``/``prune``), the steps it takes that action at (the rule must
    have that action; docs/alerts.md "Actions")."""

    model_config = ConfigDict(extra="forbid")

    rule: Any = None
    alertname: Any = None
    name: Any = None
    steps: list[int] | None = None
    step: int | None = None
    action: Literal["stop", "prune"] | None = None

    @property
    def rule_name(self) -> Any:
        return self.rule or self.alertname or self.name

    def want(self) -> list[int]:
        return _steps(self.model_dump(include=self.model_fields_set))


class UnitTest(BaseModel):
    """One test: input series (promtool notation, ``expand_series``) sampled every
    ``interval``, and the alerts expected (``expected_alerts``, or ``alerts``).
    ``peer_runs`` (``"project/name"`` -> metric -> series, step 0 first) are the finished
    runs ``baseline()`` reads (docs/alerts.md "Comparing with other runs")."""

    model_config = ConfigDict(extra="forbid")

    name: Any = None
    interval: Any = None
    input_series: dict[str, Any] | None = None
    peer_runs: dict[str, dict[str, Any]] | None = None
    expected_alerts: list[ExpectedAlert] | None = None
    alerts: list[ExpectedAlert] | None = None

    @property
    def expected(self) -> list[ExpectedAlert]:
        if "expected_alerts" in self.model_fields_set:
            return self.expected_alerts or []
        return self.alerts or []


class UnitTestFile(BaseModel):
    """A rule unit-test file: ``rule_files`` (relative to it) and/or inline ``rules``, the
    default ``interval`` (or ``evaluation_interval``, which wins) and ``tests``."""

    model_config = ConfigDict(extra="forbid")

    rule_files: str | list[str] | None = None
    rules: Any = None
    interval: Any = None
    evaluation_interval: Any = None
    tests: list[UnitTest]

    @property
    def default_interval(self) -> Any:
        if "evaluation_interval" in self.model_fields_set:
            return self.evaluation_interval
        return self.interval


#: Keys of a unit-test file, of one test, and of one expected alert (aliases included).
_TEST_FILE_KEYS = tuple(UnitTestFile.model_fields)
_TEST_KEYS = tuple(UnitTest.model_fields)
_EXPECT_KEYS = tuple(ExpectedAlert.model_fields)


def _model_errors(doc, data) -> list:
    """``UnitTestFile`` over the checked file: ``(line, column, message)`` naming the field
    of each problem the located checks left (an ``input_series`` that is not a mapping)."""
    from pydantic import ValidationError

    try:
        UnitTestFile.model_validate(data)
    except ValidationError as exc:
        out = []
        for err in exc.errors():
            loc = tuple(err.get("loc", ()))
            dotted = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
            out.append((*doc.where(loc), f"{dotted.lstrip('.')}: {err.get('msg')}"))
        return out
    return []


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


def _peer_baselines(peer_runs: dict[str, dict[str, Any]] | None) -> Any:
    """A test's ``peer_runs`` as in-memory baselines (None without them); each series in
    promtool notation, its values at steps 0, 1, ... (``_``: no value that step)."""
    if not peer_runs:
        return None
    from expr_tracker.alerts.baseline import Baselines

    peers: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for run, metrics in peer_runs.items():
        if not isinstance(metrics, dict):
            raise ValueError(f"peer_runs.{run}: a mapping of metric -> series, got {metrics!r}")
        peers[run] = {}
        for metric, text in metrics.items():
            values = expand_series(text)
            steps = [i for i, v in enumerate(values) if v is not None]
            peers[run][metric] = (steps, [v for v in values if v is not None])
    return Baselines(peers=peers)


def load_unit_file(path: Path):
    """Read and check a unit-test file without running it: ``(UnitTestFile or None when
    invalid, rules, errors, warnings)``; problems are ``(line, column, message)`` in the test file, or a preformatted
    ``file:line:column: message`` string for problems inside a rule file."""
    from expr_tracker.alerts import RuleError
    from expr_tracker.spec.yaml import duplicate_key_message

    errors: list = []
    warnings: list = []
    rules: list = []
    doc = LocatedYaml(path.read_text(encoding="utf-8"))
    for key, mark, first in doc.duplicates:
        errors.append((mark.line + 1, mark.column + 1, duplicate_key_message(key, first)))
    spec = doc.data if doc.data is not None else {}
    if not isinstance(spec, dict):
        errors.append((1, 1, "a test file is a mapping with 'tests:' (a list)"))
        return None, rules, errors, warnings
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
        checked = check_rules_file(str(rule_file))
        if checked["errors"]:
            errors += [
                f"{rule_file}:{e['line']}:{e['column']}: {e['message']}" for e in checked["errors"]
            ]
            continue
        rules += rules_from(str(rule_file))
    # inline rules: the same checks as `et rules check`, located in the test file
    if spec.get("rules") is not None:
        problems, _ = rule_problems(doc, spec)
        bad = [p for p in problems if p["severity"] == "errors"]
        errors += [(p["line"], p["column"], p["message"]) for p in bad]
        if not bad:
            rules += [
                build_rule(k, v, x) for _, (k, v, x), _ in rule_entries(spec["rules"], ("rules",))
            ]
    for key in ("interval", "evaluation_interval"):
        try:
            _seconds(spec.get(key), 1.0)
        except RuleError as exc:
            errors.append((*doc.where((key,)), one_line(exc)))
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
    if errors:
        return None, rules, errors, warnings
    errors += _model_errors(doc, spec)
    model = None if errors else UnitTestFile.model_validate(spec)
    return model, rules, errors, warnings


def run_unit_tests(path: Path) -> tuple[list[str], list, int | None]:
    """Run a rule unit-test file: ``(failures, warnings, number of tests)``. A failure is a
    text (a diff when an expectation is not met); a warning is ``(line, column, message)``.
    Nothing runs when the file itself is invalid (unknown keys, a rule file that cannot be
    read, invalid rules): its problems are the failures and the count is None."""
    import yaml

    from expr_tracker.alerts import RuleError
    from expr_tracker.alerts.testing import replay, rows_from_series

    def at(problem) -> str:
        if isinstance(problem, str):
            return problem
        line, col, message = problem
        return f"{path}:{line}:{col}: {message}"

    try:
        spec, rules, errors, warnings = load_unit_file(path)
    except OSError as exc:
        return [f"cannot read: {exc.strerror or exc}"], [], None
    except yaml.YAMLError as exc:
        try:  # a reader error (a NUL byte) has only a position in the text: line:column
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, ValueError):
            text = None
        what, spot = yaml_error(exc, text)
        where = f"{path}:{spot[0]}:{spot[1]}" if spot is not None else str(path)
        return [f"{where}: invalid YAML: {what}"], [], None
    if not errors and not rules:
        errors.append(f"{path}: no rules (give rule_files or rules)")
    if errors or spec is None:
        return [at(e) for e in errors], warnings, None
    default_interval = _seconds(spec.default_interval, 1.0)
    by_name = {r.name: r for r in rules}
    failures: list[str] = []
    for i, test in enumerate(spec.tests):
        label = test.name or f"test #{i + 1}"
        try:
            interval = _seconds(test.interval, default_interval)
            series = {k: expand_series(v) for k, v in (test.input_series or {}).items()}
            baselines = _peer_baselines(test.peer_runs)
        except (ValueError, RuleError) as exc:
            failures.append(f"{label}: {exc}")
            continue
        cap = replay(rules, rows_from_series(series, interval=interval), baselines=baselines)
        for exp in test.expected:
            rname = exp.rule_name
            if rname not in by_name:
                failures.append(f"{label}: no rule named {rname!r} (have: {', '.join(by_name)})")
                continue
            want = exp.want()
            what = "firing"
            if exp.action is not None:
                have = by_name[rname].action
                if have != exp.action:
                    failures.append(
                        f"{label}: rule {rname!r} has action {have or 'none'}, "
                        f"expected {exp.action}"
                    )
                    continue
                what = exp.action
                got = sorted(e.step for e in cap.events if e.rule.name == rname and e.action)
            else:
                got = sorted(e.step for e in cap.fired() if e.rule.name == rname and e.notify)
            if want != got:
                diff = [f"{label}: rule {rname!r}"]
                diff += [f"  - expected {what} at step {s}" for s in want if s not in got]
                diff += [f"  + got {what} at step {s}" for s in got if s not in want]
                if not want:
                    diff.insert(1, "  expected quiet")
                failures.append("\n".join(diff))
    return failures, warnings, len(spec.tests)
