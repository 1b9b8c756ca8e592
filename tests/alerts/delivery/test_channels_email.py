"""The e-mail channel against a real SMTP server on loopback (aiosmtpd)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from email import message_from_bytes, policy

import pytest

aiosmtpd = pytest.importorskip("aiosmtpd")
from aiosmtpd.controller import Controller  # noqa: E402

from expr_tracker.alerts.delivery.channels import ChannelConfigError, DeliveryError, create_channel  # noqa: E402
from expr_tracker.alerts.delivery.message import AlertMessage  # noqa: E402


def free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Sink:
    def __init__(self):
        self.envelopes = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802
        self.envelopes.append(envelope)
        return "250 OK"


@pytest.fixture
def smtp():
    sink = Sink()
    controller = Controller(sink, hostname="127.0.0.1", port=free_port())
    controller.start()
    yield controller, sink
    controller.stop()


def message():
    return AlertMessage(
        title="NaN <loss>",
        text="loss is <b>NaN</b> & rising",
        level="critical",
        fields={"step": 7, "<k>": "<v>"},
        traceback="Traceback: <frame>",
    )


def test_email_html_and_text(smtp):
    controller, sink = smtp
    ch = create_channel(
        {
            "type": "email",
            "options": {
                "host": "127.0.0.1",
                "port": controller.port,
                "starttls": False,
                "from_addr": "et@example.org",
                "to": ["a@example.org", "b@example.org"],
            },
        }
    )
    result = ch.send(message(), 5.0)
    assert "accepted" in result.body
    (env,) = sink.envelopes
    assert sorted(env.rcpt_tos) == ["a@example.org", "b@example.org"]
    mail = message_from_bytes(env.content, policy=policy.default)
    assert mail["Subject"] == "[expr_tracker] [CRITICAL] NaN <loss>"
    text = mail.get_body(("plain",)).get_content()
    html = mail.get_body(("html",)).get_content()
    assert "loss is <b>NaN</b> & rising" in text
    assert "loss is &lt;b&gt;NaN&lt;/b&gt; &amp; rising" in html
    assert "<b>NaN</b>" not in html and "&lt;k&gt;" in html and "&lt;frame&gt;" in html


def test_email_config_errors():
    with pytest.raises(ChannelConfigError, match="options.host"):
        create_channel({"type": "email", "options": {"from_addr": "a@b", "to": "c@d"}})
    with pytest.raises(ChannelConfigError, match="options.to"):
        create_channel({"type": "email", "options": {"host": "h", "from_addr": "a@b"}})
    with pytest.raises(ChannelConfigError, match="PW_ENV is not set"):
        create_channel(
            {
                "type": "email",
                "options": {"host": "h", "from_addr": "a@b", "to": "c@d", "password_env": "PW_ENV"},
            },
            environ={},
        )


def test_email_unreachable_is_retryable_and_hides_password():
    ch = create_channel(
        {
            "type": "email",
            "options": {
                "host": "127.0.0.1",
                "port": 9,
                "starttls": False,
                "username": "u",
                "password": "SMTP-PASSWORD-XYZ",
                "from_addr": "a@b.org",
                "to": "c@d.org",
            },
        }
    )
    with pytest.raises(DeliveryError) as e:
        ch.send(message(), 2.0)
    assert e.value.retryable
    assert "SMTP-PASSWORD-XYZ" not in str(e.value) + repr(ch)
    assert "SMTP-PASSWORD-XYZ" in ch.secrets()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a certificate")
def test_email_starttls(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    sink = Sink()
    controller = Controller(
        sink, hostname="127.0.0.1", port=free_port(), tls_context=context, require_starttls=True
    )
    controller.start()
    try:
        port = controller.port
        ch = create_channel(
            {
                "type": "email",
                "options": {
                    "host": "127.0.0.1",
                    "port": port,
                    "starttls": True,
                    "ca_file": str(cert),
                    "from_addr": "et@example.org",
                    "to": "a@example.org",
                },
            }
        )
        ch.send(message(), 5.0)
    finally:
        controller.stop()
    assert len(sink.envelopes) == 1
