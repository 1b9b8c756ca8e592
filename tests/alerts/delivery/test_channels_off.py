"""A configured channel whose ``url_env`` variable is unset is off, and every surface says
so: ``et alert --channel``, ``et channels test``, ``et.alert(channels=...)``."""

from __future__ import annotations

import json
import logging
import pathlib

import pytest

from expr_tracker.cli.main import main
from expr_tracker.testing import WebhookServer

pytestmark = pytest.mark.usefixtures("no_proxy")


def _config(extra=""):
    path = pathlib.Path("alerts.yaml")
    path.write_text(
        "alerts:\n"
        "  channels:\n"
        "    - {type: webhook, name: notset, url_env: ET_NOTSET_URL}\n" + extra
    )
    return str(path)


def test_cli_alert_names_the_off_channel(capsys):
    assert main(["alert", "hi", "--channel", "notset", "--config", _config()]) == 1
    err = capsys.readouterr().err
    assert "et alert: channel 'notset' is off: environment variable ET_NOTSET_URL is not set" in err
    assert "unknown channel" not in err


def test_cli_alert_unknown_channel_still_unknown(capsys, caplog):
    caplog.set_level(logging.WARNING)
    assert main(["alert", "hi", "--channel", "nope", "--config", _config()]) == 1
    err = capsys.readouterr().err
    assert "no channel takes this alert" in err
    assert "unknown channel 'nope' (configured: console, notset)" in caplog.text


def test_channels_test_reports_off_not_failed(capsys):
    cfg = _config()
    assert main(["channels", "test", "--config", cfg]) == 1  # nothing could be tested
    captured = capsys.readouterr()
    assert captured.out == "notset (webhook): off (ET_NOTSET_URL not set)\n"
    assert "FAILED" not in captured.out and "configuration error" not in captured.out
    assert "no channel was tested" in captured.err
    assert main(["channels", "test", "notset", "--config", cfg, "--json"]) == 1
    row = json.loads(capsys.readouterr().out)
    assert row == {
        "channel": "notset",
        "type": "webhook",
        "ok": None,
        "off": True,
        "answer": "off (ET_NOTSET_URL not set)",
    }


def test_channels_test_off_channel_does_not_fail_the_others(monkeypatch, capsys):
    with WebhookServer() as server:
        monkeypatch.setenv("ET_ON_URL", server.url)
        cfg = _config("    - {type: webhook, name: live, url_env: ET_ON_URL}\n")
        assert main(["channels", "test", "--config", cfg]) == 0
        assert len(server.requests) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "notset (webhook): off (ET_NOTSET_URL not set)"
    assert out[1].startswith("live (webhook, http://127.0.0.1:") and ": ok: HTTP 200" in out[1]


def test_et_alert_for_an_off_channel_logs_why(monkeypatch, caplog):
    import expr_tracker as et

    caplog.set_level(logging.WARNING)
    et.init(
        project="proj",
        name="r1",
        alert={"channels": [{"type": "webhook", "name": "notset", "url_env": "ET_NOTSET_URL"}]},
    )
    assert et.alert("x", channels=["notset"]) is False
    assert "channel 'notset', which is off: ET_NOTSET_URL is not set" in caplog.text
    assert "unknown channel" not in caplog.text


def test_channels_test_config_errors_exit_2_and_still_test_the_rest(capsys):
    """A configuration error is a usage error (exit 2, as `et alert`), also when it is one
    channel's settings; the valid channels are still tested and listed."""
    with WebhookServer([(200, "ok")]) as server:
        cfg = _config(
            f"    - {{type: webhook, name: good, url: '{server.url}'}}\n"
            "    - {type: slack, name: badurl, url: 'ftp://example.invalid/x'}\n"
            "    - {type: nope, name: badtype}\n"
        )
        assert main(["channels", "test", "--config", cfg, "--format", "json"]) == 2
    rows = {r["channel"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["good"]["ok"] is True and rows["notset"]["off"] is True
    assert (
        rows["badurl"]["ok"] is False and "alerts.channels.badurl.url" in rows["badurl"]["answer"]
    )
    assert "unknown channel type 'nope'" in rows["badtype"]["answer"]
    # a file that does not load: exit 2 too
    pathlib.Path("broken.yaml").write_text("alerts:\n  channels: [\n")
    assert main(["channels", "test", "--config", "broken.yaml"]) == 2
    assert "configuration error" in capsys.readouterr().err
