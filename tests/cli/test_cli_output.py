"""The `et` output contract: --format json is one JSON document (an array for listings) and
jsonl one object per line in every command; a closed pipe exits 0; `et runs` keeps status
and steps at 80 columns; `et history` reads a run that wrote its rows and ended meanwhile."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from helpers import strict_loads

import expr_tracker as et
from expr_tracker.cli.main import main


@pytest.fixture
def runs_root(tmp_path):
    root = tmp_path / "runs"
    et.init(project="p", name="a", dir=str(root))
    for i in range(4):
        et.log({"loss": 1.0 / (i + 1)})
    et.log({"loss": float("nan")})
    et.finish()
    return root


# --------------------------------------------------------------------------- the helper


def test_record_writer_json_is_one_array_jsonl_one_object_per_line():
    from expr_tracker.cli import output

    recs = [{"a": 1.0, "b": float("nan")}, {"a": float("inf"), "s": "é"}]
    buf = io.StringIO()
    output.write_records(recs, "json", buf)
    assert strict_loads(buf.getvalue()) == [{"a": 1.0, "b": None}, {"a": None, "s": "é"}]
    buf = io.StringIO()
    output.write_records(recs, "jsonl", buf)
    lines = buf.getvalue().splitlines()
    assert [strict_loads(x) for x in lines] == [{"a": 1.0, "b": None}, {"a": None, "s": "é"}]
    for fmt, empty in (("json", "[]\n"), ("jsonl", "")):
        buf = io.StringIO()
        output.write_records([], fmt, buf)
        assert buf.getvalue() == empty
    # written a batch at a time (et history --follow), still one document
    buf = io.StringIO()
    w = output.RecordWriter("json", buf)
    w.write([{"x": 1}])
    w.write([])
    w.write([{"x": 2}, {"x": 3}])
    w.close()
    w.close()
    assert json.loads(buf.getvalue()) == [{"x": 1}, {"x": 2}, {"x": 3}]
    with pytest.raises(ValueError, match="jsonl"):
        output.RecordWriter("yaml")


# --------------------------------------------------------------------------- every command


def _json_and_jsonl(capsys, args):
    """Run ``et ARGS --format json`` and ``--format jsonl``: (array, objects, exit codes)."""
    code_a = main([*args, "--format", "json"])
    doc = strict_loads(capsys.readouterr().out)
    code_b = main([*args, "--format", "jsonl"])
    lines = [strict_loads(x) for x in capsys.readouterr().out.splitlines()]
    assert code_a == code_b
    return doc, lines, code_a


def test_every_listing_command_prints_an_array_and_jsonl_lines(runs_root, tmp_path, capsys):
    run = str(runs_root / "p" / "a")
    rules = tmp_path / "alerts.yaml"
    rules.write_text("rules:\n  high: 'loss > 0.4 => warning: high'\n")
    other = tmp_path / "more.yaml"
    other.write_text("rules:\n  low: 'loss < 0 => info: low'\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text("project: p\nname: fixed\nhistory: {buffer: {size: 7}}\n")
    cases = [
        (["history", run, "-n", "-1"], 5),
        (["runs", str(runs_root)], 1),
        (["alerts", run], 0),  # a run without alerts: [] and no lines
        (["rules", "check", str(rules), str(other)], 2),
        (["rules", "test", str(rules), "--run", run], 1),  # fires once, at step 0
        (["config", "show", str(spec)], None),
    ]
    for args, n in cases:
        doc, lines, code = _json_and_jsonl(capsys, args)
        assert code == 0, args
        assert isinstance(doc, list), args
        assert doc == lines, args  # the same records, one document vs one per line
        assert all(isinstance(x, dict) for x in doc), args
        if n is not None:
            assert len(doc) == n, args
    # a one-rule answer is one object in both formats
    doc, lines, code = _json_and_jsonl(capsys, ["rules", "explain", "loss > 1"])
    assert code == 0 and doc["valid"] is True and lines == [doc]


def test_channels_test_formats(tmp_path, capsys, monkeypatch):
    for var in [v for v in os.environ if v.endswith("WEBHOOK_URL") or v.startswith("ET_")]:
        monkeypatch.delenv(var)
    cfg = tmp_path / "alerts.yaml"
    cfg.write_text(
        "channels:\n  - {name: a, type: slack, url_env: ET_TEST_NOT_SET_A}\n"
        "  - {name: b, type: slack, url_env: ET_TEST_NOT_SET_B}\n"
    )
    base = ["channels", "test", "--config", str(cfg)]
    doc, lines, code = _json_and_jsonl(capsys, base)
    assert code == 1  # every channel is off: nothing tested
    assert [r["channel"] for r in doc] == ["a", "b"] and doc == lines
    assert all(r["off"] for r in doc)
    # --json (kept for scripts) is jsonl
    assert main([*base, "--json"]) == 1
    assert [json.loads(x)["channel"] for x in capsys.readouterr().out.splitlines()] == ["a", "b"]


def test_history_follow_json_is_one_array_closed_at_the_end(runs_root, capsys):
    run = str(runs_root / "p" / "a")
    assert main(["history", run, "-f", "--format", "json", "--interval", "0.01"]) == 0
    doc = strict_loads(capsys.readouterr().out)
    assert [r["_step"] for r in doc] == [0, 1, 2, 3, 4] and doc[-1]["loss"] is None


# --------------------------------------------------------------------------- closed pipes


def _shell(cmd, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as users run it
    env.update(env_extra or {})
    return subprocess.run(
        ["bash", "-c", cmd + '; echo "rc=${PIPESTATUS[0]}" >&2'],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.fixture(scope="module")
def big_run(tmp_path_factory):
    """A run with 8000 rows and a directory with 60 runs (output far beyond a pipe's
    64 KiB buffer), written by a child process (no run is left current here)."""
    root = tmp_path_factory.mktemp("pipes")
    code = (
        "import expr_tracker as et, sys\n"
        "root = sys.argv[1]\n"
        "et.init(project='p', name='big', dir=root + '/one')\n"
        "for i in range(8000): et.log({'loss': 1.0 / (i + 1), 'acc': 0.5})\n"
        "et.finish()\n"
        "for i in range(60):\n"
        "    et.init(project='p', name=f'r{i:03d}', dir=root + '/many'); et.log({'loss': 1.0})\n"
        "    et.finish()\n"
    )
    subprocess.run([sys.executable, "-c", code, str(root)], check=True, timeout=300)
    return root


ET = f"{sys.executable} -m expr_tracker.cli.main"


@pytest.mark.slow
@pytest.mark.parametrize(
    "cmd",
    [
        "history {one} -n 100000 | head -1",
        "history {one} -n 100000 --format json | head -1",
        "history {one} -n 100000 --format jsonl | head -1",
        "history {one} -n 100000 --format csv | head -1",
        "runs {many} | head -1",
        "runs {many} --format json | head -1",
        # the reader is gone before anything is written: only the exit flush can fail
        "runs {many} | true",
        "rules explain 'loss > 1' | true",
    ],
)
def test_a_closed_pipe_exits_0_quietly(big_run, cmd):
    cmd = cmd.format(one=big_run / "one" / "p" / "big", many=big_run / "many")
    res = _shell(f"{ET} {cmd}")
    assert res.stderr.splitlines()[-1] == "rc=0", res.stderr
    assert "Error" not in res.stderr and "Exception" not in res.stderr, res.stderr


@pytest.mark.parametrize("out", ["closed pipe", "full disk"])
def test_et_version_to_a_closed_pipe_or_full_disk_says_so_without_a_traceback(out):
    """``et --version`` whose output cannot be written: a reader gone exits 0 quietly, as
    every command does; a full disk says why and exits 1 (both were a traceback)."""
    if out == "closed pipe":
        r, w = os.pipe()
        os.close(r)  # the reader is gone before anything is written
    else:
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full")
        w = os.open("/dev/full", os.O_WRONLY)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        res = subprocess.run(
            [sys.executable, "-m", "expr_tracker.cli.main", "--version"],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=120,
        )
    finally:
        os.close(w)
    assert "Traceback" not in res.stderr and "Exception" not in res.stderr, res.stderr
    if out == "closed pipe":
        assert (res.returncode, res.stderr) == (0, "")
    else:
        assert res.returncode == 1 and res.stderr.startswith("et: "), res.stderr


# --------------------------------------------------------------------------- et runs, 80 cols


def test_runs_at_80_columns_keeps_status_and_steps(tmp_path, capsys, monkeypatch):
    root = tmp_path / "runs"
    long_project = "a-very-long-project-name-for-the-ablation-study"
    long_name = "an-extremely-long-run-name-lr0.001-bs256-warmup1000-seed1234567"
    et.init(project=long_project, name=long_name, dir=str(root), tags=["t" * 40])
    for i in range(12345):
        et.log({"train/loss_with_a_long_name": 1.0 / (i + 1), "val/accuracy_top5": 0.5})
    et.finish()
    et.init(project="p", name="short", dir=str(root))
    et.log({"loss": 1.0})
    et.finish()
    for width in (80, 60):
        monkeypatch.setenv("COLUMNS", str(width))
        assert main(["runs", str(root)]) == 0
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert max(len(x) for x in lines) <= width, out
        head = next(x for x in lines if "status" in x)  # a narrow header may wrap
        assert head.split()[:3] == ["run", "status", "steps"], out
        # the status and the step count, whole, on the first line of each run's row
        rows = [x for x in lines[1:] if "finished" in x]
        assert len(rows) == 2, out
        assert {x.split("finished")[1].split()[0] for x in rows} == {"12345", "1"}, out
        text = "".join(x.strip() for x in lines)
        assert long_name[-20:] in text  # wrapped, not cut


# --------------------------------------------------------------------------- a race


def test_history_reads_a_run_that_wrote_and_ended_since_it_looked(tmp_path, capsys, monkeypatch):
    """`et history` found no metrics file, then read run.json: if the run wrote its rows and
    finished in between, the rows are read (it said 'no metrics.jsonl', exit 1)."""
    import expr_tracker.cli.history as history

    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"))
    real_status = history._status

    def status_after_the_run_ended(path):
        if not (run.dir / "metrics.jsonl").exists():
            for i in range(3):
                et.log({"loss": float(i)})
            et.finish()
        return real_status(path)

    monkeypatch.setattr(history, "_status", status_after_the_run_ended)
    assert main(["history", str(run.dir), "--format", "jsonl"]) == 0
    assert [json.loads(x)["_step"] for x in capsys.readouterr().out.splitlines()] == [0, 1, 2]


def test_rules_unit_test_file_formats(tmp_path, capsys):
    tests = tmp_path / "tests.yaml"
    tests.write_text(
        "rules:\n  high: 'loss > 4 => error: high'\n"
        "tests:\n  - name: t\n    input_series: {loss: '1 5 1'}\n"
        "    expected_alerts: [{rule: high, steps: [2]}]\n"
    )
    doc, lines, code = _json_and_jsonl(capsys, ["rules", "test", str(tests)])
    assert code == 1 and doc == lines
    [result] = doc
    assert result["status"] == "FAILED" and result["tests"] == 1
    assert "expected firing at step 2" in result["failures"][0]
    assert main(["rules", "test", str(tests)]) == 1  # text, as before
    assert "FAILED" in capsys.readouterr().out


# --------------------------------------------------------------------------- output for people

#: names and values that try to drive the terminal: write the clipboard (OSC 52), clear the
#: screen, reverse the text (a bidi override), and rich markup/emoji that must print as typed
OSC52 = "\x1b]52;c;aGVsbG8=\x07"
CLEAR = "\x1b[2J"
HOSTILE_METRIC = f"loss{OSC52}"
HOSTILE_VALUE = f"v{CLEAR}\u202eevil"
HOSTILE_RUN = f"r{CLEAR}[red]x[link=e.example]y:skull:"  # no "/" in a folder name
RAW = (b"\x1b]52", b"\x1b[2J", b"\x07", "\u202e".encode())


def _hostile_runs(root):
    """One run whose directory name, metric name and value hold terminal control sequences."""
    run = et.init(project="p", name="plain", dir=str(root))
    for i in range(3):
        et.log({HOSTILE_METRIC: 1.0 / (i + 1), "note": HOSTILE_VALUE})
    et.finish()
    hostile = run.dir.with_name(HOSTILE_RUN)
    run.dir.rename(hostile)
    return hostile


def _in_pty(args, cwd, timeout=60):
    """Run ``et ARGS`` with stdout and stderr on a pseudo-terminal (as a person sees it);
    returns (exit code, the bytes the terminal received)."""
    import pty
    import select

    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS="250", LINES="50", TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    p = subprocess.Popen(
        [sys.executable, "-m", "expr_tracker.cli.main", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        cwd=cwd,
        env=env,
    )
    os.close(slave)
    got = bytearray()
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            if not ready:
                raise AssertionError(f"et {args} printed nothing for {timeout} s: {bytes(got)!r}")
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            got += data
        code = p.wait(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
    return code, bytes(got)


def _assert_no_raw_control(out: bytes, what: str) -> None:
    for seq in RAW:
        assert seq not in out, (what, seq, out)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["runs", "history", "query"])
def test_names_and_values_cannot_drive_the_terminal(tmp_path, command):
    """Issue 20 point 6: the `et runs`, `et history` and `et query` tables print a run name,
    a metric name and a value holding OSC 52, a screen clear and a bidi override escaped (as
    `ls` does), and rich markup/emoji codes as typed."""
    root = tmp_path / "runs"
    hostile = _hostile_runs(root)
    if command == "runs":
        code, out = _in_pty(["runs", str(root), "--metrics", HOSTILE_METRIC], tmp_path)
        assert b"r\\x1b[2J[red]x[link=e.example]y:skull:" in out, out
        assert b"loss\\x1b]52;c;aGVsbG8=\\x07=0.333333" in out, out
        assert b"\x1b]8;" not in out  # no hyperlink made of [link=...]
    elif command == "history":
        code, out = _in_pty(["history", str(hostile), "-n", "2"], tmp_path)
        assert b"loss\\x1b]52;c;aGVsbG8=\\x07" in out, out
        assert b"v\\x1b[2J\\u202eevil" in out, out
    else:
        pytest.importorskip("duckdb")
        sql = "SELECT run, metric, max(value) AS v FROM metrics GROUP BY run, metric"
        cache = str(tmp_path / "cache")
        code, out = _in_pty(["query", sql, str(root), "--cache-dir", cache], tmp_path)
        assert b"loss\\x1b]52;c;aGVsbG8=\\x07" in out, out
    assert code == 0, out
    _assert_no_raw_control(out, command)


@pytest.mark.slow
def test_machine_formats_keep_hostile_names_exact(tmp_path):
    root = tmp_path / "runs"
    hostile = _hostile_runs(root)
    et_ = [sys.executable, "-m", "expr_tracker.cli.main"]
    p = subprocess.run([*et_, "runs", str(root), "--format", "json"], capture_output=True)
    (rec,) = json.loads(p.stdout)
    assert rec["run"] == f"p/{HOSTILE_RUN}" and HOSTILE_METRIC in rec["metrics"]
    p = subprocess.run([*et_, "history", str(hostile), "--format", "jsonl"], capture_output=True)
    rows = [json.loads(x) for x in p.stdout.splitlines()]
    assert rows[-1]["note"] == HOSTILE_VALUE and HOSTILE_METRIC in rows[-1]
    p = subprocess.run([*et_, "history", str(hostile), "--format", "csv"], capture_output=True)
    assert HOSTILE_VALUE.encode() in p.stdout and HOSTILE_METRIC.encode() in p.stdout


def test_alerts_and_follow_tables_escape_names(tmp_path, capsys):
    """`et alerts` and the `et history --follow` table escape what the files hold too."""
    from expr_tracker.cli.history import Printer

    alerts = tmp_path / "alerts.jsonl"
    rec = {"kind": "transition", "rule": f"r{OSC52}", "event": "firing", "level": "error"}
    rec["message"] = f"spike {CLEAR}[bold]x[/bold]"
    rec["step"] = 3
    alerts.write_text(json.dumps(rec) + "\n")
    assert main(["alerts", str(alerts)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "r\\x1b]52;c;aGVsbG8=\\x07" in out.replace("\n", "") or "\\x1b]52" in out
    assert "[bold]x[/bold]" in out
    buf = io.StringIO()
    printer = Printer("table", buf, follow=True)
    printer.start([HOSTILE_METRIC])
    printer.rows([{"_step": 0, HOSTILE_METRIC: HOSTILE_VALUE}])
    assert "\x1b" not in buf.getvalue() and "\u202e" not in buf.getvalue()


def test_the_rich_console_prints_markup_and_emoji_codes_as_typed():
    from expr_tracker.cli import output

    buf = io.StringIO()
    con = output.console(buf, 120, force_terminal=True)
    con.print("[red]x[/red] [link=http://e.example]y[/link] :skull:")
    assert "[red]x[/red] [link=http://e.example]y[/link] :skull:" in buf.getvalue()
    assert "\x1b]8;" not in buf.getvalue()


def test_artifacts_and_rules_text_escape_what_files_hold(tmp_path, capsys):
    """`et artifacts show` (metadata from the manifest) and `et rules test --run` (a message
    built from a logged string) print escaped text; their json keeps the values exact."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "f.txt").write_text("x")
    root = tmp_path / "runs"
    run = et.init(project="p", name="r", dir=str(root))
    et.log_artifact(str(data), name="data", metadata={"k": HOSTILE_VALUE})
    et.log({"loss": 1.0, "note": HOSTILE_VALUE})
    et.finish()
    assert main(["artifacts", "show", "data", "--project-dir", str(root / "p")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out, out
    assert "v\\x1b[2J\\u202eevil" in out, out
    assert (
        main(["artifacts", "show", "data", "--project-dir", str(root / "p"), "--format", "json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["metadata"]["k"] == HOSTILE_VALUE
    rule = "loss > 0 => error: note is {note}"
    assert main(["rules", "test", rule, "--run", str(run.dir)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "note is v\\x1b[2J\\u202eevil" in out, out


@pytest.mark.slow
def test_a_run_folder_that_cannot_be_listed_never_gives_a_traceback(runs_root, tmp_path):
    """A colleague's 0700 run folder named to a single-run command: `et plot` and `et
    alerts` died with a PermissionError traceback (pathlib's is_file() raises it); every
    command says which path and why, exit 1."""
    from helpers import CANNOT_READ_SKIP, cannot_read_prefix

    run = runs_root / "p" / "a"
    os.chown(run, 65534, 65534) if os.geteuid() == 0 else None
    run.chmod(0o700)
    try:
        prefix = cannot_read_prefix(run / "run.json")
        if prefix is None:
            pytest.skip(CANNOT_READ_SKIP)
        for cmd in (
            ["plot", str(run), "--no-color"],
            ["alerts", str(run)],
            ["history", str(run)],
            ["trace", str(run), "-o", str(tmp_path / "t.json")],
            ["compare", str(run), str(run.parent / "a")],
        ):
            p = subprocess.run(
                [*prefix, sys.executable, "-m", "expr_tracker.cli.main", *cmd],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert "Traceback" not in p.stderr, (cmd, p.stderr)
            assert p.returncode in (1, 2) and "permission denied" in p.stderr.lower(), (
                cmd,
                p.returncode,
                p.stderr,
            )
    finally:
        run.chmod(0o755)


@pytest.mark.parametrize("command", ["runs", "history", "alerts", "compare", "plot"])
def test_warnings_and_errors_naming_hostile_paths_are_escaped(tmp_path, command):
    """The tables escaped names, but a warning or an error line on stderr printed the path
    of a run folder named with OSC 52 raw: `expr_tracker: .../metrics.jsonl has a line that
    is not a row` (et runs, history, compare, plot) and `et alerts: skipped 1 line(s) of
    ...` wrote the clipboard of whoever listed a colleague's runs."""
    root = tmp_path / "runs"
    hostile = _hostile_runs(root)
    bad = hostile.with_name(f"bad{OSC52}")
    hostile.rename(bad)
    with open(bad / "metrics.jsonl", "a") as f:
        f.write("[" * 5000 + "\n")
    (bad / "alerts.jsonl").write_text("{not a record\n")
    other = et.init(project="p", name="other", dir=str(root))
    et.log({"x": 1.0})
    et.finish()
    args = {
        "runs": ["runs", str(root)],
        "history": ["history", str(bad)],
        "alerts": ["alerts", str(bad)],
        "compare": ["compare", str(bad), str(other.dir)],
        "plot": ["plot", str(bad), HOSTILE_METRIC, "--no-color"],
    }[command]
    code, out = _in_pty(args, tmp_path)
    assert code == 0, out
    assert b"bad\\x1b]52;c;aGVsbG8=\\x07" in out, out
    _assert_no_raw_control(out, command)
