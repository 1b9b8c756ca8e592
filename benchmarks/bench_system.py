#!/usr/bin/env python3
"""Cost of the system sampler (docs/system.md): ``log()`` p50 with it off and on, and the
sampler's own CPU per sample.

    python benchmarks/bench_system.py                  # 5 rounds, 100k log() calls each
    python benchmarks/bench_system.py --n 20000 --repeat 3

Sections, each in a fresh interpreter, run in turn within each round (off, on, on_fast,
sampler, off, on, ...) so that "before" and "after" are measured in the same minutes; the
report gives the median of each over the rounds:

- ``off``: ``log()`` of 3 floats with ``system=False``
- ``on``: the same with the sampler on at its default 10 s
- ``on_fast``: the sampler at 100 ms (100x the default rate), to see whether it shows in
  ``log()`` at all
- ``sampler``: the real probes (psutil; NVML where there is a GPU) sampled back to back:
  CPU seconds of one sample on its thread, and the share of one core that makes at 10 s
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

SECTIONS = ("off", "on", "on_fast", "sampler")
WARMUP = 1000


def child(section: str, n: int) -> dict:
    import expr_tracker as et

    root = tempfile.mkdtemp(prefix="bench_system_")
    if section == "sampler":
        return _sampler(root, max(50, n // 1000))
    system = {"off": False, "on": True, "on_fast": {"interval": "100ms"}}[section]
    et.init(project="bench", name=section, dir=root, system=system)
    log = et.log
    payloads = [
        {"loss": 1.0 + (i % 97) * 1e-3, "lr": 1e-3, "acc": 0.5 + (i % 89) * 1e-3}
        for i in range(1024)
    ]
    for i in range(WARMUP):
        log(payloads[i & 1023])
    pc = time.perf_counter_ns
    samples = [0] * n
    for i in range(n):
        p = payloads[i & 1023]
        t0 = pc()
        log(p)
        samples[i] = pc() - t0
    info = et.info().get("system") or {}
    et.finish()
    samples.sort()
    return {
        "n": n,
        "p50_us": samples[n // 2] / 1e3,
        "p99_us": samples[int(n * 0.99)] / 1e3,
        "system_rows": info.get("rows", 0),
    }


def _sampler(root: str, n: int) -> dict:
    from expr_tracker.assemble.system import sampler_pids
    from expr_tracker.system.probes import gpu_probes, host_probes, load_nvml
    from expr_tracker.system.sampler import SystemSampler

    t0 = time.thread_time()
    import psutil

    probes = host_probes(psutil, root)
    nvml = load_nvml()
    if nvml is not None:
        probes += gpu_probes(nvml, sampler_pids(psutil, os.environ))
    prepare_cpu = time.thread_time() - t0
    sampler = SystemSampler(lambda: probes, lambda row: None, interval=10.0, host="bench")
    sampler.sample()  # the probes made, a first row
    per = []
    for _ in range(n):
        c0 = time.thread_time()
        sampler.sample()
        per.append(time.thread_time() - c0)
    per.sort()
    return {
        "n": n,
        "probes": len(probes),
        "prepare_cpu_ms": prepare_cpu * 1e3,
        "sample_cpu_ms_p50": per[n // 2] * 1e3,
        "core_share_at_10s_pct": per[n // 2] / 10.0 * 100,
    }


def _line(sec: str, m: dict) -> str:
    if sec == "sampler":
        return (
            f"{sec:<8} {m['probes']:.0f} probes, one sample {m['sample_cpu_ms_p50']:.3f} ms CPU "
            f"(p50) = {m['core_share_at_10s_pct']:.4f} % of a core at 10 s; probes made in "
            f"{m['prepare_cpu_ms']:.1f} ms CPU"
        )
    return f"{sec:<8} log() p50 {m['p50_us']:6.2f} µs  p99 {m['p99_us']:7.2f} µs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n)))
        return
    sections = args.sections.split(",")
    runs: dict[str, list[dict]] = {s: [] for s in sections}
    for _ in range(args.repeat):  # interleaved: every section in each round
        for sec in sections:
            with tempfile.TemporaryDirectory(prefix="et-bench-") as tmp:  # its runs
                out = subprocess.run(
                    [sys.executable, __file__, "--child", sec, "--n", str(args.n)],
                    capture_output=True,
                    text=True,
                    check=True,
                    env={**os.environ, "TMPDIR": tmp},
                )
            runs[sec].append(json.loads(out.stdout.strip().splitlines()[-1]))
    report = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "sections": {}}
    for sec in sections:
        merged = {k: statistics.median(r[k] for r in runs[sec]) for k in runs[sec][0]}
        report["sections"][sec] = merged
        print(_line(sec, merged), flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
