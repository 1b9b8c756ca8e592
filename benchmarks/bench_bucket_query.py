#!/usr/bin/env python3
"""`et query` over runs read from a bucket (S3 on loopback: moto_server) against the same
query over the same runs on the local disk.

    python benchmarks/bench_bucket_query.py                       # 100 runs x 100,000 steps
    python benchmarks/bench_bucket_query.py --runs 100 --steps 10000 --repeat 5

Data: bench_query.py's data set (``--runs`` runs of ``--steps`` steps of 5 metrics, written
by `et.log`; reused when there), synced once to a fresh bucket of a `moto_server` started
here (`et sync`). Then, each a fresh `et query` process (`--format csv -o FILE`, bench_query's
``agg`` query, its row count checked):

- ``local cold`` / ``bucket cold``: the first query (local: every ``.et-cache`` deleted;
  bucket: the local copy deleted too, so the copy is fetched and its cache built);
- ``local warm`` / ``bucket warm``: the same query again, alternating local and bucket in the
  same minutes (median of ``--repeat``); the bucket's costs one listing of the manifests,
  then the query over the copy's cache. Budget (issue 26): bucket within 2x local.

Prints one line per section, then the report as JSON (with the load average before and
after: wall times on a loaded machine are stretched).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_query  # noqa: E402
from bench_sync import _port  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "et-bench-query")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    manifest = bench_query.ensure_data(args.data, args.runs, args.steps, args.jobs)
    runs_dir = args.data / "runs"
    expect = args.runs * len(bench_query.METRICS)
    work = Path(tempfile.mkdtemp(prefix="et-bench-bucket-"))
    port = _port()
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        XDG_CACHE_HOME=str(work / "xdg"),
    )
    os.environ.update(env)
    binary = Path(sys.executable).parent / "moto_server"
    server = subprocess.Popen(
        [str(binary if binary.exists() else "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    report: dict = {
        "runs": args.runs,
        "steps": args.steps,
        "load_before": os.getloadavg(),
        "machine": bench_query.machine(),
        "sections": {},
    }
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        for _ in range(300):
            try:
                opener.open(f"http://127.0.0.1:{port}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        import boto3

        boto3.client("s3").create_bucket(Bucket="et-bench")
        url = "s3://et-bench/team"
        et = bench_query.et_command()
        t0 = time.perf_counter()
        subprocess.run([*et, "sync", str(runs_dir), url], check=True, capture_output=True)
        report["sync_s"] = time.perf_counter() - t0
        print(f"{'first sync':>12}: {report['sync_s']:.1f} s", flush=True)

        def query(where: str) -> float:
            out = work / "out.csv"
            cmd = [*et, "query", bench_query.QUERIES["agg"], where, "--format", "csv"]
            wall, _rss, _ = bench_query.spawn_measured([*cmd, "-o", str(out)])
            with open(out, encoding="utf-8") as f:
                rows = sum(1 for _ in f) - 1
            if rows != expect:
                raise SystemExit(f"{where}: {rows} rows, expected {expect}")
            return wall

        def section(name: str, times: list[float]) -> None:
            med = statistics.median(times)
            report["sections"][name] = {"seconds": med, "all": times}
            print(f"{name:>12}: {med:.2f} s (median of {len(times)})", flush=True)

        bench_query.drop_caches(args.data)
        section("local cold", [query(str(runs_dir))])
        shutil.rmtree(work / "xdg", ignore_errors=True)
        section("bucket cold", [query(url)])
        pairs = [(query(str(runs_dir)), query(url)) for _ in range(args.repeat)]
        section("local warm", [p[0] for p in pairs])
        section("bucket warm", [p[1] for p in pairs])
        ratio = (
            report["sections"]["bucket warm"]["seconds"]
            / report["sections"]["local warm"]["seconds"]
        )
        report["warm_ratio"] = ratio
        print(f"{'ratio':>12}: bucket / local warm = {ratio:.2f} (budget 2)", flush=True)
        report["load_after"] = os.getloadavg()
        report["data_generated_s"] = manifest.get("generated_s")
        print(json.dumps(report))
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
