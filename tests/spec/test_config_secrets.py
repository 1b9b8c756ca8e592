"""Credentials never echoed: passwords holding ``/ # ? @`` in webhook URLs (slack, lark,
webhook, dingtalk, wecom) and SMTP passwords, driven through a failing HTTP server on
127.0.0.1 (it echoes the request path and the decoded credentials back) and an unreachable
port, looked for in every place a secret could surface: raised errors, logs (caplog,
stdout/stderr), ``alerts.jsonl``, ``et.info()``, ``spec.json``, ``config.json`` (the whole
Hydra-style cfg passed as config, tracker section included), ``repr``/``str`` of the spec,
of the channel specs and of the channel objects, and ``et config validate|show``."""

from __future__ import annotations

import base64
import http.server
import json
import logging
import socket
import subprocess
import sys
import threading
from urllib.parse import quote, unquote

import pytest

import expr_tracker as et
from expr_tracker.cli.main import main
from expr_tracker.spec import SpecError

omegaconf = pytest.importorskip("omegaconf")

#: one password per character urllib splits URLs at, and one holding all of them; every
#: piece between those characters is long and distinctive, so a partial leak is caught too
PASSWORDS = {
    "slash": "Hunter42/Zebra977",
    "hash": "Hunter42#Zebra977",
    "query": "Hunter42?Zebra977",
    "at": "Hunter42@Zebra977",
    "all": "Hunter42/Zebra977#Quokka31?Lemur555@Marmot88",
}
KINDS = ["slack", "lark", "webhook", "dingtalk", "wecom"]
USER = "botuser"


def forbidden(password: str) -> list[str]:
    """Every form of ``password`` that must never appear: as written, percent-encoded, as
    the Basic auth value, and each piece between the characters URLs are split at."""
    pieces = [password, quote(password, safe=""), quote(password, safe="/:")]
    pieces.append(base64.b64encode(f"{USER}:{password}".encode()).decode())
    for sep in "/#?@":
        password = password.replace(sep, " ")
    pieces += [p for p in password.split() if len(p) >= 6]
    return pieces


def assert_hidden(password: str, *texts: str) -> None:
    blob = "\n".join(texts)
    leaked = [p for p in forbidden(password) if p in blob]
    assert not leaked, f"{leaked} leaked in:\n{blob[:3000]}"


class _EchoHandler(http.server.BaseHTTPRequestHandler):
    """Fails every request (HTTP 500) and echoes what a careless service would: the
    request path, the Authorization header and the credentials decoded from it."""

    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        auth = self.headers.get("Authorization") or ""
        decoded = ""
        if auth.startswith("Basic "):
            decoded = base64.b64decode(auth[6:]).decode("utf-8", "replace")
        self.server.seen.append((self.path, decoded))
        headers = "; ".join(f"{k}={v}" for k, v in self.headers.items() if k.startswith("X-"))
        body = f"{headers} error at {self.path} for {auth} ({decoded}) / {unquote(self.path)}"
        body = body.encode()
        self.send_response(500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def failing_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoHandler)
    server.daemon_threads = True
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def unreachable_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed on return: nothing listens there


POLICY = {
    "async_send": False,
    "timeout": 3,
    "max_retries": 1,
    "backoff_initial": 0.01,
    "jitter": 0,
    "rate_limit_per_minute": None,
    "dedup_window": 0,
    "retry_on_status": [500],
}


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for var in (
        "ET_CONFIG",
        "ET_ALERT_CONFIG",
        "WEBHOOK_URL",
        "ET_LARK_WEBHOOK_URL",
        "ET_SLACK_WEBHOOK_URL",
        "ET_DINGTALK_WEBHOOK_URL",
        "ET_WECOM_WEBHOOK_URL",
        "ET_WEBHOOK_URL",
    ):
        monkeypatch.delenv(var, raising=False)
    yield
    if et.get_run() is not None:
        et.finish()


def run_and_collect(tmp_path, channels, password, caplog, capfd):
    """Start a run from a Hydra-style cfg (config = the whole cfg, spec = its tracker
    section), send one alert that fails on every channel, finish; every text a secret
    could reach."""
    from omegaconf import OmegaConf

    caplog.set_level(logging.DEBUG)
    cfg = OmegaConf.create(
        {
            "lr": 0.1,
            "max_tokens": 512,
            "tracker": {
                "project": "p",
                "name": "r",
                "dir": str(tmp_path / "runs"),
                "alerts": {"policy": POLICY, "channels": channels},
            },
        }
    )
    run = et.init(spec=cfg.tracker, config=cfg)
    assert et.alert("disk almost full", "92% used", level="error") is False
    info = json.dumps(et.info(), default=str)
    lanes = run.dispatcher.lanes
    objects = [repr(lane.channel) + str(lane.channel) for lane in lanes.values()]
    specs = [repr(c) + str(c) for c in run.spec.alerts.channels]
    texts = [info, repr(run.spec), str(run.spec), *objects, *specs]
    et.finish()
    run_dir = tmp_path / "runs" / "p" / "r"
    records = [json.loads(line) for line in (run_dir / "alerts.jsonl").read_text().splitlines()]
    config = json.loads((run_dir / "config.json").read_text())
    out, err = capfd.readouterr()
    texts += [
        (run_dir / "alerts.jsonl").read_text(),
        (run_dir / "spec.json").read_text(),
        (run_dir / "config.json").read_text(),
        caplog.text,
        out,
        err,
    ]
    assert_hidden(password, *texts)
    assert config["lr"] == 0.1 and config["max_tokens"] == 512  # the rest is kept
    return [r for r in records if r.get("kind") == "delivery"]


