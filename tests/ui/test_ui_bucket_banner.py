"""The runs page of ``et ui URL`` says when the bucket could not be read (docs/team.md "The
dashboard over a bucket"): ``refreshNote`` of app.js run by node on ``/api/runs`` answers,
and a real ``et ui file://...`` in headless Chromium whose bucket folder goes away."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from helpers import ROOT

APP_JS = ROOT / "expr_tracker" / "ui" / "static" / "app.js"


def _refresh_note(answers: list[dict]) -> list[str]:
    """``refreshNote(answer)`` of app.js for each answer, run by node."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to run app.js's refreshNote")
    js = APP_JS.read_text()
    start = js.index("function refreshNote(d)")
    body = js[start : js.index("\n}\n", start) + 2]
    script = f"{body}\nconsole.log(JSON.stringify({json.dumps(answers)}.map(refreshNote)));"
    proc = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_refresh_note_says_what_the_server_reported():
    problems = [f"proj/r{i}: part missing" for i in range(5)]
    notes = _refresh_note(
        [
            {"runs": []},
            {"refresh_error": "list s3://b/_manifests/: SlowDown (HTTP 503)"},
            {"refresh_problems": problems[:1]},
            {"refresh_problems": problems},
            {"refresh_problems": []},
        ]
    )
    assert notes[0] == "" and notes[4] == ""
    assert "could not be read" in notes[1] and "SlowDown (HTTP 503)" in notes[1]
    assert notes[2] == "1 producer of the bucket not copied: proj/r0: part missing"
    assert notes[3].startswith("5 producers") and "proj/r2" in notes[3]
    assert "proj/r3" not in notes[3] and notes[3].endswith("…")


@pytest.mark.slow  # ~6 s: a whole et ui process and a headless Chromium
def test_the_runs_page_shows_a_failed_bucket_refresh(tmp_path, monkeypatch):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    pytest.importorskip("pyarrow")
    from ui_support import Server

    import expr_tracker as et
    from expr_tracker.sync.upload import sync_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    et.init(project="proj", name="a", dir=str(tmp_path / "runs"), system=False)
    et.log({"loss": 1.0})
    et.finish()
    url = f"file://{tmp_path / 'bucket'}"
    assert sync_dir(tmp_path / "runs", url, state_dir=tmp_path / "s").errors == []
    server = Server(url, tmp_path / "cache")  # type: ignore[arg-type]
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            pg = browser.new_page()
            # et ui copied the bucket when it started; the page's first /api/runs refreshes
            # the copy, which now fails
            (tmp_path / "bucket").rename(tmp_path / "unmounted")
            pg.goto(server.open())
            pg.wait_for_selector("#runs-body tr")
            banner = pg.locator("#refresh-banner")
            assert banner.is_visible()
            assert "could not be read" in banner.inner_text()
            assert "not a folder" in banner.inner_text()
            assert pg.locator("#runs-body tr").count() == 1  # the copy, as it was
            browser.close()
    finally:
        server.close()
