"""A resumed run shows its whole life (issue 21, point 4; docs/streams.md "Run identity",
Durations): the same script run three times under one name and config — the first attempt
finishes, the second is killed with SIGKILL, the third finishes — is one run whose first
start is the first attempt's, whose wall duration spans all three and whose active time is
their sum (the killed one up to its last row), in ``run.json``, ``et runs`` (text and JSON),
``et compare``, the ``runs`` view of ``et query`` and the dashboard. Before, each of them
showed the last attempt only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import ROOT

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import sys, time
    import expr_tracker as et

    run = et.init(project="life", name="thrice", dir=sys.argv[1], config={"lr": 0.1})
    for i in range(3):
        et.log({"loss": 1.0 / (i + 1)})
        time.sleep(0.2)
    if sys.argv[2] == "kill":
        run.flush()  # the rows are on disk: then the process is killed (test)
        print("READY", flush=True)
        time.sleep(120)
    et.finish()
    """
)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _info(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


@pytest.fixture(scope="module")
def life(tmp_path_factory):
    """Runs ``life/thrice`` (three attempts: finished, killed, finished) and ``life/other``
    (one attempt) under a fresh folder; what each attempt recorded."""
    base = tmp_path_factory.mktemp("life")
    root = base / "runs"
    script = base / "train.py"
    script.write_text(SCRIPT)
    run_dir = root / "life" / "thrice"

    def launch(mode: str) -> None:
        subprocess.run(
            [sys.executable, str(script), str(root), mode],
            cwd=base,
            env=_env(),
            check=True,
            capture_output=True,
            timeout=120,
        )

    launch("finish")
    first = _info(run_dir)
    time.sleep(0.5)  # between attempts: wall time, not active time
    p = subprocess.Popen(
        [sys.executable, str(script), str(root), "kill"],
        cwd=base,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "READY"
        killed = _info(run_dir)  # written at its start: status running
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.kill()
        p.wait(timeout=60)
        p.stdout.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    killed_last_row = rows[-1]["_time"]
    time.sleep(0.5)
    launch("finish")
    last = _info(run_dir)
    code = (
        "import sys, expr_tracker as et\n"
        "et.init(project='life', name='other', dir=sys.argv[1])\n"
        "et.log({'loss': 2.0})\n"
        "et.finish()\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(root)], cwd=base, env=_env(), check=True, timeout=120
    )
    killed_active = killed_last_row - killed["started_at"]
    return {
        "root": root,
        "run_dir": run_dir,
        "first": first,
        "killed": killed,
        "killed_last_row": killed_last_row,
        "last": last,
        "first_start": first["started_at"],
        "wall": last["ended_at"] - first["started_at"],
        "active": first["duration_s"] + killed_active + last["duration_s"],
    }


def _close(got, want) -> bool:
    """Equal to the millisecond the files round to (three roundings summed)."""
    return got is not None and abs(got - want) <= 0.004


def test_run_json_records_the_whole_life_and_each_attempts_duration(life):
    info = life["last"]
    assert info["first_started_at"] == life["first_start"]
    assert info["first_started_at_iso"].startswith(time.strftime("%Y-%m-%d"))
    assert _close(info["wall_duration_s"], life["wall"])
    assert _close(info["active_duration_s"], life["active"])
    assert info["active_duration_s"] < info["wall_duration_s"] - 1.0  # the gaps between
    # what it held before keeps its meaning: the latest attempt's
    assert info["started_at"] == life["last"]["started_at"] and info["duration_s"] < 5
    done, killed = info["previous_attempts"]
    assert done["status"] == "finished" and done["duration_s"] == life["first"]["duration_s"]
    assert killed["status"] == "crashed" and killed["ended_at"] is None
    assert killed["last_seen_at"] == life["killed_last_row"]  # its last known write
    assert _close(killed["duration_s"], life["killed_last_row"] - life["killed"]["started_at"])
    # the killed attempt's own run.json already said where the run began
    assert life["killed"]["first_started_at"] == life["first_start"]


def test_et_runs_shows_the_whole_life(life, capsys):
    from expr_tracker.cli.main import main
    from expr_tracker.cli.runs import _duration

    assert main(["runs", str(life["root"]), "--format", "json"]) == 0
    runs = {r["run"]: r for r in json.loads(capsys.readouterr().out)}
    r = runs["life/thrice"]
    assert r["first_started_at"] == life["first_start"]
    assert _close(r["wall_duration_s"], life["wall"])
    assert _close(r["active_duration_s"], life["active"])
    assert r["started_at"] == life["last"]["started_at"]  # the latest attempt's, as before
    # the table: started = the first start, duration = wall, active = the sum
    os.environ["COLUMNS"] = "160"
    try:
        assert main(["runs", str(life["root"])]) == 0
    finally:
        del os.environ["COLUMNS"]
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("life/thrice"))
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(life["first_start"]))
    wall, active = _duration(r["wall_duration_s"]), _duration(r["active_duration_s"])
    assert f"{started}  {wall:>8}  {active:>6}" in line, out
    assert wall != active