@pytest.mark.parametrize("which", sorted(PASSWORDS))
@pytest.mark.parametrize("kind", KINDS)
def test_webhook_password_never_echoed(tmp_path, caplog, capfd, failing_server, kind, which):
    password = PASSWORDS[which]
    port = failing_server.server_address[1]
    encoded = quote(password, safe="")
    channels = {
        "served": {
            "type": kind,
            "url": f"http://{USER}:{encoded}@127.0.0.1:{port}/hook/T0KEN-abcdef123",
        },
        "unreachable": {
            "type": kind,
            "url": f"http://{USER}:{encoded}@127.0.0.1:{unreachable_port()}/hook/T0KEN-abcdef123",
        },
    }
    if kind == "webhook":  # header values are secrets too (echoed back by the server)
        for entry in channels.values():
            entry["options"] = {"headers": {"X-Api-Key": password}}
    records = run_and_collect(tmp_path, channels, password, caplog, capfd)
    outcome = {r["channel"]: r for r in records}
    assert outcome["served"]["delivered"] is False and "HTTP 500" in outcome["served"]["error"]
    assert outcome["unreachable"]["delivered"] is False
    assert "refused" in outcome["unreachable"]["error"]
    # the server really got the credentials (as Basic auth), and echoed them back
    assert failing_server.seen and failing_server.seen[0][1] == f"{USER}:{password}"


@pytest.mark.parametrize("which", sorted(PASSWORDS))
def test_raw_password_with_at_sign_only_is_sent(tmp_path, caplog, capfd, failing_server, which):
    """An unencoded password is unambiguous when it holds only ``@`` (the host is after
    the last one); it reaches the server as Basic auth and is echoed nowhere."""
    password = PASSWORDS[which]
    if any(c in password for c in "/#?"):
        pytest.skip("covered by test_raw_password_that_splits_the_url_is_rejected")
    port = failing_server.server_address[1]
    channels = {
        "served": {"type": "webhook", "url": f"http://{USER}:{password}@127.0.0.1:{port}/h"}
    }
    (record,) = run_and_collect(tmp_path, channels, password, caplog, capfd)
    assert "HTTP 500" in record["error"]
    assert failing_server.seen[0][1] == f"{USER}:{password}"


@pytest.mark.parametrize("source", ["spec", "env"])
@pytest.mark.parametrize("which", ["slash", "hash", "query", "all"])
def test_raw_password_that_splits_the_url_is_rejected(
    tmp_path, monkeypatch, caplog, capsys, which, source
):
    """``https://user:p/a#s?@x@host/path``: urllib reads host ``user`` and a port made of
    the password; such a URL is a configuration error naming the field, never echoed."""
    caplog.set_level(logging.DEBUG)
    password = PASSWORDS[which]
    url = f"https://{USER}:{password}@hooks.example.org/services/T0KEN-abcdef123"
    spec = {"project": "p", "name": "r", "dir": str(tmp_path / "runs")}
    if source == "env":
        monkeypatch.setenv("ET_SLACK_WEBHOOK_URL", url)
    else:
        spec["alerts"] = {"channels": {"slack": {"type": "slack", "url": url}}}
    with pytest.raises(SpecError) as err:
        et.init(spec=spec)
    assert [i.path for i in err.value.issues] == ["alerts.channels.slack.url"]
    assert "percent-encode" in str(err.value)
    texts = [str(err.value), repr(err.value), caplog.text]
    # the same through the CLI: validate (the file) and show (with the environment)
    f = tmp_path / "run.yaml"
    f.write_text(json.dumps(spec))
    # (validate reads the file alone: with the URL in the environment the file is fine)
    assert main(["config", "validate", str(f)]) == (1 if source == "spec" else 0)
    assert main(["config", "show", str(f), "--format", "json"]) == 0
    if source == "env":  # the commands that build the channels from the environment
        assert main(["alert", "disk almost full", "--timeout", "5"]) == 2
        assert main(["channels", "test", "--timeout", "5"]) != 0
    out, err_text = capsys.readouterr()
    if source == "spec":
        assert "alerts.channels.slack.url" in out.split("FAILED")[1]
    texts += [out, err_text]
    assert_hidden(password, *texts)


