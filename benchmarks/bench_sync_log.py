#!/usr/bin/env python3
"""`et.log()` per-call p50/p99 with the background sync on (to S3 on loopback: moto_server)
and off, in the same minutes.

    python benchmarks/bench_sync_log.py                      # 100,000 calls, 5 rounds
    python benchmarks/bench_sync_log.py --n 50000 --rounds 3 --interval 0.2

Starts `moto_server -H 127.0.0.1 -p PORT` and makes a bucket. Each round runs two fresh
interpreters one after the other (``off`` then ``on``; the order swapped every other round),
each logging ``--n`` rows of 3 floats (bench_log.py's ``log`` section, each call timed with
``perf_counter_ns``) after 1,000 warm-up calls; ``on`` has ``sync: {url: s3://...,
interval: --interval}``, so the background thread uploads every ``--interval`` seconds while
the loop runs (its passes during the loop are reported, from ``et.info()["sync"]``;
``finish`` includes the last upload). The timed loop of ``on`` starts once the sync's first
pass is done (its imports and S3 client made: the steady state of a training). Per section the median over rounds of each figure.
Budget (issue 26): `log()` p50 unchanged with the sync on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402
from bench_sync import _port  # noqa: E402

WARMUP = 1000


def child(section: str, n: int, url: str, interval: float) -> dict:
    import expr_tracker as et

    root = tempfile.mkdtemp(prefix="bench_sync_log_")
    sync = {"url": url, "interval": f"{interval}s"} if section == "on" else None
    # a name of its own: a run of the same name with other lines is refused by the bucket
    name = f"{section}-{os.getpid()}-{time.time_ns()}"
    et.init(project="bench", name=name, dir=root, system=False, sync=sync)
    payloads = [
        {"loss": 1.0 + (i % 97) * 1e-3, "lr": 1e-3, "acc": 0.5 + (i % 89) * 1e-3}
        for i in range(1024)
    ]
    log = et.log
    for i in range(WARMUP):
        log(payloads[i & 1023])
    # the steady state of a training: the sync's first pass (its imports, the S3 client) done
    deadline = time.monotonic() + 60
    while section == "on" and et.info()["sync"]["passes"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    before = (et.info().get("sync") or {}).get("passes", 0)
    pc = time.perf_counter_ns
    samples = [0] * n
    t_start = pc()
    for i in range(n):
        p = payloads[i & 1023]
        t0 = pc()
        log(p)
        samples[i] = pc() - t0
    loop_ns = pc() - t_start
    info = et.info().get("sync") or {}
    t0 = pc()
    et.finish()
    finish_ns = pc() - t0
    import shutil

    shutil.rmtree(root, ignore_errors=True)  # ~40 MB of rows per child
    samples.sort()
    return {
        "p50_us": samples[n // 2] / 1e3,
        "p99_us": samples[int(n * 0.99)] / 1e3,
        "mean_us": sum(samples) / n / 1e3,
        "loop_s": loop_ns / 1e9,
        "finish_ms": finish_ns / 1e6,
        "passes_during_loop": info.get("passes", 0) - before,
        "failures": info.get("failures", 0),
        "last_error": 0 if not info.get("last_error") else 1,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--interval", type=float, default=0.5, help="sync interval, seconds")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n, args.url, args.interval)))
        return
    port = _port()
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
    )
    os.environ.update(env)
    binary = Path(sys.executable).parent / "moto_server"
    server = subprocess.Popen(
        [str(binary if binary.exists() else "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
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
        report: dict = {
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "n": args.n,
            "interval_s": args.interval,
            "load_before": os.getloadavg(),
            "sections": {},
        }
        got: dict[str, list[dict]] = {"off": [], "on": []}
        for r in range(args.rounds):
            for sec in ("off", "on") if r % 2 == 0 else ("on", "off"):
                argv = [__file__, "--child", sec, "--n", str(args.n), "--url", url]
                argv += ["--interval", str(args.interval)]
                got[sec].append(harness.child_medians(argv, 1))
        for sec, runs in got.items():
            med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
            report["sections"][sec] = {**med, "p50_all": [x["p50_us"] for x in runs]}
            print(
                f"sync {sec:<3}  p50 {med['p50_us']:5.2f} µs  p99 {med['p99_us']:6.2f} µs  "
                f"mean {med['mean_us']:5.2f} µs  finish {med['finish_ms']:7.1f} ms  "
                f"passes {med['passes_during_loop']:.0f}",
                flush=True,
            )
        report["load_after"] = os.getloadavg()
        print(json.dumps(report))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
