"""`et plot`: charts rendered to a fixed-size terminal (plotext's own string output), checked
for their axes (tick labels spanning the steps), their series (labels, the number of points
drawn equals the downsampled count, NaN/inf marks), overlays, errors, colours, and
``--follow`` against a run another process is still writing."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import expr_tracker as et
from expr_tracker.cli.main import main
from expr_tracker.history.chartprep import series_view
from expr_tracker.history.columns import read_columns
from expr_tracker.history.downsample import m4

pytest.importorskip("plotext")


def _run(root: Path, name: str, rows: list[dict], project: str = "p") -> Path:
    run = et.init(project=project, name=name, dir=str(root))
    for r in rows:
        et.log(r)
    et.finish()
    return run.dir


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    a = [{"loss": 1.0 / (i + 1), "acc": i / 300, "lr": 3e-4} for i in range(300)]
    a[100]["loss"] = float("nan")
    a[150]["loss"] = float("inf")
    a[200]["loss"] = float("-inf")
    a[250]["loss"] = float("inf")
    b = [{"loss": 2.0 / (i + 1), "acc": i / 250} for i in range(200)]
    return root, _run(root, "a", a), _run(root, "b", b)


def plot(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["plot", *args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _tick_line(out: str) -> list[str]:
    """The labels under the x axis of the first chart."""
    lines = out.splitlines()
    i = next(k for k, line in enumerate(lines) if line.lstrip().startswith("└"))
    return lines[i + 1].split()


def test_axes_series_and_nonfinite_marks(runs, capsys):
    _root, a, _b = runs
    code, out, err = plot(capsys, str(a), "loss", "--width", "80", "--height", "16")
    assert code == 0, err
    assert "\x1b" not in out  # not a terminal: no colours
    lines = out.splitlines()
    assert lines[0].strip() == "loss"  # the title
    ticks = _tick_line(out)
    assert ticks[0] == "0" and ticks[-1] == "299"  # the ticks span the step range
    assert [int(t) for t in ticks] == sorted(int(t) for t in ticks)
    assert "step" in out
    chart = "\n".join(lines[: lines.index(next(x for x in lines if x.lstrip().startswith("└")))])
    assert "✗" in chart and "▲" in chart and "▼" in chart  # marks on the chart itself
    legend = next(x for x in lines if "a/loss" in x)
    assert "300 points" in legend
    assert "1 NaN" in legend and "2 +inf" in legend and "1 -inf" in legend
    assert len(lines[1]) <= 80  # fits the width asked for


def test_points_drawn_equal_the_downsampled_count(tmp_path):
    rows = [{"x": math.sin(i / 50.0) + (9.0 if i == 4321 else 0.0)} for i in range(20_000)]
    rows[777]["x"] = float("nan")
    run = _run(tmp_path / "runs", "big", rows)
    col = read_columns(run / "metrics.jsonl", lambda n: n == "x").columns["x"]
    buckets = 70
    view = series_view(
        "big/x", col, x_mode="step", t0=None, buckets=buckets, lo=0.0, hi=19_999.0,
        smooth=None, log_y=False,
    )  # fmt: skip
    idx = m4(col.steps, col.values, buckets, 0, 19_999)
    finite = [i for i in idx if math.isfinite(col.values[i])]
    assert len(view.xs) == len(finite) <= 4 * buckets
    assert 9.0 + math.sin(4321 / 50.0) in view.ys  # the spike survives
    assert view.counts == {"nan": 1} and view.marks["nan"] == [777.0]
    assert [view.xs[i] for i in view.breaks] == [min(x for x in view.xs if x > 777)]
    assert view.points == 20_000


def test_two_runs_overlaid(runs, capsys):
    root, a, b = runs
    for args in (
        [str(a), str(b), "loss"],
        ["--runs", "p/a,p/b", "--dir", str(root), "loss"],
        ["a", "b", "loss", "--dir", str(root)],
    ):
        code, out, err = plot(capsys, *args, "--width", "70", "--height", "14")
        assert code == 0, err
        assert out.count("\n loss\n") == 0 and out.splitlines()[0].strip() == "loss"
        legend = [x for x in out.splitlines() if x.startswith(" ") and "/loss:" in x]
        assert [x.split()[1] for x in legend] == ["a/loss:", "b/loss:"]
        assert legend[0].split()[0] != legend[1].split()[0]  # without colour: two markers
        assert _tick_line(out)[-1] == "299"  # the longer run sets the range
        assert "200 points" in legend[1]


def test_default_metrics_globs_and_unknown_metric(runs, capsys):
    root, a, _b = runs
    code, out, _ = plot(capsys, str(a), "--width", "60", "--height", "10")
    assert code == 0
    titles = [x.strip() for x in out.splitlines() if x.strip() in ("loss", "acc", "lr")]
    assert titles == ["loss", "acc"]  # et runs' main metrics: not lr
    code, out, _ = plot(capsys, str(a), "l*", "--width", "60", "--height", "10")
    assert [x.strip() for x in out.splitlines() if x.strip() in ("loss", "lr")] == ["loss", "lr"]
    code, out, err = plot(capsys, str(a), "los")
    assert code == 1 and out == ""
    assert "unknown metric 'los' (did you mean 'loss'?)" in err and "acc" in err
    code, _, err = plot(capsys, str(a), "val/*")
    assert code == 1 and "pattern 'val/*' matches no metric" in err
    code, _, err = plot(capsys, str(a), "los", "-f")  # the run ended: no row can bring it
    assert code == 1 and "unknown metric 'los'" in err


def test_a_metric_named_like_a_folder_is_a_metric(runs, capsys, tmp_path, monkeypatch):
    _root, a, _b = runs
    monkeypatch.chdir(tmp_path)
    (tmp_path / "acc").mkdir()  # a folder that is no run
    code, out, err = plot(capsys, str(a), "acc", "--width", "50", "--height", "8")
    assert code == 0, err
    assert "a/acc: 300 points" in out


def test_unknown_and_ambiguous_runs(runs, capsys, tmp_path):
    root, _a, _b = runs
    code, out, err = plot(capsys, "aa", "--dir", str(root))
    assert code == 1 and out == ""
    assert "names no run" in err and "close matches" in err
    _run(root, "a", [{"loss": 1.0}], project="q")  # q/a beside p/a
    code, _, err = plot(capsys, "a", "--dir", str(root))
    assert code == 1 and "ambiguous" in err and "p/a" in err and "q/a" in err
    assert plot(capsys, "q/a", "--dir", str(root), "--width", "40", "--height", "8")[0] == 0
    code, _, err = plot(capsys, str(tmp_path / "nowhere"))
    assert code == 1 and "names no run" in err


def test_usage_errors(runs, capsys):
    _root, a, _b = runs
    for bad, word in (
        (["--smooth", "0"], "--smooth"),
        (["--smooth", "1.5"], "--smooth"),
        (["--smooth", "ema:1"], "--smooth"),
        (["--smooth", "gauss:2"], "--smooth"),
        (["--since", "-1"], "--since"),
        (["--width", "5"], "--width"),
        (["--rank", "-2"], "--rank"),
        (["-f", "--interval", "0"], "--interval 0 "),
        (["-f", "--interval", "nan"], "--interval nan "),  # was a ValueError from sleep
        (["-f", "--interval", "inf"], "--interval inf "),  # was an OverflowError
    ):
        code, _, err = plot(capsys, str(a), "loss", *bad)
        assert code == 2 and word in err
    code, _, err = plot(capsys)
    assert code == 2 and "give a run" in err


def test_since_time_axis_smooth_and_log(runs, capsys):
    _root, a, _b = runs
    code, out, _ = plot(capsys, str(a), "acc", "--since", "120", "--width", "60", "--height", "10")
    assert code == 0
    assert _tick_line(out)[0] == "120" and _tick_line(out)[-1] == "299"
    assert "180 points" in out
    code, out, _ = plot(capsys, str(a), "acc", "--x", "time", "--width", "60", "--height", "10")
    assert code == 0 and "seconds since the run's first row" in out
    code, out, _ = plot(capsys, str(a), "loss", "--smooth", "0.1", "--width", "60")
    assert code == 0 and "loss (EMA 0.9)" in out  # a plain ALPHA, the older form
    code, out, _ = plot(capsys, str(a), "loss", "--smooth", "mean:5", "--width", "60")
    assert code == 0 and "loss (mean of 5)" in out
    code, out, err = plot(capsys, str(a), "acc", "--log-y", "--width", "60", "--height", "10")
    assert code == 0, err
    assert "1 values <= 0 not drawn (log axis)" in out  # acc is 0.0 at step 0


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _args(*argv: str) -> argparse.Namespace:
    from expr_tracker.cli.main import build_parser

    return build_parser().parse_args(["plot", *argv])


def test_colours_only_on_a_terminal_and_never_with_no_color(runs, monkeypatch):
    from expr_tracker.cli.plot import run_plot

    _root, a, _b = runs
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = _Tty()
    assert run_plot(_args(str(a), "loss", "--width", "60", "--height", "10"), out) == 0
    assert "\x1b[38;5;" in out.getvalue()
    out = _Tty()
    assert run_plot(_args(str(a), "loss", "--width", "60", "--no-color"), out) == 0
    assert "\x1b" not in out.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    out = _Tty()
    assert run_plot(_args(str(a), "loss", "--width", "60"), out) == 0
    assert "\x1b" not in out.getvalue() and "loss" in out.getvalue()


def test_missing_plotext_names_the_extra(runs, capsys, monkeypatch):
    _root, a, _b = runs
    monkeypatch.setitem(sys.modules, "plotext", None)
    code, out, err = plot(capsys, str(a), "loss")
    assert code == 1 and out == ""
    assert "pip install 'expr-tracker[plot]'" in err


def test_hostile_names_and_values(tmp_path, capsys):
    name = "x\x1b[31m'\";red"
    rows = [{name: float(i), "text": "s", "big": i} for i in range(10)]
    rows.append({name: "not a number"})
    run = _run(tmp_path / "runs", "h", rows)
    code, out, err = plot(capsys, str(run), "x*", "big", "--width", "60", "--height", "10")
    assert code == 0, err
    assert "\x1b" not in out  # the escape is shown escaped, never sent to the terminal
    assert "x\\x1b[31m'\";red" in out
    assert "1 non-numeric values not drawn" in out
    code, out, err = plot(capsys, str(run), "text")
    assert code == 0 and "10 non-numeric values not drawn" in out
    # another writer's file: an int beyond the float range is marked as +inf, not lost
    raw = tmp_path / "metrics.jsonl"
    raw.write_text(
        "".join(f'{{"big": {10**400 if i == 3 else i}, "_step": {i}}}\n' for i in range(6))
    )
    code, out, err = plot(capsys, str(raw), "big", "--width", "60", "--height", "10")
    assert code == 0, err
    assert "6 points" in out and "1 +inf" in out


def test_patch_lines_torn_line_and_unsorted_steps(tmp_path):
    p = tmp_path / "metrics.jsonl"
    lines = [
        {"a": 1.0, "_step": 0, "_time": 10.0},
        {"a": 2.0, "_step": 1, "_time": 11.0},
        {"b": 5.0, "_step": 1, "_time": 11.5},  # a patch line adding b to step 1
        {"a": 3.0, "_step": 1, "_time": 12.0},  # a patch line replacing a of step 1
        {"a": 0.5, "_step": 5, "_time": 13.0},
        {"a": 9.0, "_step": 3, "_time": 14.0},  # out of step order
    ]
    p.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"a": 7, "_st')
    cols = read_columns(p, lambda n: True)
    a = cols.columns["a"].ordered()
    assert list(a.steps) == [0, 1, 3, 5] and list(a.values) == [1.0, 3.0, 9.0, 0.5]
    assert list(cols.columns["b"].steps) == [1] and cols.first_time == 10.0
    late = read_columns(p, lambda n: n == "a", since=3)
    assert sorted(late.columns["a"].steps) == [3, 5] and late.first_time == 10.0


#: `et` as started from a terminal: a child inherits an *ignored* SIGINT (pytest started in
#: the background, `pytest ... &`, some CI runners) and Python then installs no
#: KeyboardInterrupt handler, so the Ctrl-C test hung; the default handler is restored first
_ET_AS_FROM_A_TERMINAL = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('expr_tracker.cli.main', run_name='__main__')"
)


def _et_plot(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _ET_AS_FROM_A_TERMINAL, "plot", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


WRITER = """
import sys, time
import expr_tracker as et
et.init(project="p", name="live", dir=sys.argv[1], max_buffer_seconds=0.05)
for i in range(80):
    et.log({"loss": 1.0 / (i + 1)})
    time.sleep(0.05)
