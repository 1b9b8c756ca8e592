#!/usr/bin/env python3
"""``et ui``'s ``/api/trace`` on a run of N spans: peak RSS of the server process, time and
bytes of the download, and four downloads asked at once (budget: ≤ 300 MB peak at
1,000,000 spans, as ``et trace``).

    python benchmarks/bench_ui_trace.py                          # 400,000 and 1,000,000 spans
    python benchmarks/bench_ui_trace.py --spans 400000 --tree /path/to/other/checkout

Data: the span files of ``benchmarks/bench_trace.py`` (a training loop on the main thread and
a data stream of overlapping asyncio tasks) plus a ``run.json``, under ``--data`` (default a
temporary folder). Each measurement starts a fresh ``et ui`` (uvicorn) on 127.0.0.1 with the
code of ``--tree`` (default this checkout; another one measures the code before a change)
and reads its peak RSS (``VmHWM`` in ``/proc/PID/status``, Linux) after the download.

Measured per size:

- ``idle_mb``: the server's peak RSS after answering ``/api/runs`` and ``/api/run``;
- ``one``: one download read to the end: ``s``, ``mb`` (bytes), ``peak_mb``;
- ``four``: four downloads asked at once: their status codes (503: over the limit of heavy
  requests, answered at once with ``Retry-After``) and the server's ``peak_mb``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
TOKEN = "bench-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_run(root: Path, n: int) -> Path:
    from bench_trace import generate

    run = root / "bench" / "trace"
    run.mkdir(parents=True)
    generate(str(run), n)
    info = {"project": "bench", "name": "trace", "status": "finished", "started_at": 1.7e9}
    (run / "run.json").write_text(json.dumps(info))
    return run


def peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


class Server:
    def __init__(self, runs: Path, tree: Path, cache: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        e = dict(os.environ)
        e["PYTHONPATH"] = str(tree)
        e["ET_UI_TOKEN"] = TOKEN
        cmd = [sys.executable, "-m", "expr_tracker.cli.main", "ui", str(runs)]
        cmd += ["--port", str(self.port), "--cache-dir", str(cache)]
        self.proc = subprocess.Popen(cmd, env=e, cwd=tree, stderr=subprocess.DEVNULL)
        import httpx

        for _ in range(600):
            try:
                httpx.get(self.url + "/static/app.js", timeout=30)
                return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("et ui did not start")

    def get(self, path: str, **params: str) -> tuple[int, int, float]:
        """(status, bytes, seconds) of a download read to its end."""
        import httpx

        t = time.perf_counter()
        n = 0
        with httpx.stream(
            "GET",
            self.url + path,
            params=params,
            headers={"Authorization": f"token {TOKEN}"},
            timeout=600,
        ) as r:
            for chunk in r.iter_bytes():
                n += len(chunk)
            return r.status_code, n, time.perf_counter() - t

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def measure(runs: Path, tree: Path, cache: Path) -> dict:
    out: dict = {}
    s = Server(runs, tree, cache)
    try:
        s.get("/api/runs")
        s.get("/api/run", run="bench/trace")
        out["idle_mb"] = peak_mb(s.proc.pid)
        status, size, secs = s.get("/api/trace", run="bench/trace")
        assert status == 200, status
        out["one"] = {
            "s": round(secs, 2),
            "mb": round(size / 1e6, 1),
            "peak_mb": peak_mb(s.proc.pid),
        }
    finally:
        s.close()
    s = Server(runs, tree, cache)
    try:
        s.get("/api/runs")
        results: list = [None] * 4

        def one(i: int) -> None:
            results[i] = s.get("/api/trace", run="bench/trace")

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        out["four"] = {
            "status": sorted(r[0] for r in results),
            "s": round(time.perf_counter() - t, 2),
            "peak_mb": peak_mb(s.proc.pid),
        }
    finally:
        s.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", default="400000,1000000", help="comma-separated span counts")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose code serves")
    ap.add_argument("--data", type=Path, default=None, help="where the runs go (kept)")
    args = ap.parse_args()
    base = args.data or Path(tempfile.mkdtemp(prefix="et-bench-ui-trace-"))
    report: dict = {
        "tree": str(args.tree),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}",
        "sizes": {},
    }
    try:
        for n in (int(x) for x in args.spans.split(",")):
            runs = base / f"spans-{n}" / "runs"
            if not runs.exists():
                make_run(runs, n)
            res = measure(runs, args.tree.resolve(), base / f"spans-{n}" / "cache")
            report["sizes"][n] = res
            print(f"{n:>9,} spans: {json.dumps(res)}", file=sys.stderr, flush=True)
    finally:
        if args.data is None:
            shutil.rmtree(base, ignore_errors=True)
    report["budget_ok"] = all(r["one"]["peak_mb"] <= 300 for r in report["sizes"].values())
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
