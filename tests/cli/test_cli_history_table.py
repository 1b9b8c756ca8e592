"""`et history` table readability (transposed when the columns do not fit), unknown
--metrics names reported on stderr, and -n checked like et.history's n."""

from __future__ import annotations

import io
import json

from expr_tracker.cli.history import Printer
from expr_tracker.cli.main import main

NAMES = [
    f"{m}/model/layer{j}" for m in ("time_ms", "cpu_time_ms", "gpu_mem_peak_mb") for j in range(4)
]


def rows(n=3):
    return [
        {"_step": s, "_time": 1_700_000_000.0 + s, **{k: 1.25 * s + j for j, k in enumerate(NAMES)}}
        for s in range(n)
    ]


def render(rs, columns, width):
    out = io.StringIO()
    p = Printer("table", out, width=width)
    p.start(columns)
    p.rows(rs)
    return out.getvalue()


def test_many_columns_are_transposed_with_full_names():
    text = render(rows(3), NAMES, 80)
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= 80
    assert "…" not in text
    assert lines[0].split() == ["step", "0", "1", "2"]
    assert lines[1].split()[0] == "time"
    for j, name in enumerate(NAMES):  # every metric on its own line, full name, its values
        (line,) = [ln for ln in lines if ln.split()[0] == name]
        assert line.split()[1:] == [f"{1.25 * s + j:.6g}" for s in range(3)]


def test_transposed_steps_split_into_blocks_that_fit():
    text = render(rows(12), NAMES, 60)
    assert "…" not in text and max(len(ln) for ln in text.splitlines()) <= 60
    heads = [ln.split() for ln in text.splitlines() if ln.startswith("step")]
    assert len(heads) > 1
    assert [s for h in heads for s in h[1:]] == [str(s) for s in range(12)]


def test_columns_that_fit_stay_one_row_per_step():
    text = render(rows(3), NAMES[:2], 80)
    lines = text.splitlines()
    assert lines[0].split() == ["step", "time", *NAMES[:2]]
    assert [ln.split()[0] for ln in lines[1:]] == ["0", "1", "2"]


def write_run(tmp_path, rs):
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    return d


def test_cli_table_is_readable_at_the_terminal_width(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    d = write_run(tmp_path, rows(4))
    assert main(["history", str(d), "-n", "3"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and all(name in out for name in NAMES)
    assert max(len(ln) for ln in out.splitlines()) <= 100


def test_cli_unknown_metric_warns_on_stderr_and_exits_0(tmp_path, capsys):
    d = write_run(tmp_path, rows(4))
    assert (
        main(
            [
                "history",
                str(d),
                "-n",
                "2",
                "--metrics",
                "time_ms/model/layr1,nope",
                "--format",
                "csv",
            ]
        )
        == 0
    )
    cap = capsys.readouterr()
    assert cap.out.splitlines()[0] == "_step,_time,time_ms/model/layr1,nope"
    assert len(cap.out.splitlines()) == 3
    err = cap.err.splitlines()
    assert len(err) == 2
    assert "'time_ms/model/layr1'" in err[0] and "did you mean 'time_ms/model/layer1'" in err[0]
    assert "'nope'" in err[1] and "did you mean" not in err[1]
    assert main(["history", str(d), "--metrics", NAMES[0], "--format", "csv"]) == 0
    assert capsys.readouterr().err == ""


def test_cli_negative_n_is_every_step(tmp_path, capsys):
    d = write_run(tmp_path, rows(4))
    for n in ("-1", "-5"):
        assert main(["history", str(d), "-n", n, "--format", "jsonl"]) == 0
        assert len(capsys.readouterr().out.splitlines()) == 4
