"""``et.init`` and ``et config validate`` accept and reject the same specs (both run
``assemble.check``): every bad spec below is a ``SpecError`` from ``et.init`` naming the path,
and ``et config validate`` names the same paths, exits 1, prints no SUCCESS line and no
traceback; every good spec passes both."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

import expr_tracker as et
from expr_tracker.spec import SpecError

URL = "https://hooks.example.org/services/T0KEN-abcdef123"


def channel(name, **fields):
    return {"alerts": {"channels": {name: fields}}}


def plugin(kind, **options):
    return {"spans": {"plugins": [{"type": kind, "options": options}]}}


#: id -> (spec, a path the error must name)
BAD = {
    "plugin-unknown-type": (
        {"spans": {"plugins": [{"type": "gpu_statz"}]}},
        "spans.plugins[0].type",
    ),
    "plugin-interval-str": (
        plugin("gpu_stats", interval="abc"),
        "spans.plugins[0].options.interval",
    ),
    "plugin-interval-neg": (plugin("gpu_stats", interval=-1), "spans.plugins[0].options.interval"),
    "plugin-interval-bool": (
        plugin("gpu_stats", interval=True),
        "spans.plugins[0].options.interval",
    ),
    "plugin-index-str": (plugin("gpu_stats", index="x"), "spans.plugins[0].options.index"),
    "plugin-unknown-option": (plugin("cpu_time", foo=1), "spans.plugins[0].options.foo"),
    "plugin-device-list": (plugin("torch_memory", device=[1]), "spans.plugins[0].options.device"),
    "plugin-device-word": (
        plugin("torch_memory", device="gpu0"),
        "spans.plugins[0].options.device",
    ),
    "channel-unknown-type": (channel("c", type="slak", url=URL), "alerts.channels.c.type"),
    "channel-unknown-option": (
        channel("s", type="slack", url=URL, options={"colour": "red"}),
        "alerts.channels.s.options.colour",
    ),
    "channel-no-url": (channel("s", type="slack"), "alerts.channels.s"),
    "channel-url-scheme": (channel("s", type="slack", url="ftp://h/x"), "alerts.channels.s.url"),
    "channel-url-ambiguous": (
        channel("s", type="slack", url="https://user:p/a#s?@x@host/path"),
        "alerts.channels.s.url",
    ),
    "slack-username-int": (
        channel("s", type="slack", url=URL, options={"username": 5}),
        "alerts.channels.s.options.username",
    ),
    "lark-template-int": (
        channel("l", type="lark", url=URL, options={"header_template": 5}),
        "alerts.channels.l.options.header_template",
    ),
    "dingtalk-at-all-str": (
        channel("d", type="dingtalk", url=URL, options={"at_all": "yes"}),
        "alerts.channels.d.options.at_all",
    ),
    "webhook-method": (
        channel("w", type="webhook", url=URL, options={"method": 5}),
        "alerts.channels.w.options.method",
    ),
    "webhook-headers-str": (
        channel("w", type="webhook", url=URL, options={"headers": "x"}),
        "alerts.channels.w.options.headers",
    ),
    "webhook-headers-env-unset": (
        channel("w", type="webhook", url=URL, options={"headers_env": {"X-Key": "ET_TEST_NO_VAR"}}),
        "alerts.channels.w.options.headers_env.X-Key",
    ),
    "email-port-str": (
        channel(
            "m",
            type="email",
            options={"host": "h", "port": "abc", "from_addr": "a@b.org", "to": "c@d.org"},
        ),
        "alerts.channels.m.options.port",
    ),
    "email-ssl-str": (
        channel(
            "m",
            type="email",
            options={"host": "h", "ssl": "false", "from_addr": "a@b.org", "to": "c@d.org"},
        ),
        "alerts.channels.m.options.ssl",
    ),
    "email-to-int": (
        channel("m", type="email", options={"host": "h", "from_addr": "a@b.org", "to": 5}),
        "alerts.channels.m.options.to",
    ),
    "console-stream": (
        channel("c", type="console", options={"stream": "stdin"}),
        "alerts.channels.c.options.stream",
    ),
    "callable-target": (
        channel("f", type="callable", options={"target": "no_such_module_xyz:fn"}),
        "alerts.channels.f.options.target",
    ),
    "channel-off-bad-option": (
        channel("ops", type="slack", url_env="ET_TEST_NO_VAR", options={"colour": 1}),
        "alerts.channels.ops.options.colour",
    ),
    "channel-disabled-bad-option": (
        channel("ops", type="slack", url=URL, enabled=False, options={"colour": 1}),
        "alerts.channels.ops.options.colour",
    ),
    "rule-syntax": (
        {"alerts": {"rules": {"r": {"condition": "loss >"}}}},
        "alerts.rules.r.condition",
    ),
    "rule-window": (
        {"alerts": {"rules": {"r": {"condition": "mean(loss[100000]) > 1"}}}},
        "alerts.rules.r.condition",
    ),
    "rule-blank-name": (
        {"alerts": {"rules": [{"name": "  ", "condition": "loss > 1"}]}},
        'alerts.rules["  "].name',
    ),
    "rule-for-steps": (
        {"alerts": {"rules": {"r": {"condition": "loss > 1", "for_steps": 0}}}},
        "alerts.rules.r.for_steps",
    ),
}

GOOD = {
    # the one-line form as the value of a name-keyed rule (et rules check reads it so)
    "one_line_rule_by_name": {
        "alerts": {"rules": {"high": "loss > 4 => error: loss is {loss}", "low": "loss < 0"}}
    },
    "plugins": {
        "spans": {
            "plugins": [
                "cpu_time",
                {"type": "gpu_stats", "options": {"index": 0, "interval": 0.5}},
                {"type": "torch_memory", "options": {"device": "cuda:0"}},
            ]
        }
    },
    "channels": {
        "alerts": {
            "channels": {
                "ops": {
                    "type": "slack",
                    "url_env": "ET_TEST_NO_VAR",
                    "options": {"username": "bot"},
                },
                "hook": {
                    "type": "webhook",
                    "url": URL,
                    "options": {"method": "put", "headers": {"X-Key": "k", "X-N": 3}},
                },
                "mail": {
                    "type": "email",
                    "options": {
                        "host": "h",
                        "port": "2525",
                        "from_addr": "a@b.org",
                        "to": ["c@d.org"],
                    },
                },
                "card": {"type": "lark", "url": URL, "options": {"header_template": "red"}},
            },
            "rules": {"r": {"condition": "loss > 1", "level": "error"}},
        }
    },
    "alerts-off": {"alerts": {"enabled": False, "channels": {"x": {"type": "slak"}}}},
}


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for var in ("ET_CONFIG", "ET_ALERT_CONFIG", "ET_TEST_NO_VAR", "ET_SLACK_WEBHOOK_URL"):
        monkeypatch.delenv(var, raising=False)
    yield
    if et.get_run() is not None:
        et.finish()


def file_issues(file, kind):
    """What ``et config validate`` reports for ``file`` (imported here: the function is
    new, and the tests comparing against it should fail one by one without it)."""
    from expr_tracker.assemble.check import check_file as issues

    return issues(file, kind)


def write(tmp_path, name, spec):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def init_paths(tmp_path, path):
    """The paths ``et.init(spec=path)`` names, or None when it starts a run."""
    try:
        et.init(spec=str(path), dir=str(tmp_path / "runs"), project="p", name=path.stem)
    except SpecError as exc:
        return {issue.path for issue in exc.issues}
    et.finish()
    return None


@pytest.mark.parametrize("case", sorted(BAD))
def test_init_and_validate_reject_alike(tmp_path, case):
    spec, path = BAD[case]
    f = write(tmp_path, case, spec)
    rejected = init_paths(tmp_path, f)
    assert rejected is not None, f"et.init accepted {case}"
    assert path in rejected
    assert not (tmp_path / "runs" / "p" / case).exists()
    assert {issue.path for issue in file_issues(str(f), "run")} == rejected


@pytest.mark.parametrize("case", sorted(GOOD))
def test_init_and_validate_accept_alike(tmp_path, case):
    f = write(tmp_path, case, GOOD[case])
    assert init_paths(tmp_path, f) is None
    assert file_issues(str(f), "run") == []


def test_cli_validate_fails_every_bad_file_without_traceback(tmp_path):
    files = {case: write(tmp_path, case, spec) for case, (spec, _) in BAD.items()}
    env = {k: v for k, v in os.environ.items() if k not in ("ET_CONFIG", "ET_ALERT_CONFIG")}
    env.pop("ET_TEST_NO_VAR", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "expr_tracker.cli.main",
            "config",
            "validate",
            *map(str, files.values()),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    assert "SUCCESS" not in result.stdout
    blocks = {}
    for block in result.stdout.split("FAILED: ")[1:]:
        head, _, body = block.partition("\n")
        blocks[head.strip()] = body
    for case, f in files.items():
        assert f"{BAD[case][1]}:" in blocks[str(f)], (case, blocks.get(str(f)))


def test_alerts_file_is_checked_like_the_alerts_section(tmp_path):
    f = tmp_path / "alerts.yaml"
    f.write_text(
        "channels:\n  ops:\n    type: slack\n    url_env: ET_TEST_NO_VAR\n    options: {colour: 1}\n"
    )
    assert [i.path for i in file_issues(str(f), "alerts")] == ["alerts.channels.ops.options.colour"]


def test_configure_alert_raises_spec_error_with_the_path():
    with pytest.raises(SpecError) as err:
        et.configure_alert(
            channels={"w": {"type": "webhook", "url": URL, "options": {"method": 5}}}
        )
    assert [i.path for i in err.value.issues] == ["alerts.channels.w.options.method"]


def test_register_backend_after_the_callable_channel_is_loaded(monkeypatch):
    """The `callable` channel module, once imported, must not shadow the builtin for the
    package (register_backend and the checks call callable())."""
    from expr_tracker.alerts.delivery import channels
    from expr_tracker.alerts.delivery.channels import create_channel, register_backend
    from expr_tracker.alerts.delivery.channels.console import ConsoleChannel

    monkeypatch.setattr(channels, "_registry", dict(channels._registry))  # leave no trace

    create_channel({"type": "callable", "options": {"fn": print}})
    assert register_backend("console_copy_for_test", ConsoleChannel) is ConsoleChannel


def test_one_line_rule_by_name_is_saved_split_and_spec_json_reloads(tmp_path):
    """A name-keyed rule in the one-line form keeps its level and message in spec.json, so the
    saved spec validates and starts a run with the same rule (it was saved with the arrow in
    `condition` and the default level, and rejected on reload)."""
    import json

    import expr_tracker as et

    rules = {"r": "loss > 5 => error: loss {loss}"}
    et.init(project="p", name="one", dir=str(tmp_path / "runs"), alerts={"rules": rules})
    et.finish()
    saved = tmp_path / "runs" / "p" / "one" / "spec.json"
    [rule] = json.loads(saved.read_text())["alerts"]["rules"]
    assert (rule["condition"], rule["level"], rule["message"]) == (
        "loss > 5",
        "error",
        "loss {loss}",
    )
    assert file_issues(str(saved), "run") == []
    run = et.init(spec=str(saved), name="two")
    [again] = run.alerts.rules
    assert (again.level, again.message) == ("error", "loss {loss}")
    et.finish()
