#!/usr/bin/env python3
"""``et ui`` budgets: a 1,000,000-step metric's chart data from a warm cache (≤ 300 ms) and
the run page's first chart drawn in a real browser (≤ 2 s).

    python benchmarks/bench_ui.py                     # 1,000,000 steps x 4 metrics
    python benchmarks/bench_ui.py --steps 100000 --repeat 5

Data: one run of ``--steps`` steps of ``loss`` (spikes, a NaN and an inf), ``acc``, ``lr``
and ``grad_norm``, written by ``et.log`` in a subprocess into ``--data``/runs (default
``/tmp/et-bench-ui``); reused when its ``bench-ui.json`` says the same steps.

Measured:

- ``series cold``: ``/api/series`` of ``loss`` (width 1000) right after the columnar cache
  was deleted (the JSONL is read and cached);
- ``series warm``: the same request again, median of ``--repeat`` — in process
  (:func:`expr_tracker.ui.series.series`) and over HTTP from a real ``et ui`` (uvicorn) on
  127.0.0.1; the points returned (M4: at most 4 per bucket plus every non-finite point);
- ``series smoothed warm``: the same with ``smooth=ema:0.9`` and ``smooth=mean:20``
  (the whole raw series read out of DuckDB and smoothed before both lines are cut), median
  of ``--repeat``, in process;
- ``first chart``: headless Chromium (Debian's ``chromium``, through Playwright) opening
  the run page of the warm server: milliseconds from navigation start until the first chart
  is drawn (Plotly's graph div holds its data): the first visit of a fresh browser profile
  (plotly.js, 4.8 MB, parsed from scratch) and the median of ``--repeat`` visits after it
  (plotly.js from the browser's caches), and when plotly.js had been evaluated (the
  page's load event: the part of the time that is the browser's, not the server's).
  Skipped when chromium or playwright is missing.
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
    import math, sys, expr_tracker as et
    n = int(sys.argv[2])
    et.init(project="bench", name="big", dir=sys.argv[1])
    for i in range(n):
        loss = 2.0 / (1 + i / 1000) + 0.01 * math.sin(i)
        if i % 99991 == 500: loss = 50.0          # spikes the chart must keep
        if i == n // 3: loss = float("nan")
        if i == 2 * n // 3: loss = float("inf")
        et.log({"loss": loss, "acc": 1 - loss / 3, "lr": 1e-3, "grad_norm": 1 + (i % 7)})
    et.finish()
    """
)


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")])
    return e


def ensure_data(data: Path, steps: int) -> Path:
    runs = data / "runs"
    stamp = data / "bench-ui.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("steps") == steps:
        return runs
    if data.exists():
        if not stamp.exists():
            sys.exit(f"{data} exists and was not written by this script; give another --data")
        shutil.rmtree(data)
    data.mkdir(parents=True)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", WRITER, str(runs), str(steps)], check=True, env=env())
    print(f"wrote {steps:,} steps in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    stamp.write_text(json.dumps({"steps": steps}))
    return runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--width", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--data", type=Path, default=Path("/tmp/et-bench-ui"))
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT))
    from expr_tracker.ui.catalog import Catalog
    from expr_tracker.ui.series import series

    runs = ensure_data(args.data, args.steps)
    cache = args.data / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    cat = Catalog(runs, cache)
    t = time.perf_counter()
    res = series(cat, "bench/big", "loss", width=args.width)
    cold = time.perf_counter() - t
    warm = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        res = series(cat, "bench/big", "loss", width=args.width)
        warm.append(time.perf_counter() - t)
    (tr,) = res["traces"]
    assert tr["total"] == args.steps, tr["total"]
    assert max(y for y in tr["y"] if y is not None) == 50.0, "a spike was lost"
    assert {p["kind"] for p in tr["nonfinite"]} == {"nan", "inf"}
    from expr_tracker.history.smoothing import parse_smoothing

    smoothed = {}
    for how in ("ema:0.9", "mean:20"):
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            sres = series(cat, "bench/big", "loss", width=args.width, smooth=parse_smoothing(how))
            times.append(time.perf_counter() - t)
        assert sres["traces"][0]["total"] == args.steps
        smoothed[how] = round(statistics.median(times), 4)
    report = {
        "steps": args.steps,
        "series_smoothed_warm_s": smoothed,
        "width": args.width,
        "points": len(tr["x"]),
        "series_cold_s": round(cold, 3),
        "series_warm_s": round(statistics.median(warm), 4),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}",
    }

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "expr_tracker.cli.main", "ui", str(runs), "--port", str(port)]
    server = subprocess.Popen(
        [*cmd, "--cache-dir", str(cache)],
        env={**env(), "ET_UI_TOKEN": TOKEN},
        stderr=subprocess.DEVNULL,
    )
    try:
        import httpx

        auth = {"Authorization": f"token {TOKEN}"}
        for _ in range(600):
            try:
                httpx.get(url + "/api/runs", timeout=30, headers=auth)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        q = {"run": "bench/big", "metric": "loss", "width": args.width}
        httpx.get(url + "/api/series", params=q, timeout=120, headers=auth)
        http = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            r = httpx.get(url + "/api/series", params=q, timeout=120, headers=auth)
            http.append(time.perf_counter() - t)
            assert r.status_code == 200
        report["series_warm_http_s"] = round(statistics.median(http), 4)
        report["first_chart_ms"] = first_chart(url, args.repeat)
    finally:
        server.terminate()
        server.wait()
    report["budget_series_ok"] = report["series_warm_http_s"] <= 0.3
    if report["first_chart_ms"] is not None:
        report["budget_first_chart_ok"] = report["first_chart_ms"]["repeat_ms"] <= 2000
    print(json.dumps(report, indent=2))
    return 0


def first_chart(url: str, repeat: int) -> dict | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("first chart: skipped (playwright not installed)", file=sys.stderr)
        return None
    if chromium is None:
        print("first chart: skipped (no chromium)", file=sys.stderr)
        return None
    args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ]
    times: list[float] = []
    loads: list[float] = []
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium, args=args, headless=True)
        # one browser profile: the first load parses plotly.js from scratch, later ones
        # find it in the HTTP cache (max-age) and V8's code cache, as a returning user does
        ctx = b.new_context(viewport={"width": 1280, "height": 900})
        for i in range(repeat + 1):
            page = ctx.new_page()
            # the first visit opens the link et ui prints (its token becomes a cookie of
            # this profile: one redirect more), the others the page itself
            page.goto(url + (f"/?token={TOKEN}" if i == 0 else "/") + "#/run?run=bench%2Fbig")
            page.wait_for_function(
                "() => [...document.querySelectorAll('div.chart')].some((d) => d.dataset.loaded)",
                timeout=60_000,
            )
            times.append(page.evaluate("() => performance.now()"))
            # when plotly.min.js had been evaluated (the page's load event)
            loads.append(
                page.evaluate("() => performance.getEntriesByType('navigation')[0].loadEventEnd")
            )
            page.close()
        b.close()
    return {
        "first_visit_ms": round(times[0], 1),
        "repeat_ms": round(statistics.median(times[1:]), 1),
        "plotly_js_loaded_ms": round(statistics.median(loads[1:]), 1),
    }


if __name__ == "__main__":
    sys.exit(main())
