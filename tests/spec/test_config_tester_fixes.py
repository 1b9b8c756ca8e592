"""Problems a tester found in config handling (issue 10, "config" follow-up): secrets in
``spec.json`` and ``run.json``'s argv, spec bounds the runtime enforced on its own, a rule
field of the wrong type crashing the CLI, ``et channels test --format json`` with no channel,
and ``et.init(spec=app.yaml)`` reading a Hydra app config's ``tracker:`` section."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import expr_tracker as et
from expr_tracker.cli.main import main
from expr_tracker.spec import SpecError

# --- 1. secrets in spec.json and run.json ---------------------------------------------------


@pytest.mark.parametrize(
    "password, url",
    [
        ("p/a#s?@x", "http://user:p%2Fa%23s%3F%40x@127.0.0.1:9/hook"),
        ("hunter2", "http://user:hunter2@127.0.0.1:9/hook"),
        ("hunter2", "https://user:hunter2@example.invalid/api"),
    ],
)
def test_spec_json_config_redacted_as_config_json(tmp_path, password, url):
    run = et.init(
        project="p", name="n", dir=str(tmp_path), config={"hook": url, "lr": 0.1, "db": {"u": url}}
    )
    run_dir = Path(run.dir)
    et.finish()
    spec_config = json.loads((run_dir / "spec.json").read_text())["config"]
    config = json.loads((run_dir / "config.json").read_text())
    assert spec_config == config  # one function redacts both
    assert spec_config["lr"] == 0.1
    text = (run_dir / "spec.json").read_text()
    for secret in (password, "p%2Fa%23s%3F%40x", "hunter2"):
        assert secret not in text


def _run_argv(tmp_path, *argv: str) -> list[str]:
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, expr_tracker as et\n"
        "run = et.init(project='p', name='n', dir=sys.argv[1])\n"
        "print(run.dir)\n"
        "et.finish()\n"
    )
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "runs"), *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    run_dir = Path(out.stdout.strip().splitlines()[-1])
    return json.loads((run_dir / "run.json").read_text())["argv"]


def test_run_json_argv_scrubs_credentials(tmp_path):
    argv = _run_argv(
        tmp_path,
        '+tracker.alerts.channels={w:{type:webhook,url:"http://bob:S3CRETPW@127.0.0.1/x"}}',
        "db.password=Hunter42Zebra",
        "++api_key=KEYKEY1234",
        "tracker.alerts.channels.w.url=https://hooks.example.com/services/T0/B0/TOKTOK77",
        "--token",
        "TOKEN5678",
        "--hf-token=HFTOK9999",
        "optimizer.lr=0.1",
        "max_tokens=512",
        "data.url_count=3",
    )
    blob = json.dumps(argv)
    for secret in ("S3CRETPW", "Hunter42Zebra", "KEYKEY1234", "TOKTOK77", "TOKEN5678", "HFTOK9999"):
        assert secret not in blob, blob
    # what is not a secret stays readable
    assert "optimizer.lr=0.1" in argv and "max_tokens=512" in argv and "data.url_count=3" in argv
    assert "db.password=***" in argv and "--token" in argv
    assert any(a.startswith("+tracker.alerts.channels={w:{type:webhook,url:") for a in argv)


def test_scrub_argv_unit():
    from expr_tracker.spec.errors import scrub_argv

    assert scrub_argv(["a=1", "secret=x", "~auth.token", "--password", "pw", "x"]) == [
        "a=1",
        "secret=***",
        "~auth.token",
        "--password",
        "***",
        "x",
    ]
    assert scrub_argv(["cfg={url:'http://u:PW@h/x',n:1}"]) == ["cfg={url:***,n:1}"]


# --- 2. bounds the runtime enforced, now in the spec ----------------------------------------


@pytest.mark.parametrize(
    "section, expect_path, expect",
    [
        ({"alerts": {"watchdog_interval": "0s"}}, "alerts.watchdog_interval", "at least 0.01 s"),
        ({"alerts": {"watchdog_interval": "1us"}}, "alerts.watchdog_interval", "at least 0.01 s"),
        ({"alerts": {"watchdog_interval": 0.001}}, "alerts.watchdog_interval", "at least 0.01 s"),
        ({"spans": {"max_pending_bytes": 0}}, "spans.max_pending_bytes", ">= 1"),
        ({"spans": {"max_record_bytes": "0B"}}, "spans.max_record_bytes", ">= 1"),
    ],
)
def test_runtime_bounds_rejected_by_spec_and_validate(
    tmp_path, capsys, section, expect_path, expect
):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(section))
    assert main(["config", "validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{expect_path}: " in out and expect in out and "SUCCESS" not in out
    with pytest.raises(SpecError) as info:
        et.init(project="p", dir=str(tmp_path / "runs"), spec=str(path))
    assert [i.path for i in info.value.issues] == [expect_path]
    assert expect in str(info.value)


def test_watchdog_minimum_accepted(tmp_path):
    run = et.init(project="p", dir=str(tmp_path), spec={"alerts": {"watchdog_interval": "10ms"}})
    assert run.spec.alerts.watchdog_interval == pytest.approx(0.01)
    et.finish()


# --- 3. rule fields of the wrong type: no traceback, one path everywhere --------------------

RULE_FIELDS = [
    "name",
    "condition",
    "level",
    "title",
    "message",
    "mode",
    "for_steps",
    "cooldown",
    "max_fires",
    "notify_recovery",
    "channels",
    "tags",
    "enabled",
    "action",
]
WRONG = {"int": 5, "str": "x y", "list": [1], "dict": {"a": 1}, "none": None, "bool": True}
#: (field, type) pairs that are valid values
VALID = {
    ("name", "str"),
    ("name", "none"),
    ("title", "str"),
    ("title", "none"),
    ("message", "str"),
    ("message", "none"),
    ("level", "none"),  # the default: warning, error for a rule with an action
    ("action", "none"),
    ("for_steps", "int"),
    ("cooldown", "int"),
    ("max_fires", "int"),
    ("max_fires", "none"),
    ("channels", "none"),
    ("notify_recovery", "bool"),
    ("enabled", "bool"),
}
_CASES = [(f, t) for f in RULE_FIELDS for t in WRONG]
_LINE = re.compile(r"^\s+\S+:\d+:\d+: (alerts\.\S+?): ", re.M)


def _field_path(path: str) -> str:
    """``alerts.rules.r.tags[0]`` or ``alerts.rules[0].tags`` -> ``tags`` (a rule whose name
    is invalid is named by its index in et.init's paths)."""
    m = re.match(r"alerts\.rules(?:\.r|\[0\])\.(\w+)", path)
    assert m, path
    return m.group(1)


@pytest.mark.parametrize("field, kind", _CASES, ids=[f"{f}-{t}" for f, t in _CASES])
def test_rule_field_types_same_verdict_everywhere(tmp_path, capsys, field, kind):
    rule = {"condition": "loss > 1", field: WRONG[kind]}
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"alerts": {"rules": {"r": rule}}}))
    valid = (field, kind) in VALID

    code = main(["rules", "check", "--format", "json", str(path)])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    [result] = json.loads(out.out)
    assert code == (0 if valid else 1), result
    check_paths = {_field_path(e["path"]) for e in result["errors"]}

    code = main(["config", "validate", str(path)])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert code == (0 if valid else 1), out.out
    validate_paths = {_field_path(p) for p in _LINE.findall(out.out)}

    try:
        et.init(project="p", dir=str(tmp_path / "runs"), spec=str(path))
    except SpecError as exc:
        init_paths = {_field_path(i.path) for i in exc.issues}
    else:
        et.finish()
        init_paths = set()

    expected = set() if valid else {field}
    assert check_paths == validate_paths == init_paths == expected


