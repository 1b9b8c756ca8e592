"""Each webhook channel against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import urllib.parse

import pytest

from expr_tracker.alerts.delivery.channels import ChannelConfigError, DeliveryError, create_channel
from expr_tracker.alerts.delivery.channels.bounded_http import parse_retry_after
from expr_tracker.alerts.delivery.message import AlertMessage
from expr_tracker.testing import WebhookServer

SECRET = "sig-SECRET-1234"


pytestmark = pytest.mark.usefixtures("no_proxy")


def msg(**kw):
    base = dict(
        title="loss <spike> & *boom*",
        text="loss went to 9.1 <@all>",
        level="error",
        fields={"step": 12, "loss": 9.123456789},
        tags=("train",),
    )
    base.update(kw)
    return AlertMessage(**base)


def test_lark_card_signed():
    with WebhookServer([(200, '{"code":0,"msg":"success"}')]) as server:
        ch = create_channel({"type": "lark", "url": server.url, "secret": SECRET})
        result = ch.send(msg(), 2.0)
        assert result.status == 200
        body = server.json()
    assert body["msg_type"] == "interactive"
    card = body["card"]
    assert card["header"]["title"]["content"] == "loss <spike> & *boom*"  # plain_text, literal
    assert card["header"]["template"] == "red"
    ts = body["timestamp"]
    key = f"{ts}\n{SECRET}".encode()
    expected = base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()
    assert body["sign"] == expected
    fields = [e for e in card["elements"] if "fields" in e][0]["fields"]
    assert fields[1]["text"]["content"] == "**loss**\n9.12346"


def test_lark_service_error_and_malformed():
    with WebhookServer([(200, '{"code":19021,"msg":"sign match fail"}'), (200, "<html>")]) as s:
        ch = create_channel({"type": "lark", "url": s.url})
        with pytest.raises(DeliveryError) as e1:
            ch.send(msg(), 2.0)
        assert not e1.value.retryable and "19021" in e1.value.reason
        with pytest.raises(DeliveryError) as e2:
            ch.send(msg(), 2.0)
        assert "malformed" in e2.value.reason and not e2.value.retryable


def test_slack_blocks_escaped():
    with WebhookServer([(200, "ok")]) as server:
        ch = create_channel({"type": "slack", "url": server.url, "options": {"username": "bot"}})
        assert ch.send(msg(), 2.0).status == 200
        body = server.json()
    assert body["username"] == "bot"
    assert "&lt;@all&gt;" in body["blocks"][1]["text"]["text"]
    assert "<@all>" not in str(body)
    assert body["text"].startswith("[ERROR] loss &lt;spike&gt; &amp;")
    assert [b["type"] for b in body["blocks"]] == ["header", "section", "section", "context"]


def test_slack_429_retry_after_and_500():
    script = [(429, "rate_limited", {"Retry-After": "7"}), (500, "oops"), (404, "no_service")]
    with WebhookServer(script) as server:
        ch = create_channel({"type": "slack", "url": server.url})
        with pytest.raises(DeliveryError) as e:
            ch.send(msg(), 2.0)
        assert (e.value.status, e.value.retry_after) == (429, 7.0)
        with pytest.raises(DeliveryError) as e:
            ch.send(msg(), 2.0)
        assert e.value.status == 500 and e.value.body == "oops"
        with pytest.raises(DeliveryError) as e:
            ch.send(msg(), 2.0)
        assert e.value.status == 404
        assert server.url not in str(e.value) and "T0KEN" not in repr(e.value.__dict__)


def test_dingtalk_signed_url():
    with WebhookServer(
        [(200, '{"errcode":0,"errmsg":"ok"}')], path="/robot/send?access_token=TOK123456"
    ) as s:
        ch = create_channel({"type": "dingtalk", "url": s.url, "secret": SECRET})
        ch.send(msg(mentions=("13800000000",)), 2.0)
        _, path, _, _ = s.requests[0]
        body = s.json()
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    ts = query["timestamp"][0]
    string = f"{ts}\n{SECRET}".encode()
    sign = base64.b64encode(hmac.new(SECRET.encode(), string, hashlib.sha256).digest()).decode()
    assert query["sign"][0] == sign and query["access_token"] == ["TOK123456"]
    assert body["msgtype"] == "markdown"
    assert "&lt;spike&gt;" in body["markdown"]["text"]
    assert body["at"]["atMobiles"] == ["13800000000"]


def test_dingtalk_rate_limit_code_is_retryable():
    with WebhookServer([(200, '{"errcode":130101,"errmsg":"send too fast"}')]) as s:
        ch = create_channel({"type": "dingtalk", "url": s.url})
        with pytest.raises(DeliveryError) as e:
            ch.send(msg(), 2.0)
    assert e.value.retryable


def test_wecom_markdown():
    with WebhookServer([(200, '{"errcode":0,"errmsg":"ok"}')]) as s:
        create_channel({"type": "wecom", "url": s.url}).send(msg(mentions=("zhang",)), 2.0)
        body = s.json()
    assert body["msgtype"] == "markdown" and "<@zhang>" in body["markdown"]["content"]


def test_generic_webhook_template_and_headers():
    template = {
        "summary": "{LEVEL}: {title}",
        "step": "{step}",
        "data": "{fields}",
        "x": "{a.__class__}",
    }
    with WebhookServer([(201, "")]) as s:
        ch = create_channel(
            {
                "type": "webhook",
                "url": s.url,
                "options": {
                    "template": template,
                    "method": "PUT",
                    "headers": {"Authorization": "Bearer HDRSECRET"},
                },
            }
        )
        assert ch.send(msg(step=12), 2.0).status == 201
        method, _, headers, _ = s.requests[0]
        body = s.json()
    assert method == "PUT" and headers["Authorization"] == "Bearer HDRSECRET"
    assert body == {
        "summary": "ERROR: loss <spike> & *boom*",
        "step": "12",
        "data": {"step": 12, "loss": 9.123456789},
        "x": "{a.__class__}",
    }
    assert "Bearer HDRSECRET" in ch.secrets()


def test_generic_webhook_default_body():
    with WebhookServer() as s:
        create_channel({"type": "webhook", "url": s.url}).send(msg(), 2.0)
        body = s.json()
    assert body["title"] == "loss <spike> & *boom*" and body["tags"] == ["train"]


def test_generic_webhook_body_is_strict_json_with_non_finite_fields():
    """A rule on a diverging metric puts NaN/inf in the message's fields: the default body is
    strict JSON (any receiver parses it) and keeps which value it was, as every other strict
    JSON output of ours writes it ("NaN", "Infinity", "-Infinity")."""
    fields = {"loss": float("nan"), "grad": float("inf"), "lr": float("-inf"), "obj": object()}
    with WebhookServer() as s:
        create_channel({"type": "webhook", "url": s.url}).send(msg(fields=fields), 2.0)
        raw = s.requests[-1][3]
    body = json.loads(raw, parse_constant=lambda c: pytest.fail(f"non-JSON token {c}"))
    assert body["fields"]["loss"] == "NaN"
    assert body["fields"]["grad"] == "Infinity" and body["fields"]["lr"] == "-Infinity"
    assert body["fields"]["obj"].startswith("<object object")


def test_hanging_endpoint_times_out():
    with WebhookServer(["hang"]) as s:
        ch = create_channel({"type": "webhook", "url": s.url})
        with pytest.raises(DeliveryError) as e:
            ch.send(msg(), 0.3)
    assert e.value.reason == "timed out" and e.value.retryable


def test_connection_refused_is_retryable_and_redacted():
    with WebhookServer() as s:
        url = s.url
    ch = create_channel({"type": "slack", "url": url})
    with pytest.raises(DeliveryError) as e:
        ch.send(msg(), 1.0)
    assert e.value.retryable and "T0KEN" not in str(e.value)
    assert "T0KEN" not in repr(ch) and repr(ch).endswith("/***')")


def test_config_errors_raise_with_path():
    with pytest.raises(ChannelConfigError, match=r"alerts.channels.s: a slack channel needs `url`"):
        create_channel({"type": "slack", "name": "s"})
    with pytest.raises(ChannelConfigError, match="unknown option"):
        create_channel({"type": "slack", "url": "https://x/y", "options": {"bogus": 1}})
    with pytest.raises(ChannelConfigError, match="unknown channel type 'nope'"):
        create_channel({"type": "nope"})
    with pytest.raises(ChannelConfigError, match="MISSING_VAR is not set"):
        create_channel({"type": "slack", "url_env": "MISSING_VAR"}, environ={})
    with pytest.raises(ChannelConfigError, match="must start with http") as e:
        create_channel({"type": "slack", "url": "ftp://h/SECRETPATH"})
    assert "SECRETPATH" not in str(e.value)


def test_url_env_read_at_configuration():
    ch = create_channel(
        {"type": "slack", "url_env": "MY_URL"}, environ={"MY_URL": "https://h.example/a/b"}
    )
    assert ch.url == "https://h.example/a/b"


@pytest.mark.parametrize(
    ("value", "expected"), [("5", 5.0), ("0.5", 0.5), (None, None), ("junk", None), ("-3", 0.0)]
)
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value) == expected


def test_parse_retry_after_http_date():
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
