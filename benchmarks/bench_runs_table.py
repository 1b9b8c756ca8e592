#!/usr/bin/env python3
"""The runs table of 1,000 runs with config and summary columns, sorted and filtered
(issue 24; budget: ≤ 1 s warm over HTTP).

    python benchmarks/bench_runs_table.py                  # 1,000 runs, median of 7
    python benchmarks/bench_runs_table.py --runs 1000 --repeat 7

Data: one run written by ``et.log`` (200 steps x 3 metrics) copied ``--runs`` times into
``--data``/runs/sweep<k>/run<i>, each with its own ``config.json`` (lr, batch, seed,
optimizer, model.depth, 20 more keys the same in all) and ``summary.json`` (loss, acc),
files dated a minute back; reused when ``--data``'s stamp says the same count.

Measured (median of ``--repeat``):

- ``select_s``: ``query/runselect.py`` alone (default columns, ``--sort -summary.acc``,
  ``--where "lr > 1e-3 and status = finished"``) over the 1,000 lines;
- ``page_warm_s``: ``ui/runs.py``'s ``runs_page`` after the folder was searched again (what
  each 5-s refresh of the page costs), nothing changed; ``page_cold_s``: the first one;
- ``http_warm_s``: ``/api/runs?sort=...&where=...`` from a real ``et ui``, 2.1 s apart;
- ``cli_s``: ``et runs DIR --sort ... --where ...`` as a fresh process (imports included).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token"
SORT = "-summary.acc"
WHERE = "lr > 1e-3 and status = finished"

WRITER = textwrap.dedent(
    """
    import sys, expr_tracker as et
    et.init(project="t", name="tmpl", dir=sys.argv[1], config={"lr": 0.1}, tags=["a"])
    for i in range(200):
        et.log({"train/loss": 1.0 / (i + 1), "eval/acc": i / 200, "lr": 0.1})
    et.finish()
    """
)

CHILD = textwrap.dedent(
    """
    import json, statistics, sys, time
    from expr_tracker.query.runselect import select_runs
    from expr_tracker.ui.catalog import Catalog
    from expr_tracker.ui.runs import runs_list, runs_page
    root, cache, repeat, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sort, where = sys.argv[5], sys.argv[6]
    cat = Catalog(root, cache)
    t = time.perf_counter(); page = runs_page(cat, sort=sort, where=where); cold = time.perf_counter() - t
    assert page["total"] == n, page["total"]
    def timed(fn):
        out = []
        for _ in range(repeat):
            cat._at = -1e18  # the page refreshes every 5 s: the folder is searched again
            t = time.perf_counter(); fn(); out.append(time.perf_counter() - t)
        return statistics.median(out)
    warm = timed(lambda: runs_page(cat, sort=sort, where=where))
    rows = runs_list(cat)
    sel = []
    for _ in range(repeat):
        t = time.perf_counter(); s = select_runs(rows, sort=sort, where=where); sel.append(time.perf_counter() - t)
    print(json.dumps({"page_cold_s": cold, "page_warm_s": warm, "select_s": statistics.median(sel),
                      "kept": len(s.runs), "columns": s.columns}))
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_data(data: Path, n: int) -> Path:
    runs = data / "runs"
    stamp = data / "bench-runs-table.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("runs") == n:
        return runs
    if data.exists():
        if not stamp.exists():
            sys.exit(f"{data} exists and was not written by this script; give another --data")
        shutil.rmtree(data)
    tmpl = data / "tmpl"
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", WRITER, str(tmpl)], check=True, env=e)
    src = tmpl / "t" / "tmpl"
    past = time.time() - 60
    fixed = {f"k{j}": j for j in range(20)}
    for i in range(n):
        d = runs / f"sweep{i % 10}" / f"run{i:05d}"
        shutil.copytree(src, d, ignore=shutil.ignore_patterns(".et-cache", "*.lock"))
        info = json.loads((d / "run.json").read_text())
        status = "failed" if i % 7 == 0 else "finished"
        info.update(project=f"sweep{i % 10}", name=f"run{i:05d}", run_dir=str(d), status=status)
        (d / "run.json").write_text(json.dumps(info))
        config = {
            "lr": 10 ** -(1 + i % 5),
            "batch": 32 * (1 + i % 4),
            "seed": i,
            "optimizer": ("adam", "sgd")[i % 2],
            "model": {"depth": 2 + i % 3},
            **fixed,
        }
        (d / "config.json").write_text(json.dumps(config))
        (d / "summary.json").write_text(
            json.dumps({"loss": 1 / (1 + i), "acc": (i * 37 % 101) / 100})
        )
        for p in (*d.iterdir(), d):
            os.utime(p, (past, past))
    for p in (runs, *runs.iterdir()):
        os.utime(p, (past, past))
    stamp.write_text(json.dumps({"runs": n}))
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--data", type=Path, default=Path("/tmp/et-bench-runs-table"))
    args = ap.parse_args()
    runs = ensure_data(args.data, args.runs)
    cache = args.data / "cache"
    e = dict(os.environ, PYTHONPATH=str(ROOT), ET_UI_TOKEN=TOKEN)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(runs),
            str(cache),
            str(args.repeat),
            str(args.runs),
            SORT,
            WHERE,
        ],
        env=e,
        check=True,
        capture_output=True,
        text=True,
    )
    child = json.loads(out.stdout.splitlines()[-1])
    report = {k: round(v, 3) if isinstance(v, float) else v for k, v in child.items()}
    report.update(
        runs=args.runs,
        machine=f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}, "
        f"load {os.getloadavg()[0]:.1f}",
    )
    cli = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "expr_tracker.cli.main",
                "runs",
                str(runs),
                f"--sort={SORT}",
                "--where",
                WHERE,
                "--format",
                "json",
            ],
            env=e,
            check=True,
            capture_output=True,
        )
        cli.append(time.perf_counter() - t)
    report["cli_s"] = round(statistics.median(cli), 3)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "expr_tracker.cli.main", "ui", str(runs), "--port", str(port)]
    server = subprocess.Popen([*cmd, "--cache-dir", str(cache)], env=e, stderr=subprocess.DEVNULL)
    try:
        import httpx

        auth = {"Authorization": f"token {TOKEN}"}
        params = {"sort": SORT, "where": WHERE}
        for _ in range(600):
            try:
                httpx.get(url + "/static/app.js", timeout=60)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        httpx.get(url + "/api/runs", timeout=600, headers=auth, params=params)  # cold
        times = []
        for _ in range(args.repeat):
            time.sleep(2.1)  # past the 2-s discovery interval, as the page's 5-s refresh
            t = time.perf_counter()
            r = httpx.get(url + "/api/runs", timeout=600, headers=auth, params=params)
            times.append(time.perf_counter() - t)
            assert r.status_code == 200 and r.json()["total"] == args.runs
        report["http_warm_s"] = round(statistics.median(times), 3)
        report["http_bytes"] = len(r.content)
    finally:
        server.terminate()
        server.wait()
    report["budget_ok"] = report["http_warm_s"] <= 1.0
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
