"""Secrets never reach logs, exceptions, stats, records or repr; et alert / et channels test."""

from __future__ import annotations

import json
import logging

import pytest

from expr_tracker.alerts.delivery.message import AlertMessage
from expr_tracker.alerts.delivery.scrub import redact_url, scrub
from expr_tracker.assemble import build_dispatcher
from expr_tracker.cli.main import main
from expr_tracker.testing import WebhookServer

TOKEN = "T0KEN-s3cr3t"


pytestmark = pytest.mark.usefixtures("no_proxy")


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


@pytest.mark.slow
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


# ---------------------------------------------------------------- response bodies, userinfo

PASSWORD = "hunter2-PASSWORD"
HEADER_TOKEN = "hdr-TOKEN-0123456789"


def _echo_server(status=500):
    """Answers ``status`` with a body echoing every secret of the channel, the token cut by
    the excerpt limit, control characters and a long tail."""
    import base64

    basic = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    body = (
        f"denied\n\x1b[31m token={TOKEN} pw={PASSWORD} hdr=Bearer {HEADER_TOKEN} "
        f"auth=Basic {basic} " + "x" * 120 + TOKEN + "y" * 5000
    )
    return WebhookServer([(status, body)])


def _userinfo_url(server, password=PASSWORD):
    return server.url.replace("http://", f"http://alice:{password}@")


def _leaks(blob):
    import base64

    basic = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    pieces = (TOKEN[:8], PASSWORD[:8], HEADER_TOKEN[:10], basic[:12])
    return [p for p in pieces if p in blob]


def test_userinfo_url_is_sent_as_basic_auth():
    import base64

    with WebhookServer() as server:
        d = build_dispatcher(
            {"channels": [{"type": "webhook", "name": "wh", "url": _userinfo_url(server)}]},
            start=False,
        )
        assert d.lanes["wh"].channel.target == f"http://127.0.0.1:{server.port}/***"
        result = d.submit(AlertMessage("auth"), wait=True)
        d.close(2)
        assert result.delivered == {"wh": True}, result.detail
        method, path, headers, _ = server.requests[0]
    assert path == "/hook/T0KEN-s3cr3t"
    expected = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    assert headers["Authorization"] == f"Basic {expected}"


def test_userinfo_percent_encoded_and_explicit_header_wins():
    import base64

    with WebhookServer() as server:
        url = _userinfo_url(server, "p%40ss%3Aw%2Frd")  # p@ss:w/rd
        d = build_dispatcher(
            {
                "channels": [
                    {"type": "webhook", "name": "a", "url": url},
                    {
                        "type": "webhook",
                        "name": "b",
                        "url": url,
                        "options": {"headers": {"Authorization": "Bearer xyz-123456"}},
                    },
                ]
            },
            start=False,
        )
        assert d.submit(AlertMessage("auth"), wait=True).delivered == {"a": True, "b": True}
        d.close(2)
        auth = sorted(r[2]["Authorization"] for r in server.requests)
    assert auth == ["Basic " + base64.b64encode(b"alice:p@ss:w/rd").decode(), "Bearer xyz-123456"]


def test_scrub_removes_userinfo_and_encoded_secrets():
    url = "http://alice:pw@127.0.0.1:9/x"
    assert scrub(f"failed for {url}", [url]) == "failed for ***"
    assert scrub("host alice:pw@127.0.0.1 said no", [url]) == "host ***@127.0.0.1 said no"
    long_pw = f"http://alice:{PASSWORD}@h.example/x"
    assert scrub(f"echo {PASSWORD}", [long_pw]) == "echo ***"
    assert scrub("tok%2Fen-123456", ["tok/en-123456"]) == "***"
    assert scrub(f"got {HEADER_TOKEN}", [f"Bearer {HEADER_TOKEN}"]) == "got ***"


def test_echoed_secrets_absent_from_logs_records_and_stats(caplog):
    caplog.set_level(logging.DEBUG)
    records = []
    with _echo_server() as server:
        d = build_dispatcher(
            {
                "channels": [
                    {
                        "type": "webhook",
                        "name": "wh",
                        "url": _userinfo_url(server),
                        "options": {"headers": {"Authorization": f"Bearer {HEADER_TOKEN}"}},
                        "policy": {"max_retries": 0, "fail_silently": False},
                    }
                ]
            },
            record=records.append,
        )
        d.submit(AlertMessage("x"))
        d.close(5)
    blob = caplog.text + json.dumps(records) + json.dumps(d.stats()) + repr(d) + repr(d.channels)
    assert _leaks(blob) == []
    error = records[0]["error"]
    assert error.startswith("HTTP 500: denied ?[31m token=*** pw=*** hdr=*** auth=*** xxx")
    assert "\n" not in error and "\x1b" not in error
    assert len(error) <= len("HTTP 500: ") + 200  # a short excerpt, not the whole body
    assert d.stats()["wh"]["last_error"] == error


def test_echoed_secrets_absent_from_both_clis(monkeypatch, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    with _echo_server() as server:
        monkeypatch.setenv("ET_HOOK_URL", _userinfo_url(server))
        monkeypatch.setenv("ET_HOOK_TOKEN", f"Bearer {HEADER_TOKEN}")
        import pathlib

        pathlib.Path("alerts.yaml").write_text(
            "alerts:\n"
            "  policy: {max_retries: 0}\n"
            "  channels:\n"
            "    - type: webhook\n"
            "      name: wh\n"
            "      url_env: ET_HOOK_URL\n"
            "      options: {headers_env: {Authorization: ET_HOOK_TOKEN}}\n"
        )
        assert main(["alert", "x", "--config", "alerts.yaml"]) == 1
        assert main(["channels", "test", "--config", "alerts.yaml"]) == 1
        assert main(["channels", "test", "--config", "alerts.yaml", "--json"]) == 1
    captured = capsys.readouterr()
    blob = captured.out + captured.err + caplog.text
    assert _leaks(blob) == []
    assert "wh: FAILED: HTTP 500: denied ?[31m token=*** pw=*** hdr=*** auth=***" in captured.out
    assert "wh (webhook, http://127.0.0.1:" in captured.out
    row = json.loads(captured.out.strip().splitlines()[-1])
    assert row["status"] == 500 and len(row["answer"]) <= len("HTTP 500: ") + 200


def test_success_answer_is_a_scrubbed_excerpt():
    records = []
    with WebhookServer([(200, f"ok {TOKEN} " + "z" * 3000)]) as server:
        d = build_dispatcher(
            {"channels": [{"type": "webhook", "name": "wh", "url": server.url}]},
            record=records.append,
        )
        d.submit(AlertMessage("x"))
        d.close(5)
    answer = records[0]["answer"]
    assert answer.startswith("HTTP 200 ok *** zzz") and len(answer) <= 200
    assert TOKEN not in json.dumps(records)