def test_rule_names_rejects_non_list_with_field():
    from expr_tracker.alerts import RuleError, make_rule

    for bad in (5, True, {"a": 1}, 1.5):
        with pytest.raises(RuleError) as info:
            make_rule({"condition": "loss > 1", "tags": bad})
        assert info.value.field == "tags"


# --- 5. et channels test --format json with no channel ---------------------------------------


@pytest.mark.parametrize("fmt, expected", [("json", []), ("jsonl", None)])
def test_channels_test_json_without_channel_prints_empty_array(monkeypatch, capsys, fmt, expected):
    import os

    for var in list(os.environ):
        if var.startswith("ET_"):
            monkeypatch.delenv(var)
    assert main(["channels", "test", "--format", fmt]) == 1  # nothing could be tested
    out = capsys.readouterr()
    if expected is None:
        assert out.out == ""
    else:
        assert json.loads(out.out) == expected
    assert "no alert channel is configured" in out.err


# --- 6. et.init(spec=app.yaml) / ET_CONFIG read a Hydra app config's tracker: section --------

APP_YAML = """\
lr: 0.1
model:
  depth: 4
tracker:
  project: demo
  history:
    buffer:
      size: 7
  alerts:
    rules:
      high: {condition: "loss > 10", level: error}
"""


@pytest.mark.parametrize("how", ["spec", "ET_CONFIG"])
def test_init_reads_app_config_tracker_section(tmp_path, monkeypatch, capsys, how):
    app = tmp_path / "app.yaml"
    app.write_text(APP_YAML)
    assert main(["config", "validate", str(app)]) == 0
    capsys.readouterr()
    if how == "spec":
        run = et.init(dir=str(tmp_path / "runs"), spec=str(app))
    else:
        monkeypatch.setenv("ET_CONFIG", str(app))
        run = et.init(dir=str(tmp_path / "runs"))
    try:
        assert run.spec.project == "demo"
        assert run.spec.history.buffer.size == 7
        assert [r.name for r in run.spec.alerts.rules] == ["high"]
    finally:
        et.finish()


def test_init_app_config_errors_carry_the_file_line(tmp_path, capsys):
    app = tmp_path / "app.yaml"
    app.write_text(APP_YAML.replace("size: 7", "size: 0"))
    assert main(["config", "validate", str(app)]) == 1
    validate = capsys.readouterr().out
    with pytest.raises(SpecError) as info:
        et.init(dir=str(tmp_path / "runs"), spec=str(app))
    [issue] = info.value.issues
    assert issue.path == "history.buffer.size"
    assert issue.location == (str(app), 8, 7)
    assert f"{app}:8:7: history.buffer.size: 0 is not valid" in validate


def test_spec_file_without_tracker_section_unchanged(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("project: plain\nhistory:\n  buffer:\n    size: 3\n")
    run = et.init(dir=str(tmp_path / "runs"), spec=str(spec))
    assert (run.spec.project, run.spec.history.buffer.size) == ("plain", 3)
    et.finish()
