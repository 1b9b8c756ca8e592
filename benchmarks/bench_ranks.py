#!/usr/bin/env python3
"""What skew(time_ms/forward) costs rank 0 per step (python benchmarks/bench_ranks.py [--n N]).

Rank 0 of a run with WORLD_SIZE ranks (the environment a torchrun rank sees) times one step:
a ``forward`` span and ``et.log({"loss": ...})``, the commit where rules run. The other ranks'
metrics files are appended between steps, outside the timed region, ten steps at a time (as
their writers flush), so rank 0 reads and decodes one new line per peer and step.

Sections:
  base        no rule (the span + log step alone)
  rule        one plain rule on time_ms/forward (what evaluating any rule adds)
  skew2       skew rule, 2 ranks, default poll interval (50 ms: a fast loop polls rarely)
  skew2_poll  skew rule, 2 ranks, a poll on every step (steps of 50 ms or more: the real case)
  skew8_poll  skew rule, 8 ranks, a poll on every step
The budget it is compared with: a span's enter+exit, 2 µs (p50), in DESIGN.md's table;
``added_us`` is the section's p50 minus base's, ``skew_us`` minus rule's (skew's own cost).
``cpu_us`` is the mean thread CPU time of a step (polls included, amortised; on a loaded
machine the steadier figure) and ``skew_cpu_us`` the same minus rule's. Prints one line per
section, then JSON.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

SECTIONS = ("base", "rule", "skew2", "skew2_poll", "skew8_poll")
RULE = {"name": "straggler", "condition": "skew(time_ms/forward) > 1.5", "for_steps": 20}
#: a plain rule on the same metric: what any rule costs, so that skew's own cost shows
PLAIN = {"name": "slow", "condition": "time_ms/forward > 1e9"}


def child(section: str, n: int) -> dict:
    world = 8 if section.startswith("skew8") else 2
    os.environ.update(WORLD_SIZE=str(world), RANK="0")
    import expr_tracker as et

    d = Path(tempfile.mkdtemp(prefix="bench-ranks-"))
    rules = {"base": [], "rule": [PLAIN]}.get(section, [RULE])
    run = et.init(run_dir=str(d / "r"), backends=[], alert_rules=rules)
    if section.endswith("_poll"):  # every step polls the peers' files
        run.alerts.peers.peers.interval = 0.0
    peers = [
        os.open(d / "r" / f"metrics.rank{r}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        for r in range(1, world)
    ]
    line = '{"_step":%d,"_time":1.7e9,"loss":0.5,"time_ms/forward":%.3f}\n'
    pc = time.perf_counter_ns
    tt = time.thread_time_ns  # CPU time: what a loaded machine's waiting does not inflate
    out = []
    cpu = 0
    warm = 1000
    for i in range(n + warm):
        if i % 10 == 0:
            for fd in peers:
                os.write(fd, "".join(line % (s, 0.002) for s in range(i, i + 10)).encode())
        if i == warm:
            gc.collect()
        c0 = tt()
        t0 = pc()
        with et.span("forward"):
            pass
        et.log({"loss": 0.5})
        if i >= warm:
            out.append(pc() - t0)
            cpu += tt() - c0
    info = et.info()
    et.finish()
    for fd in peers:
        os.close(fd)
    out.sort()
    stats = run.alerts.peers.stats() if rules and run.alerts.peers else {}
    judged = stats.get("judgements", 0) if rules != [PLAIN] else 0
    return {
        "p50_us": out[len(out) // 2] / 1e3,
        "p99_us": out[int(len(out) * 0.99)] / 1e3,
        "mean_us": sum(out) / len(out) / 1e3,
        "cpu_us": cpu / len(out) / 1e3,
        "judgements": judged,
        "polls": stats.get("polls", 0) if judged else 0,
        "fires": sum(r["fires"] for r in info.get("alerts", {}).get("rules", {}).values())
        if rules
        else 0,
    }


SEEN: dict = {}


def line(section: str, m: dict) -> str:
    SEEN[section] = m["p50_us"]
    m["added_us"] = m["p50_us"] - SEEN.get("base", m["p50_us"])
    m["skew_us"] = m["p50_us"] - SEEN.get("rule", m["p50_us"]) if section.startswith("skew") else 0
    SEEN["cpu " + section] = m["cpu_us"]
    rule_cpu = SEEN.get("cpu rule", m["cpu_us"])
    m["skew_cpu_us"] = m["cpu_us"] - rule_cpu if section.startswith("skew") else 0
    return (
        f"{section:11s} p50 {m['p50_us']:6.2f} µs  p99 {m['p99_us']:7.2f} µs  "
        f"mean {m['mean_us']:6.2f} µs  +{m['added_us']:5.2f} over base, skew alone "
        f"{m['skew_us']:+5.2f} (budget 2 µs); CPU mean {m['cpu_us']:6.2f} µs, skew alone "
        f"{m['skew_cpu_us']:+5.2f}; judged {m['judgements']:.0f}, {m['polls']:.0f} polls"
    )


if __name__ == "__main__":
    harness.run(__file__, __doc__ or "", SECTIONS, child, line)