def test_scrub_and_redact_url_read_the_url_conservatively():
    from expr_tracker.alerts.delivery.scrub import redact_url, scrub

    url = "https://user:p/a#s?@x@host/path"
    assert redact_url(url) == "https://***"
    text = scrub("InvalidURL: nonnumeric port: 'p/a#s?@x' (user:p/a#s?@x@host)", [url])
    assert "p/a#s?@x" not in text and "user:p" not in text
    assert redact_url("https://user:p@ss@h.example/x") == "https://h.example/***"


def _smtp_controller(port):
    aiosmtpd = pytest.importorskip("aiosmtpd")  # noqa: F841
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    class Handler:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802
            return "250 OK"

    def deny(server, session, envelope, mechanism, auth_data):
        return AuthResult(success=False, handled=False)

    return Controller(
        Handler(),
        hostname="127.0.0.1",
        port=port,
        authenticator=deny,
        auth_require_tls=False,
    )


@pytest.mark.parametrize("which", sorted(PASSWORDS))
def test_smtp_password_never_echoed(tmp_path, caplog, capfd, which):
    password = PASSWORDS[which]
    port = unreachable_port()
    controller = _smtp_controller(port)
    controller.start()
    try:
        base = {
            "host": "127.0.0.1",
            "starttls": False,
            "username": USER,
            "password": password,
            "from_addr": "et@example.org",
            "to": ["ops@example.org"],
        }
        channels = {
            "served": {"type": "email", "options": {**base, "port": port}},
            "unreachable": {"type": "email", "options": {**base, "port": unreachable_port()}},
        }
        records = run_and_collect(tmp_path, channels, password, caplog, capfd)
    finally:
        controller.stop()
    outcome = {r["channel"]: r for r in records}
    assert "authentication failed" in outcome["served"]["error"]
    assert "connection failed" in outcome["unreachable"]["error"]


def test_validate_and_show_never_echo_header_or_smtp_secrets(tmp_path):
    """Options of the wrong type next to secrets: the CLI names the field, hides the rest."""
    password = PASSWORDS["all"]
    f = tmp_path / "run.yaml"
    f.write_text(
        json.dumps(
            {
                "alerts": {
                    "channels": {
                        "hook": {
                            "type": "webhook",
                            "url": f"https://{USER}:{quote(password, safe='')}@h.example/x",
                            "options": {"headers": {"Authorization": password}, "method": 7},
                        },
                        "mail": {
                            "type": "email",
                            "options": {"host": "h", "password": password, "port": "x"},
                        },
                    }
                }
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "expr_tracker.cli.main", "config", "validate", str(f)],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the checkout: the package under test is the one installed
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "alerts.channels.hook.options.method" in result.stdout
    assert "alerts.channels.mail.options.port" in result.stdout
    assert "Traceback" not in result.stderr and "SUCCESS" not in result.stdout
    shown = subprocess.run(
        [sys.executable, "-m", "expr_tracker.cli.main", "config", "show", str(f)],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the checkout: the package under test is the one installed
    )
    assert_hidden(password, result.stdout, result.stderr, shown.stdout, shown.stderr)


def test_config_json_hides_credentials_and_keeps_hyperparameters(tmp_path):
    """config.json is the user's data: credentials go, everything else stays as written."""
    token = "XoXb-T0KEN-7a1b2c3d"
    config = {
        "lr": 3e-4,
        "max_tokens": 512,
        "tokenizer": "bert-base-uncased",
        "dataset_url": "https://huggingface.co/datasets/mnist",
        "hf_token": token,
        "slack_url": f"https://hooks.slack.com/services/T000/B000/{token}",
        "db": f"postgresql://trainer:{token}@db.internal/runs",
        "client": {"headers": {"X-Api": token}, "apiKey": token},
        "tracker": {
            "alerts": {"channels": [{"type": "webhook", "url": f"https://h.example/{token}"}]}
        },
    }
    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"), config=config)
    et.finish()
    text = (run.dir / "config.json").read_text()
    assert token not in text and token not in repr(run.spec) + str(run.spec)
    saved = json.loads(text)
    assert saved["lr"] == 3e-4 and saved["max_tokens"] == 512
    assert saved["tokenizer"] == "bert-base-uncased"
    assert saved["dataset_url"] == "https://huggingface.co/datasets/mnist"
    assert saved["slack_url"] == "https://hooks.slack.com/***"
    assert saved["db"] == "postgresql://***@db.internal/runs"
    assert saved["tracker"]["alerts"]["channels"][0] == {"type": "webhook", "url": "***"}
    assert run.config["hf_token"] == token  # the run's own copy in memory is the user's