def test_et_compare_shows_the_whole_life(life, capsys):
    from expr_tracker.cli.compare import _duration
    from expr_tracker.cli.main import main
    from expr_tracker.query.compare import compare_runs

    res = compare_runs(["life/thrice", "life/other"], root=life["root"])
    ident = {row["key"]: row["values"][0] for row in res["identity"]}
    assert ident["first_started_at"] == life["first_start"]
    assert _close(ident["wall_duration_s"], life["wall"])
    assert _close(ident["active_duration_s"], life["active"])
    assert main(["compare", "life/thrice", "life/other", "--dir", str(life["root"])]) == 0
    out = capsys.readouterr().out
    for key in ("wall_duration_s", "active_duration_s"):
        line = next(x for x in out.splitlines() if x.startswith(key))
        assert _duration(ident[key]) in line, out
    line = next(x for x in out.splitlines() if x.startswith("first_started_at"))
    assert time.strftime("%Y-%m-%d %H:%M", time.localtime(life["first_start"])) in line


def test_the_runs_view_has_the_whole_life(life, tmp_path):
    pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    from expr_tracker.query.views import connect

    con = connect(life["root"], cache_dir=tmp_path / "cache")
    try:
        got = con.execute(
            "SELECT first_started_at, first_started, wall_duration_s, active_duration_s, "
            "started_at, duration_s FROM runs WHERE name = 'thrice'"
        ).fetchall()
    finally:
        con.close()
    ((first, first_ts, wall, active, started_at, duration),) = got
    assert first == life["first_start"]
    assert abs(first_ts.timestamp() - first) < 1e-3 or first_ts.tzinfo is None
    assert _close(wall, life["wall"]) and _close(active, life["active"])
    assert started_at == life["last"]["started_at"] and duration < 5  # the latest attempt's


def test_the_dashboard_shows_the_whole_life(life, tmp_path):
    TestClient = pytest.importorskip("starlette.testclient").TestClient
    pytest.importorskip("duckdb")
    from expr_tracker.ui.server import create_app

    app = create_app(life["root"], cache_dir=tmp_path / "uicache")
    client = TestClient(app, base_url="http://127.0.0.1")
    runs = {r["run"]: r for r in client.get("/api/runs").json()["runs"]}
    page = client.get("/api/run", params={"run": "life/thrice"}).json()
    for r in (runs["life/thrice"], page):
        assert r["first_started_at"] == life["first_start"]
        assert _close(r["wall_duration_s"], life["wall"])
        assert _close(r["active_duration_s"], life["active"])
    # the page's script shows these (the latest attempt's only where a run has none)
    js = (ROOT / "expr_tracker" / "ui" / "static" / "app.js").read_text()
    assert "fmtDuration(wallOf(r))" in js and "fmtDuration(r.active_duration_s)" in js
    assert "fmtTime(firstStartOf(d))" in js
