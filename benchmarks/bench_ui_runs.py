#!/usr/bin/env python3
"""``et ui``'s runs table at 3,000 runs: a refresh (what the page asks every 5 s) cold and
warm, in process and over HTTP (budget: ≤ 0.5 s warm).

    python benchmarks/bench_ui_runs.py                      # 3,000 runs
    python benchmarks/bench_ui_runs.py --runs 3000 --repeat 7 --tree /path/to/other/checkout

Data: one run written by ``et.log`` (200 steps x 3 metrics, config, tags, summary) copied
``--runs`` times into ``--data``/runs/proj<k>/run<i> with its ``run.json`` renamed, files
dated a minute back (a folder of finished runs); reused when ``--data``'s stamp says the
same count. ``--tree``: the checkout whose code is measured (default this one; another
measures the code before a change).

Measured (each a fresh process of ``--tree``'s code, median of ``--repeat``):

- ``cold_s``: the first table of a fresh process (every run read);
- ``warm_s``: a refresh after the run list was searched again (what each 5-s refresh of the
  page costs: more than the 2-s discovery interval apart), nothing changed;
- ``one_live_s``: the same while one run appends a row before every refresh;
- ``http_warm_s``: ``/api/runs`` from a real ``et ui`` (uvicorn), 2.1 s apart (so every
  request searches the folder again), the JSON read to its end.
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

WRITER = textwrap.dedent(
    """
    import sys, expr_tracker as et
    et.init(project="t", name="tmpl", dir=sys.argv[1], config={"lr": 0.1, "model": {"depth": 4}},
            tags=["a", "b"], group="g")
    for i in range(200):
        et.log({"train/loss": 1.0 / (i + 1), "eval/acc": i / 200, "lr": 0.1})
    et.finish()
    """
)

CHILD = textwrap.dedent(
    """
    import json, statistics, sys, time
    from pathlib import Path
    from expr_tracker.ui.catalog import Catalog
    from expr_tracker.ui.runs import runs_list
    root, cache, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
    live = Path(root) / "proj0" / "run00000" / "metrics.jsonl"
    cat = Catalog(root, cache)
    t = time.perf_counter(); rows = runs_list(cat); cold = time.perf_counter() - t
    assert len(rows) == int(sys.argv[4]), len(rows)
    def timed(before=None):
        out = []
        for i in range(repeat):
            if before: before(i)
            cat._at = -1e18  # the page refreshes every 5 s: the folder is searched again
            t = time.perf_counter(); runs_list(cat); out.append(time.perf_counter() - t)
        return statistics.median(out)
    warm = timed()
    def append(i):
        with open(live, "a") as fh:
            fh.write(json.dumps({"train/loss": 0.5, "_step": 1000 + i, "_time": time.time()}) + "\\n")
    one_live = timed(append)
    print(json.dumps({"cold_s": cold, "warm_s": warm, "one_live_s": one_live}))
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_data(data: Path, n: int) -> Path:
    runs = data / "runs"
    stamp = data / "bench-ui-runs.json"
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
    for i in range(n):
        d = runs / f"proj{i % 10}" / f"run{i:05d}"
        shutil.copytree(src, d, ignore=shutil.ignore_patterns(".et-cache", "*.lock"))
        info = json.loads((d / "run.json").read_text())
        info.update(project=f"proj{i % 10}", name=f"run{i:05d}", run_dir=str(d))
        (d / "run.json").write_text(json.dumps(info))
        for p in (*d.iterdir(), d):
            os.utime(p, (past, past))
    for p in (runs, *runs.iterdir()):
        os.utime(p, (past, past))
    stamp.write_text(json.dumps({"runs": n}))
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--data", type=Path, default=Path("/tmp/et-bench-ui-runs"))
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose code runs")
    args = ap.parse_args()
    tree = args.tree.resolve()
    runs = ensure_data(args.data, args.runs)
    cache = args.data / "cache"
    e = dict(os.environ, PYTHONPATH=str(tree), ET_UI_TOKEN=TOKEN)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(runs), str(cache), str(args.repeat), str(args.runs)],
        env=e,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    report = {k: round(v, 3) for k, v in json.loads(out.stdout.splitlines()[-1]).items()}
    report.update(
        runs=args.runs,
        tree=str(tree),
        machine=f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}",
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "expr_tracker.cli.main", "ui", str(runs), "--port", str(port)]
    server = subprocess.Popen(
        [*cmd, "--cache-dir", str(cache)], env=e, cwd=tree, stderr=subprocess.DEVNULL
    )
    try:
        import httpx

        auth = {"Authorization": f"token {TOKEN}"}
        for _ in range(600):
            try:
                httpx.get(url + "/static/app.js", timeout=60)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        httpx.get(url + "/api/runs", timeout=600, headers=auth)  # cold
        times = []
        for _ in range(args.repeat):
            time.sleep(2.1)  # past the 2-s discovery interval, as the page's 5-s refresh
            t = time.perf_counter()
            r = httpx.get(url + "/api/runs", timeout=600, headers=auth)
            times.append(time.perf_counter() - t)
            assert r.status_code == 200 and len(r.json()["runs"]) == args.runs
        report["http_warm_s"] = round(statistics.median(times), 3)
        report["http_bytes"] = len(r.content)
    finally:
        server.terminate()
        server.wait()
    report["budget_ok"] = report["http_warm_s"] <= 0.5
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