et.finish()
"""


@pytest.mark.slow
def test_follow_redraws_while_a_run_writes_and_exits_when_it_ends(tmp_path):
    root = tmp_path / "runs"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root)])
    run = root / "p" / "live"
    deadline = time.monotonic() + 30
    while not (run / "run.json").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    proc = _et_plot(str(run), "loss", "-f", "--interval", "0.1", "--width", "60", "--height", "10")
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        writer.wait(timeout=60)
    assert proc.returncode == 0, err
    assert writer.returncode == 0
    frames = [f for f in re.split(r"(?m)^\s+loss\s*$", out) if f.strip()]
    assert len(frames) >= 2, out  # it redrew as rows landed
    counts = [int(m) for m in re.findall(r"live/loss: (\d+) points", out)]
    assert counts == sorted(counts) and counts[0] < 80 and counts[-1] == 80  # output grew
    assert _tick_line(frames[-1])[-1] == "79"  # the final draw spans every step
    assert re.findall(r"last \S+ at step (\d+)", out)[-1] == "79"


@pytest.mark.slow
def test_follow_ctrl_c_exits_130(tmp_path):
    import queue
    import threading

    p = tmp_path / "metrics.jsonl"  # a bare file: no run.json says it ended, so it waits
    p.write_text("".join(json.dumps({"loss": float(i), "_step": i}) + "\n" for i in range(5)))
    proc = _et_plot(str(p), "loss", "-f", "--interval", "0.05", "--width", "50", "--height", "8")
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True)
    reader.start()

    def wait_for(text: str) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if text in lines.get(timeout=1):
                    return
            except queue.Empty:
                continue
        raise AssertionError(f"{text!r} never drawn")

    wait_for("loss: 5 points")  # the first frame
    assert proc.poll() is None  # still following
    with p.open("a") as f:
        f.write(json.dumps({"loss": 9.0, "_step": 5}) + "\n")
    wait_for("loss: 6 points")  # the appended row was drawn
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        err = proc.stderr.read()
        proc.stderr.close()
        proc.stdout.close()
        raise AssertionError(f"no exit 60 s after SIGINT; stderr: {err[-2000:]}") from None
    err = proc.stderr.read()
    proc.stderr.close()
    reader.join(timeout=20)  # at the end of the output, then the pipe is closed
    proc.stdout.close()
    assert proc.returncode == 130, err
    assert "Traceback" not in err


def test_follow_on_a_terminal_replaces_frames_and_restores_the_cursor(runs):
    from expr_tracker.cli.plot import run_plot

    _root, a, _b = runs  # finished: one draw, then it stops by itself
    out = _Tty()
    args = _args(str(a), "loss", "-f", "--interval", "0.01", "--width", "60", "--height", "10")
    assert run_plot(args, out) == 0
    text = out.getvalue()
    assert text.startswith("\x1b[?25l\x1b[H\x1b[2J")  # cursor hidden, screen redrawn
    assert text.endswith("\x1b[?25h")  # and shown again
    assert "a/loss: 300 points" in text


def test_stream_and_rank_files(tmp_path, capsys):
    root = tmp_path / "runs"
    _run(root, "st", [{"loss": float(i)} for i in range(20)])
    run = et.init(project="p", name="st", dir=str(root), stream="data")
    for i in range(10):
        et.log({"thr": 2.0 * i})
    et.finish()
    code, out, err = plot(capsys, str(run.dir), "thr", "--stream", "data", "--width", "50")
    assert code == 0, err
    assert "st[data]/thr: 10 points, last 18 at step 9" in out
    code, _, err = plot(capsys, str(run.dir), "thr")  # the main stream has no thr
    assert code == 1 and "unknown metric 'thr'" in err and "loss" in err
    code, _, err = plot(capsys, str(run.dir), "--stream", "../x")
    assert code == 2 and "stream '../x' is not valid" in err
    (run.dir / "metrics.rank1.jsonl").write_text('{"loss": 5.0, "_step": 0}\n')
    code, out, err = plot(capsys, str(run.dir), "loss", "--rank", "1", "--width", "50")
    assert code == 0 and "st[rank1]/loss: 1 points" in out


def test_a_rewritten_file_is_read_again_and_appends_are_read_alone(tmp_path):
    from expr_tracker.cli.plot import RunSource, poll, read_all

    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps({"a": float(i), "_step": i}) + "\n" for i in range(10)))
    src = RunSource("r", p, None)
    select = lambda n: n == "a"  # noqa: E731
    read_all(src, select, None)
    assert len(src.columns.columns["a"]) == 10 and src.offset == p.stat().st_size
    with p.open("a") as f:
        f.write(json.dumps({"a": 10.0, "_step": 10}) + "\n" + '{"a": 11.0, "_st')  # torn
    assert poll(src, select, None)
    assert list(src.columns.columns["a"].steps)[-1] == 10  # the torn line waits
    with p.open("a") as f:
        f.write('ep": 11}\n')
    assert poll(src, select, None) and len(src.columns.columns["a"]) == 12
    p.write_text(json.dumps({"a": 5.0, "_step": 0}) + "\n")  # rewritten, shorter
    assert poll(src, select, None)
    assert list(src.columns.columns["a"].values) == [5.0]


def test_runs_without_a_main_metrics_file(tmp_path, capsys):
    root = tmp_path / "runs"
    empty = et.init(project="p", name="empty", dir=str(root))
    et.finish()  # no row: no metrics file
    code, out, err = plot(capsys, str(empty.dir))
    assert code == 1 and out == "" and "no metrics.jsonl" in err
    shards = root / "p" / "shards"
    shards.mkdir()
    (shards / "metrics.rank1.jsonl").write_text('{"loss": 1.0, "_step": 0}\n')
    code, _, err = plot(capsys, str(shards))
    assert code == 1 and "only rank shards" in err and "--rank 1" in err


def test_a_run_without_rows_among_others_is_named_the_others_drawn(runs, capsys):
    root, a, _ = runs
    empty = et.init(project="p", name="empty", dir=str(root))
    et.finish()  # no row: no metrics file
    for args in ([str(a), str(empty.dir), "loss"], ["--runs", "p/a,p/empty", "--dir", str(root)]):
        code, out, err = plot(capsys, *args, "--width", "70", "--height", "14")
        assert code == 0, err
        assert "empty has no rows" in err
        assert "a/loss: 300 points" in out
    code, out, err = plot(capsys, str(empty.dir), str(empty.dir), "loss")  # nothing at all
    assert code == 1 and out == ""
    code, out, err = plot(capsys, str(a), str(root / "p" / "nope"), "loss")  # no run: an error
    assert code == 1 and out == "" and "nope" in err


def test_since_beyond_the_last_step_says_so_not_unknown_metric(runs, capsys):
    _root, a, b = runs  # a: steps 0..299, b: 0..199
    code, out, err = plot(capsys, str(a), str(b), "loss", "--since", "5000")
    assert code == 1 and out == ""
    assert "unknown metric" not in err and "no rows yet" not in err
    assert "nothing to plot from step 5000 on" in err
    assert "a: its last step is 299" in err and "b: its last step is 199" in err
    code, _, err = plot(capsys, str(b), "lr", "--since", "10")  # lr: a's only, not b's
    assert code == 1 and "unknown metric 'lr' from step 10 on" in err


@pytest.mark.parametrize("width", [40, 70, 80, 123])
def test_a_run_of_nans_is_marked_in_every_cell_it_covers(tmp_path, capsys, width):
    root = tmp_path / "runs"
    rows = [{"x": float("nan"), "y": 1.0 if i < 2500 else float("nan")} for i in range(5000)]
    run = _run(root, "n", rows)
    code, out, err = plot(capsys, str(run), "x", "y", "--width", str(width), "--height", "8")
    assert code == 0, err
    tops = [line for line in out.splitlines() if "┤" in line and "✗" in line]
    assert len(tops) == 2  # one top edge per chart
    x_cells = tops[0].split("┤", 1)[1].rstrip().rstrip("│")
    assert x_cells == "✗" * len(x_cells)  # all NaN: no blank cell, not even the last
    y_cells = tops[1].split("┤", 1)[1].rstrip().rstrip("│")
    half = y_cells.lstrip(" ")
    assert half == "✗" * len(half) and abs(len(half) - len(y_cells) / 2) <= 1


def test_follow_on_a_small_terminal_keeps_each_frame_on_the_screen(runs, monkeypatch):
    import shutil

    from expr_tracker.cli.plot import run_plot

    _root, a, _b = runs
    monkeypatch.setattr(
        shutil, "get_terminal_size", lambda fallback=None: os.terminal_size((80, 24))
    )
    out = _Tty()
    args = _args(str(a), "loss", "acc", "lr", "-f", "--interval", "0.01")
    assert run_plot(args, out) == 0
    frames = out.getvalue().split("\x1b[H")[1:]
    assert frames
    for f in frames:
        shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", f)
        # 23 lines at most (the cursor ends on the 24th): a taller frame scrolls its top out
        # of sight and pushes a screenful into the scrollback on every redraw
        lines = shown.rstrip("\n").split("\n")
        assert sum(max(1, -(-len(line) // 80)) for line in lines) <= 23  # wrapped lines too
        assert "loss" in shown.split("\n")[0]  # the first chart's title stays in sight
        assert "more lines: fewer metrics" in shown  # and it says what was cut
    from expr_tracker.cli.plot import _screen

    redraw = _screen("a\nb\n", 24, first=False)  # no blank screen between frames: no flicker
    assert redraw == "\x1b[H\x1b[Ka\n\x1b[Kb\n\x1b[J"
    # a line wider than the terminal wraps: it counts as the lines it takes
    wide = _screen("\n".join(["x" * 100] * 10), 10, first=True, cols=40)
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", wide).rstrip("\n").split("\n")
    assert shown[:2] == ["x" * 100] * 2 and shown[2].startswith("(8 more lines")
    assert sum(-(-len(line) // 40) for line in shown) <= 9


def test_follow_reads_a_replaced_file_from_its_start(tmp_path):
    from expr_tracker.cli.plot import RunSource, poll, read_all

    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps({"a": float(i), "_step": i}) + "\n" for i in range(10)))
    src = RunSource("r", p, None)
    select = lambda n: n == "a"  # noqa: E731
    read_all(src, select, None)
    # the run deleted and started again (another file, longer than what was read): its
    # bytes at the old offset are not a continuation
    new = tmp_path / "new.jsonl"
    new.write_text("".join(json.dumps({"a": 100.0 + i, "_step": i}) + "\n" for i in range(30)))
    os.replace(new, p)
    assert poll(src, select, None)
    col = src.columns.columns["a"]
    assert list(col.values) == [100.0 + i for i in range(30)]
    assert list(col.steps) == list(range(30))


def test_rank_shards_of_one_run_overlaid_get_short_labels(tmp_path, capsys):
    root = tmp_path / "runs"
    run = _run(root, "job", [{"loss": 1.0 / (i + 1)} for i in range(20)])
    (run / "metrics.rank1.jsonl").write_text(
        "".join(json.dumps({"loss": 2.0 / (i + 1), "_step": i}) + "\n" for i in range(20))
    )
    code, out, err = plot(
        capsys, str(run / "metrics.rank1.jsonl"), str(run), "loss", "--width", "60"
    )
    assert code == 0, err
    legend = [line.split(":")[0].split()[-1] for line in out.splitlines() if "points" in line]
    assert legend == ["job[rank1]/loss", "job/loss"]  # not the whole path of each


def test_a_metric_name_wider_than_the_chart_keeps_a_title(tmp_path, capsys):
    name = "train/" + "x" * 100 + "/loss"
    run = _run(tmp_path / "runs", "long", [{name: float(i)} for i in range(10)])
    code, out, err = plot(capsys, str(run), name, "--width", "40", "--height", "8")
    assert code == 0, err
    title = out.splitlines()[0].strip()
    assert title.startswith("train/xxx") and title.endswith("xx/loss") and "…" in title
    assert len(title) <= 40


def test_runs_option_keeps_names_with_commas_whole(tmp_path, capsys):
    root = tmp_path / "runs"
    for lr in (0.1, 0.01):
        _run(root, f"lr={lr},bs=32", [{"loss": lr * i} for i in range(20)], project="sw")
    code, out, err = plot(
        capsys, "--dir", str(root), "--runs", "sw/lr=0.1,bs=32,lr=0.01,bs=32", "loss",
        "--width", "60",
    )  # fmt: skip
    assert code == 0, err
    assert "lr=0.1,bs=32/loss: 20 points" in out and "lr=0.01,bs=32/loss: 20 points" in out
    code, _, err = plot(capsys, "--dir", str(root), "--runs", "sw/lr=0.1,bs=32,nope", "loss")
    assert code == 1 and "names no run" in err and "'nope'" in err


def test_a_metric_that_is_also_a_run_name_is_a_metric(tmp_path, capsys):
    root = tmp_path / "runs"
    run = _run(root, "mixed", [{"m": float(i), "b": float(i % 2)} for i in range(20)])
    _run(root, "m", [{"loss": 1.0}], project="q")  # runs named like the metrics
    _run(root, "b", [{"loss": 1.0}], project="q")
    other = _run(root, "other", [{"m": 2.0 * i} for i in range(5)])
    code, out, err = plot(
        capsys, str(run), "m", "b", "--dir", str(root), "--width", "50", "--height", "8"
    )
    assert code == 0, err
    legend = [line.split(":")[0].split()[-1] for line in out.splitlines() if "points" in line]
    assert legend == ["mixed/m", "mixed/b"]  # not the runs q/m and q/b
    # a run that is no metric is still a run
    code, out, err = plot(capsys, str(run), "p/other", "m", "--dir", str(root), "--width", "50")
    assert code == 0 and "other/m: 5 points" in out and "mixed/m: 20 points" in out
    assert other.exists()


def test_follow_on_a_terminal_shows_the_cursor_again_on_sigterm(tmp_path):
    import pty
    import threading

    p = tmp_path / "metrics.jsonl"  # a bare file: followed until stopped
    p.write_text("".join(json.dumps({"loss": float(i), "_step": i}) + "\n" for i in range(5)))
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "expr_tracker.cli.main", "plot", str(p), "loss", "-f"]
        + ["--interval", "0.05", "--width", "50", "--height", "8"],
        stdout=slave,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    os.close(slave)
    got = bytearray()
    seen = threading.Event()

    def read() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            if not data:
                return
            got.extend(data)
            if b"loss: 5 points" in got:
                seen.set()

    threading.Thread(target=read, daemon=True).start()
    assert seen.wait(30), bytes(got)
    assert b"\x1b[?25l" in got  # the cursor is hidden while following
    proc.send_signal(signal.SIGTERM)  # `timeout 60 et plot -f`, a process manager
    proc.wait(timeout=20)
    time.sleep(0.2)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    assert got.rstrip(b"\r\n").endswith(b"\x1b[?25h")  # and shown again
    os.close(master)


def test_a_project_directory_lists_its_runs(runs, capsys):
    root, _a, _b = runs
    code, out, err = plot(capsys, str(root / "p"), "loss")
    assert code == 1 and out == ""
    assert "is no run but holds 2 runs: a, b" in err and "--runs" in err


def test_a_metric_name_with_glob_characters_is_plotted_by_its_name(tmp_path, capsys):
    rows = [{"grad[3]": float(i), "grad[x]": 2.0 * i, "g": 1.0} for i in range(10)]
    run = _run(tmp_path / "runs", "br", rows)
    code, out, err = plot(capsys, str(run), "grad[3]", "--width", "50", "--height", "8")
    assert code == 0, err
    assert "br/grad[3]: 10 points, last 9 at step 9" in out and "grad[x]" not in out
    code, out, err = plot(capsys, str(run), "grad*", "--width", "50", "--height", "8")
    assert code == 0 and "grad[3]: 10 points" in out and "grad[x]: 10 points" in out


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_log_y_of_a_constant_or_nearly_constant_series(tmp_path, capsys):
    # plotext pads such a data range by +-1 and took log10 of <= 0: a math domain error
    p = _write(
        tmp_path / "metrics.jsonl",
        [{"lr": 3e-4, "acc": 1.0 + i * 1e-15, "_step": i} for i in range(50)],
    )
    code, out, err = plot(capsys, str(p), "lr", "acc", "--log-y", "--width", "60", "--height", "10")
    assert code == 0, err
    assert "/lr: 50 points, last 0.0003 at step 49" in out
    row = next(line for line in out.splitlines() if "┤⠠⠤" in line)  # the line's row
    assert row.lstrip().startswith("3.0e-4┤")  # drawn at its value
    assert "/acc: 50 points, last 1 at step 49" in out


def test_values_near_the_float_limits(tmp_path, capsys):
    rows = [
        {"x": 1e308 if i % 2 else -1e308, "c": 1.7e308, "tiny": 5e-324 * (i + 1), "_step": i}
        for i in range(50)
    ]
    p = _write(tmp_path / "metrics.jsonl", rows)
    for extra in ([], ["--log-y"]):  # the range overflowed plotext's scaling (NaN ticks)
        code, out, err = plot(capsys, str(p), "x", "c", "tiny", "--width", "60", *extra)
        assert code == 0, err
        assert "/x: " in out and "/c: 50 points, last 1.7e+308" in out and "/tiny: 50" in out


def test_step_ticks_of_huge_steps(tmp_path, capsys):
    p = _write(tmp_path / "metrics.jsonl", [{"a": 1.0, "_step": i * 10**15} for i in range(50)])
    code, out, err = plot(capsys, str(p), "a", "--width", "60", "--height", "8")
    assert code == 0, err
    assert _tick_line(out)[-1] == "4.9e+16"  # not 4.9e+07G
    assert "G" not in " ".join(_tick_line(out))


def test_an_unreadable_metrics_file_says_so_not_nothing_to_plot(tmp_path):
    """`et plot RUN` on a colleague's 0600 metrics file said "nothing to plot: no numeric
    metric in the newest rows": the file was never read. It says why."""
    from helpers import CANNOT_READ_SKIP, cannot_read_prefix

    run = et.init(project="p", name="theirs", dir=str(tmp_path / "runs"))
    et.log({"loss": 1.0})
    et.finish()
    metrics = run.dir / "metrics.jsonl"
    if os.geteuid() == 0:
        os.chown(metrics, 65534, 65534)
    metrics.chmod(0o600)
    prefix = cannot_read_prefix(metrics)
    if prefix is None:
        pytest.skip(CANNOT_READ_SKIP)
    p = subprocess.run(
        [*prefix, sys.executable, "-m", "expr_tracker.cli.main", "plot", str(run.dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 1, p.stderr
    assert "permission denied" in p.stderr and "nothing to plot" not in p.stderr, p.stderr
