"""Secrets never reach logs, exceptions, stats, records or repr; et alert / et channels test."""

from __future__ import annotations

import json
import logging

import pytest

from expr_tracker.alerts.delivery import build_dispatcher
from expr_tracker.alerts.message import AlertMessage, redact_url, scrub
from expr_tracker.cli.main import main
from expr_tracker.testing import WebhookServer

TOKEN = "T0KEN-s3cr3t"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)


def test_redact_and_scrub():
    assert redact_url("https://hooks.slack.com/services/T/B/XYZ") == "https://hooks.slack.com/***"
    assert redact_url("https://user:pw@h.example:8443/") == "https://h.example:8443/***"
    assert redact_url("https://h.example") == "https://h.example"
    url = "https://h.example/hook/abcdef?token=zzz999"
    assert scrub(f"failed for {url} and /hook/abcdef", [url]) == "failed for *** and /***"


def test_secrets_absent_everywhere(caplog):
    caplog.set_level(logging.DEBUG)
    records = []
    # the endpoint answers 500 echoing the token back in its body
    with WebhookServer([(500, f"bad token {TOKEN}")]) as server:
        d = build_dispatcher(
            {
                "channels": [
                    {
                        "type": "lark",
                        "url": server.url,
                        "secret": "LARK-SIGNING-SECRET",
                        "policy": {"max_retries": 0},
                    }
                ]
            },
            record=records.append,
        )
        d.submit(AlertMessage("x"))
        d.close(5)
    blob = caplog.text + json.dumps(records) + json.dumps(d.stats()) + repr(d) + repr(d.channels)
    assert TOKEN not in blob and "LARK-SIGNING-SECRET" not in blob
    assert records[0]["error"] == "HTTP 500: bad token ***"


def test_cli_alert_delivers_and_exit_codes(monkeypatch, capsys):
    with WebhookServer() as server:
        monkeypatch.setenv("ET_WEBHOOK_URL", server.url)
        assert main(["alert", "disk almost full", "--level", "error"]) == 0
        assert server.json()["title"] == "disk almost full"
    out = capsys.readouterr().out
    assert "webhook: delivered" in out and TOKEN not in out
    with WebhookServer([(500, "no")]) as server:
        monkeypatch.setenv("ET_WEBHOOK_URL", server.url)
        monkeypatch.setenv("ET_ALERT_CONFIG", str(_policy_file()))
        assert main(["alert", "x"]) == 1
    assert main(["alert", "x", "--level", "loud"]) == 2


def _policy_file():
    import pathlib

    path = pathlib.Path("alerts.yaml")
    path.write_text("alerts:\n  policy:\n    max_retries: 0\n")
    return path


def test_cli_channels_test_reports_answers(monkeypatch, capsys):
    with (
        WebhookServer([(200, '{"code":0,"msg":"success"}')]) as lark,
        WebhookServer([(429, "slow down", {"Retry-After": "3"})]) as slack,
    ):
        monkeypatch.setenv("ET_LARK_WEBHOOK_URL", lark.url)
        monkeypatch.setenv("ET_SLACK_WEBHOOK_URL", slack.url)
        assert main(["channels", "test"]) == 1
        assert main(["channels", "test", "lark", "--json"]) == 0
    out = capsys.readouterr().out
    assert "lark (lark, http://127.0.0.1:" in out and "ok: HTTP 200 code 0 success" in out
    assert "slack (slack," in out and "FAILED: HTTP 429: slow down" in out
    assert json.loads(out.strip().splitlines()[-1])["ok"] is True
    assert TOKEN not in out
    assert main(["channels", "test", "nope"]) == 2
