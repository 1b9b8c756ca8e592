#!/usr/bin/env python3
"""`et sync` of N runs (default 1,000) to a real S3 endpoint on loopback (moto_server).

python benchmarks/bench_sync.py [--runs 1000] [--lines 50] [--repeat 5] [--data DIR]
                                [--readers-only] [--against CHECKOUT]

Starts `moto_server -H 127.0.0.1 -p PORT` (the dev extra's moto[server]), makes a bucket and
N small runs (each `metrics.jsonl` of --lines lines, `run.json`, `summary.json`), then times
whole `et sync` processes:

- `first`: the first sync of every run (once);
- `unchanged`: a re-sync of the unchanged folder (median of --repeat); budget (issue 26):
  <= 5 s for 1,000 runs; uploads 0 bytes and asks the bucket nothing (the state file);
- `unchanged --full`: the same asking the bucket for every manifest (median of --repeat);
- `one appended`: one run got 10 lines, the rest unchanged (median of --repeat);
- `et runs URL first` / `et runs URL unchanged`: listing the runs from the bucket through the
  local copy (the first fetches every run; then one LIST of the manifests and no read, as the
  copy remembers each manifest's ETag); budget (issue 26): <= 2 s for 1,000 runs;
- `et query URL`: a count over the bucket's runs (the copy up to date, the query cache built
  on the first; median of --repeat).

`--readers-only` times only the readers (after the first sync, which fills the bucket).
`--against CHECKOUT` (a folder holding another version's `expr_tracker/`, e.g. from
`git archive`) times its `et runs URL unchanged` too, alternating with this one's, fresh
processes, the same minutes (both over one local copy: kept files of either are ignored
by the other).

Prints one line per section, then the report as JSON with the machine.
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
import tempfile
import time
import urllib.request
from pathlib import Path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_runs(root: Path, runs: int, lines: int) -> None:
    for k in range(runs):
        d = root / "bench" / f"run-{k:05d}"
        d.mkdir(parents=True)
        with open(d / "metrics.jsonl", "w") as f:
            for i in range(lines):
                f.write(json.dumps({"_step": i, "_time": 1e9 + i, "loss": 1 / (i + 1)}) + "\n")
        (d / "run.json").write_text(
            json.dumps({"project": "bench", "name": d.name, "status": "finished"})
        )
        (d / "summary.json").write_text(json.dumps({"loss": 1 / lines}))


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, dict]:
    """Wall seconds of a child process and its report; its CPU seconds (user + system)
    are added to the report as ``cpu`` (what a loaded machine distorts least)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode != 0:
        raise SystemExit(f"{cmd}: exit {out.returncode}: {out.stderr[-800:]}")
    return dt, {**json.loads(out.stdout), "cpu": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--lines", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--data", default=None)
    ap.add_argument("--readers-only", action="store_true", help="time only the readers")
    ap.add_argument("--against", default=None, metavar="CHECKOUT", help="another version")
    args = ap.parse_args()
    import boto3

    work = Path(args.data or tempfile.mkdtemp(prefix="et-bench-sync-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    port = _port()
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        XDG_CACHE_HOME=str(work / "xdg"),
    )
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
        os.environ.update(env)
        boto3.client("s3").create_bucket(Bucket="et-bench")
        make_runs(work / "runs", args.runs, args.lines)
        et = [sys.executable, "-m", "expr_tracker.cli.main", "sync", str(work / "runs")]
        url = "s3://et-bench/team"
        report: dict = {
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "machine": platform.platform(),
            "load": os.getloadavg(),
            "runs": args.runs,
            "sections": {},
        }

        def section(name: str, times: list[float], rep: dict, cpus: list[float]) -> None:
            med = statistics.median(times)
            cpu = statistics.median(cpus)
            report["sections"][name] = {
                "seconds": med,
                "cpu_seconds": cpu,
                "all": times,
                "bytes": rep["bytes"],
            }
            print(
                f"{name:>20}: {med:.2f} s wall, {cpu:.2f} s CPU (median of {len(times)}), "
                f"{rep['bytes']:,} bytes, {rep['commits']} commits, {rep['unchanged']} unchanged",
                flush=True,
            )

        dt, rep = timed([*et, url, "--json"], env)
        section("first", [dt], rep, [rep["cpu"]])
        for name, extra in (
            () if args.readers_only else (("unchanged", []), ("unchanged --full", ["--full"]))
        ):
            times, cpus = [], []
            for _ in range(args.repeat):
                dt, rep = timed([*et, url, "--json", *extra], env)
                assert rep["bytes"] == 0, rep
                times.append(dt)
                cpus.append(rep["cpu"])
            section(name, times, rep, cpus)
        times, cpus = [], []
        victim = work / "runs" / "bench" / "run-00000" / "metrics.jsonl"
        for r in range(0 if args.readers_only else args.repeat):
            with open(victim, "a") as f:
                for i in range(10):
                    f.write(json.dumps({"_step": 10_000 + r * 10 + i, "loss": 0.1}) + "\n")
            dt, rep = timed([*et, url, "--json"], env)
            times.append(dt)
            cpus.append(rep["cpu"])
        if times:
            section("one appended", times, rep, cpus)

        def plain(cmd: list[str], root: str | None = None) -> tuple[float, float]:
            import resource

            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            e = dict(env, PYTHONPATH=root) if root else env
            # not from this folder: `python -m` would import the checkout it runs in first
            out = subprocess.run(cmd, env=e, capture_output=True, text=True, cwd=work)
            dt = time.perf_counter() - t
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if out.returncode != 0:
                raise SystemExit(f"{cmd}: exit {out.returncode}: {out.stderr[-800:]}")
            return dt, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

        reader = [sys.executable, "-m", "expr_tracker.cli.main"]
        for name, cmd, n in (
            ("et runs URL first", [*reader, "runs", url], 1),
            ("et runs URL unchanged", [*reader, "runs", url], args.repeat),
            ("et query URL", [*reader, "query", "SELECT count(*) FROM metrics", url], args.repeat),
        ):
            if args.readers_only and name == "et query URL":
                continue  # bench_bucket_query.py times et query over a bucket
            got = [plain(cmd) for _ in range(n)]
            section(
                name,
                [g[0] for g in got],
                {"bytes": 0, "commits": 0, "unchanged": "-"},
                [g[1] for g in got],
            )
        if args.against:
            here = str(Path(__file__).resolve().parents[1])
            cmd = [*reader, "runs", url]
            pairs = [(plain(cmd, args.against), plain(cmd, here)) for _ in range(args.repeat)]
            for name, k in (("et runs URL, against", 0), ("et runs URL, this", 1)):
                section(
                    name,
                    [p[k][0] for p in pairs],
                    {"bytes": 0, "commits": 0, "unchanged": "-"},
                    [p[k][1] for p in pairs],
                )
        report["load_after"] = os.getloadavg()
        print(json.dumps(report))
    finally:
        server.terminate()
        server.wait()
        if args.data is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
