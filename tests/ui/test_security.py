"""``et ui`` answers only its own origin (docs/ui.md "Security"): a real uvicorn on
127.0.0.1 answering 403 to a foreign ``Host``, 401 without the token, the login that sets
the cookie (and that a cross-origin request cannot use), ``--token``, ``ET_UI_TOKEN`` and
``--no-token`` as the command line takes them."""

from __future__ import annotations

import http.client
import subprocess
import sys
from pathlib import Path

import pytest
from ui_support import TOKEN, Server, env

from expr_tracker.ui.guard import allowed_hosts, host_name
from expr_tracker.ui.server import create_app

TestClient = pytest.importorskip("starlette.testclient").TestClient


def get(server: Server, path: str, headers: dict[str, str] | None = None):
    """A raw request (as curl sends it) to the real server: ``Host`` as given."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{server.port}", **(headers or {})})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_foreign_host_is_refused(ui_server):
    # DNS rebinding: a page at evil.example whose name now points at 127.0.0.1 sends its
    # own name; the token does not help it, the Host rule refuses it before anything else
    port = ui_server.port
    auth = ui_server.auth
    for host in (
        "evil.example",
        f"evil.example:{port}",
        "127.0.0.1.evil.example",
        f"localhost.evil.example:{port}",
        "[::2]",
        "",
    ):
        for path in ("/api/runs", "/", "/static/app.js", f"/?token={TOKEN}"):
            status, _, body = get(ui_server, path, {"Host": host, **auth})
            assert status == 403, (host, path, status)
            assert b"demo/alpha" not in body
    for host in ("127.0.0.1", f"127.0.0.1:{port}", "localhost", f"LOCALHOST:{port}", "[::1]"):
        status, _, body = get(ui_server, "/api/runs", {"Host": host, **auth})
        assert status == 200 and b"demo/alpha" in body, host
    status, _, _ = get(ui_server, "/api/runs", {"Host": f"[::1]:{port}", **auth})
    assert status == 200


def test_token_needed(ui_server):
    for path in ("/api/runs", "/api/run?run=demo%2Falpha", "/api/trace?run=demo%2Falpha"):
        status, headers, body = get(ui_server, path)
        assert status == 401 and b"token" in body and b"alpha" not in body, path
        status, _, _ = get(ui_server, path, {"Authorization": "token wrong"})
        assert status == 401
        status, _, _ = get(ui_server, path, {"Cookie": f"et_ui_token_{ui_server.port}=wrong"})
        assert status == 401
        status, _, _ = get(ui_server, path, {"Authorization": f"Token {TOKEN}"})
        assert status == 200, path
    # the page itself: a login form, no data
    status, headers, body = get(ui_server, "/")
    assert status == 401 and b"<form" in body and "text/html" in headers["content-type"]
    # static files hold no data: served without the token
    status, _, body = get(ui_server, "/static/app.js")
    assert status == 200 and b"use strict" in body


def test_login_sets_the_cookie_and_drops_the_token(ui_server):
    status, headers, _ = get(ui_server, f"/?token={TOKEN}")
    assert status == 303 and headers["location"] == "/"
    cookie = headers["set-cookie"]
    name = f"et_ui_token_{ui_server.port}"
    assert cookie.startswith(f"{name}={TOKEN};")
    for attr in ("HttpOnly", "SameSite=Strict", "Path=/"):
        assert attr in cookie, cookie
    status, _, body = get(ui_server, "/api/runs", {"Cookie": f"{name}={TOKEN}"})
    assert status == 200 and b"demo/alpha" in body
    status, _, body = get(ui_server, "/", {"Cookie": f"other=1; {name}={TOKEN}"})
    assert status == 200 and b"app.js" in body
    # a wrong token logs nobody in
    status, headers, _ = get(ui_server, "/?token=nope")
    assert status == 401 and "set-cookie" not in headers


def test_cross_origin_login_is_refused(ui_server):
    port = ui_server.port
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": f"http://127.0.0.1:{port + 1}"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # another port of this host: same site
    ):
        status, h, _ = get(ui_server, f"/?token={TOKEN}", headers)
        assert status == 403 and "set-cookie" not in h, headers
    # the server's own origin, or a link opened from outside any page, logs in
    for headers in (
        {"Origin": f"http://127.0.0.1:{port}"},
        {"Sec-Fetch-Site": "none"},
        {"Sec-Fetch-Site": "same-origin"},
    ):
        status, h, _ = get(ui_server, f"/?token={TOKEN}", headers)
        assert status == 303 and "set-cookie" in h, headers


def test_host_names_parsed():
    assert host_name("127.0.0.1:8050") == "127.0.0.1"
    assert host_name("[::1]:8050") == "::1" and host_name("[::1]") == "::1"
    assert host_name("LocalHost") == "localhost"
    for bad in ("::1", "[::1", "[nope]", "localhost:x", "", "[::1]x"):
        assert host_name(bad) is None, bad
    assert allowed_hosts("[::1]") >= {"::1", "localhost", "127.0.0.1"}
    assert "box.lan" in allowed_hosts("box.lan")


def test_the_host_value_is_allowed(ui_runs, tmp_path):
    app = create_app(ui_runs, cache_dir=tmp_path, token=TOKEN, host="box.lan", port=9000)
    auth = {"Authorization": f"token {TOKEN}"}
    for base in ("http://box.lan:9000", "http://box.lan", "http://localhost:9000"):
        r = TestClient(app, base_url=base).get("/api/runs", headers=auth)
        assert r.status_code == 200, base
    r = TestClient(app, base_url="http://other.lan:9000").get("/api/runs", headers=auth)
    assert r.status_code == 403


def test_a_bad_token_is_refused(ui_runs, tmp_path):
    with pytest.raises(ValueError, match="A-Z"):
        create_app(ui_runs, cache_dir=tmp_path, token="has space")
    e = env()
    e["ET_UI_TOKEN"] = "a;b"
    p = subprocess.run(
        [sys.executable, "-m", "expr_tracker.cli.main", "ui", str(ui_runs)],
        env=e,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "ET_UI_TOKEN is not valid" in p.stderr, p.stderr


def _printed(server: Server) -> str:
    """What ``et ui`` printed (it prints before serving, nothing after)."""
    server.close()
    return server.rest.decode()


@pytest.mark.slow
def test_cli_token_sources(ui_runs, tmp_path: Path):
    import httpx

    # the default: a random token, printed in the link, and the link logs a browser in
    s = Server(ui_runs, tmp_path / "c1", token="")
    try:
        assert get(s, "/api/runs")[0] == 401
    finally:
        out = _printed(s)
    token = out.split(f"http://127.0.0.1:{s.port}/?token=")[1].split()[0]
    assert len(token) >= 40 and token != TOKEN
    # ET_UI_TOKEN sets it (every test server uses it); a browser's first visit with it
    # gets the cookie and the page
    s = Server(ui_runs, tmp_path / "c2", token=TOKEN)
    try:
        assert get(s, "/api/runs", s.auth)[0] == 200 and get(s, "/api/runs")[0] == 401
        with httpx.Client(base_url=s.url, timeout=30) as c:
            r = c.get(f"/?token={TOKEN}", follow_redirects=True)
            assert r.status_code == 200 and str(r.url) == s.url + "/"
            assert c.get("/api/runs").status_code == 200
    finally:
        out = _printed(s)
    assert f"http://127.0.0.1:{s.port}/?token={TOKEN} " in out
    # --token VALUE
    s = Server(ui_runs, tmp_path / "c3", token=None, args=("--token", "cli-token"))
    s.token = "cli-token"
    try:
        assert get(s, "/api/runs", s.auth)[0] == 200
    finally:
        out = _printed(s)
    assert "?token=cli-token " in out
    # --no-token: one warning; the Host rule stays
    s = Server(ui_runs, tmp_path / "c4", token=None)
    try:
        assert get(s, "/api/runs")[0] == 200
        assert get(s, "/api/runs", {"Host": "evil.example"})[0] == 403
    finally:
        out = _printed(s)
    assert out.count("warning") == 1 and "--no-token" in out and "?token=" not in out, out


def test_other_cookies_of_the_host_do_not_lock_the_user_out(ui_server):
    # browsers send every cookie of 127.0.0.1, whatever port set it: another app on this
    # machine (or a neighbour's page on another port) may hold a JSON value, a space, a
    # quote, a name without a value, or a second cookie of our name (cookie tossing with a
    # longer Path, sent first). None of them may hide the right token.
    name = f"et_ui_token_{ui_server.port}"
    for others in (
        'prefs={"theme":"dark"}',
        "greeting=hello world",
        'a="b',
        "flag",
        "x=\\",
        f"{name}=wrong",
    ):
        for header in (f"{others}; {name}={TOKEN}", f"{name}={TOKEN}; {others}"):
            status, _, body = get(ui_server, "/api/runs", {"Cookie": header})
            assert status == 200 and b"demo/alpha" in body, header
    # and still nothing without the right one
    status, _, _ = get(ui_server, "/api/runs", {"Cookie": f'a="b; {name}=wrong; {name}=x'})
    assert status == 401
