"""System metrics (issue 25, docs/system.md): the sampler with real psutil, probes dropped
after one warning, a bounded close, GPUs through a fake NVML with pynvml's call shapes, the
one-sampler-per-host rule, and rules over the system rows."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from fake_nvml import two_gpus

import expr_tracker as et
from expr_tracker.spec import SpecError
from expr_tracker.system.probes import gpu_probes, host_probes
from expr_tracker.system.sampler import SystemSampler

HOST_KEYS = {
    "cpu/process_pct",
    "cpu/host_pct",
    "mem/process_rss_bytes",
    "mem/host_used_bytes",
    "mem/host_available_bytes",
    "mem/host_total_bytes",
    "mem/host_used_pct",
    "disk/free_bytes",
    "disk/total_bytes",
    "disk/used_pct",
    "proc/open_files",
    "proc/threads",
}


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _wait_rows(path, n: int, limit: float = 20.0) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.02)


def test_rows_at_the_interval_with_real_psutil(tmp_path):
    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"), system_interval="100ms")
    path = run.dir / "metrics.system.jsonl"
    for i in range(3):
        et.log({"loss": 1.0 / (i + 1)})
    _wait_rows(path, 3)
    info = et.info()["system"]
    et.finish()
    rows = _rows(path)
    assert len(rows) >= 3
    host = json.loads((run.dir / "run.json").read_text())["host"]
    for row in rows:
        assert row["host"] == host
        assert HOST_KEYS <= set(row), HOST_KEYS - set(row)
        assert 0 < row["mem/host_used_bytes"] <= row["mem/host_total_bytes"]
        assert row["proc/open_files"] > 0
    steps = [r["_step"] for r in rows]
    assert steps == sorted(set(steps))  # wall time in ms, strictly increasing
    assert all(s == int(r["_time"] * 1000) for s, r in zip(steps, rows, strict=True))
    # never faster than the interval (Event.wait(interval) between two samples)
    gaps = [b["_time"] - a["_time"] for a, b in zip(rows, rows[1:], strict=False)]
    assert min(gaps) >= 0.09
    # rates start from the second sample: the probes keep a baseline from the start
    assert {"disk/read_bytes_per_s", "net/recv_bytes_per_s"} <= set(rows[1])
    assert info["dropped_probes"] == [] and info["rows"] >= 3
    # its cost: CPU seconds per sample, against 1 % of a core at the default 10 s
    assert info["cpu_s"] / info["samples"] < 0.01 * 10.0
    # the sidecar names the producer; the main stream is untouched
    meta = json.loads((run.dir / "metrics.system.meta.json").read_text())
    assert meta["run"]["stream"] == "system" and meta["run"]["host"] == host
    assert [r["loss"] for r in _rows(run.dir / "metrics.jsonl")] == [1.0, 0.5, 1.0 / 3]


def test_a_probe_that_raises_is_dropped_after_one_warning(tmp_path, caplog):
    import psutil

    calls = {"bad": 0}

    def bad():
        calls["bad"] += 1
        raise PermissionError("/proc/diskstats: permission denied")

    probes = host_probes(psutil, tmp_path)
    written = []
    sampler = SystemSampler(lambda: [*probes, ("bad", bad)], written.append, interval=10, host="h")
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        for _ in range(3):
            sampler.sample()
    assert calls["bad"] == 1  # dropped at its first failure
    warnings = [r.getMessage() for r in caplog.records if "probe" in r.getMessage()]
    assert len(warnings) == 1
    assert "'bad'" in warnings[0] and "PermissionError" in warnings[0]
    assert len(written) == 3 and all(HOST_KEYS <= set(row) for row in written)
    stats = sampler.stats()
    assert stats["dropped_probes"] == ["bad"] and "bad" not in stats["probes"]


def test_every_probe_gone_writes_nothing_and_bad_values_are_left_out():
    def broken():
        raise OSError("gone")

    written = []
    s = SystemSampler(
        lambda: [("odd", lambda: {"a": float("nan"), "b": None, "c": "x", "d": True, "e": 2})],
        written.append,
        interval=1,
        host="h",
    )
    row = s.sample()
    assert {k: v for k, v in row.items() if not k.startswith("_")} == {"host": "h", "e": 2}
    s2 = SystemSampler(lambda: [("broken", broken)], written.append, interval=1, host="h")
    assert s2.sample() is None and s2.sample() is None
    assert len(written) == 1


def test_a_failing_write_never_reaches_the_caller(caplog):
    def write(row):
        raise OSError(28, "No space left on device")

    s = SystemSampler(lambda: [("one", lambda: {"x": 1})], write, interval=1, host="h")
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        s.sample()
        s.sample()
    assert sum("could not write" in r.getMessage() for r in caplog.records) == 1


def test_close_waits_for_a_stuck_probe_only_up_to_its_bound(caplog):
    release = threading.Event()
    entered = threading.Event()

    def stuck():
        entered.set()
        release.wait(30)  # a driver call that hangs
        return {"x": 1}

    s = SystemSampler(lambda: [("stuck", stuck)], lambda row: None, interval=0.05, host="h")
    s.start()
    assert entered.wait(10)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        assert s.close(0.1) is False
    assert any("did not stop within" in r.getMessage() for r in caplog.records)
    release.set()
    s._thread.join(10)
    assert not s._thread.is_alive()


def test_close_stops_the_thread():
    s = SystemSampler(
        lambda: [("one", lambda: {"x": 1})], lambda row: None, interval=0.05, host="h"
    )
    s.start()
    assert s.close(5) is True
    assert not s._thread.is_alive()


# ---------------------------------------------------------------- GPUs (fake NVML)


def test_gpu_probes_read_every_gpu_with_pynvml_call_shapes():
    nvml = two_gpus(os.getpid())
    nvml.nvmlInit()
    s = SystemSampler(
        lambda: gpu_probes(nvml, lambda: {os.getpid()}), lambda r: None, interval=1, host="h"
    )
    with pytest.MonkeyPatch.context():
        row = s.sample()
    gib = 1 << 30
    assert row["gpu0/util_pct"] == 88 and row["gpu0/memory_util_pct"] == 40
    assert row["gpu0/memory_used_bytes"] == int(77.6 * gib)
    assert row["gpu0/memory_total_bytes"] == 80 * gib
    assert row["gpu0/memory_used_pct"] == pytest.approx(97.0, abs=0.01)
    assert row["gpu0/temperature_c"] == 71 and row["gpu0/power_w"] == 301.5
    assert (row["gpu0/sm_clock_mhz"], row["gpu0/memory_clock_mhz"]) == (1980, 2619)
    # only this process's memory; another process's and an unknown (None) one are not
    assert row["gpu0/process_memory_bytes"] == 3 * gib
    assert row["gpu1/process_memory_bytes"] == 0 and row["gpu1/util_pct"] == 0
    # gpu1 has no power reading: that probe alone is dropped
    assert "gpu1/power_w" not in row and s.dropped == ["gpu1.power"]
    assert "gpu1/temperature_c" in s.sample()
    assert nvml.calls.count("power") == 3  # gpu0 twice, gpu1 once


def test_a_run_samples_the_gpus_when_nvml_is_there(tmp_path, monkeypatch):
    nvml = two_gpus(os.getpid())
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # what `import pynvml` finds
    run = et.init(project="p", name="g", dir=str(tmp_path / "runs"), system_interval="50ms")
    path = run.dir / "metrics.system.jsonl"
    _wait_rows(path, 2)
    et.finish()
    rows = _rows(path)
    assert rows and nvml.initialised == 1
    assert {"gpu0/memory_used_pct", "gpu1/util_pct", "cpu/host_pct"} <= set(rows[-1])


def test_system_gpu_false_never_loads_nvml(tmp_path, monkeypatch):
    nvml = two_gpus(os.getpid())
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    run = et.init(
        project="p", name="g", dir=str(tmp_path / "runs"), system={"interval": "50ms", "gpu": False}
    )
    _wait_rows(run.dir / "metrics.system.jsonl", 1)
    et.finish()
    assert nvml.initialised == 0 and nvml.calls == []
    assert not any(k.startswith("gpu") for k in _rows(run.dir / "metrics.system.jsonl")[0])


def test_gpu_rule_reads_the_system_rows(tmp_path, monkeypatch):
    """A `stream: system` rule is evaluated on the sampler's rows, recorded in
    alerts.system.jsonl; the run's own engine never sees it (no unresolved-metric warning)."""
    monkeypatch.setitem(sys.modules, "pynvml", two_gpus(os.getpid()))
    rule = {
        "name": "gpu0_memory",
        "condition": "gpu0/memory_used_pct > 95",
        "for_steps": 2,
        "level": "warning",
        "message": "gpu0 memory at {gpu0/memory_used_pct:.1f}%",
        "stream": "system",
    }
    run = et.init(
        project="p",
        name="a",
        dir=str(tmp_path / "runs"),
        system_interval="50ms",
        alert_rules=[rule, "loss > 10 => error: diverged"],
    )
    names = [r.name for r in et.list_alert_rules()]  # the run's own engine: one rule
    assert len(names) == 1 and names[0].startswith("loss > 10")
    et.log({"loss": 1.0})
    path = run.dir / "alerts.system.jsonl"
    _wait_rows(path, 2)
    et.finish()
    events = _rows(path)
    assert [e["state"] for e in events[:2]] == ["pending", "firing"]  # for_steps: 2
    assert events[1]["rule"] == "gpu0_memory" and "at 97.0%" in events[1]["message"]


def test_a_bad_system_rule_fails_init_with_its_path(tmp_path):
    rule = {"name": "bad", "condition": "gpu0/util_pct >", "stream": "system"}
    with pytest.raises(SpecError) as err:
        et.init(project="p", name="b", dir=str(tmp_path / "runs"), alert_rules=[rule])
    assert "alerts.rules.bad.condition" in str(err.value)


# ---------------------------------------------------------------- who samples


def test_only_the_local_rank_0_samples(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    run = et.init(project="p", name="l", dir=str(tmp_path / "runs"), system_interval="50ms")
    et.log({"x": 1})
    assert run.system is None and "system" not in et.info()
    et.finish()
    assert not list(run.dir.glob("metrics.system*"))


def test_a_stream_producer_and_a_disabled_run_do_not_sample(tmp_path):
    run = et.init(project="p", name="s", dir=str(tmp_path / "runs"), stream="loader")
    assert run.system is None
    et.finish()
    run = et.init(project="p", name="d", dir=str(tmp_path / "runs"), system=False)
    assert run.system is None
    et.finish()
    assert not list((tmp_path / "runs").rglob("metrics.system*"))


def test_bad_interval_names_the_field(tmp_path):
    with pytest.raises(SpecError) as err:
        et.init(project="p", name="i", dir=str(tmp_path / "runs"), system_interval="1ms")
    text = str(err.value)
    assert "system.interval" in text and "at least" in text and "50ms" in text


def test_the_shipped_system_rules_fire_on_a_full_gpu(tmp_path, monkeypatch):
    """conf/tracker/alerts/system.yaml (+tracker/alerts=system): GPU memory > 95 % for 3
    samples fires; a busy GPU is not stalled; the disk here is not full."""
    import yaml

    path = Path(et.__file__).parent / "conf" / "tracker" / "alerts" / "system.yaml"
    rules = yaml.safe_load(path.read_text())["alerts"]["rules"]
    assert {r["stream"] for r in rules.values()} == {"system"}
    monkeypatch.setitem(sys.modules, "pynvml", two_gpus(os.getpid()))
    run = et.init(
        project="p",
        name="shipped",
        dir=str(tmp_path / "runs"),
        spec={"alerts": {"rules": rules}},
        system_interval="50ms",
    )
    alerts = run.dir / "alerts.system.jsonl"
    _wait_rows(alerts, 3)
    et.finish()
    events = _rows(alerts)
    firing = [e for e in events if e["state"] == "firing"]
    assert firing and {e["rule"] for e in firing} == {"et_gpu_memory"}
    assert "gpu0 memory 97.0% used" in firing[0]["message"]


def test_a_run_shorter_than_one_interval_leaves_no_system_file(tmp_path):
    run = et.init(project="p", name="short", dir=str(tmp_path / "runs"))  # 10 s default
    et.log({"x": 1})
    assert run.system is not None and run.system.interval == 10.0
    et.finish()
    assert not list(run.dir.glob("metrics.system*")) and not run.system._thread.is_alive()


def test_a_live_system_rule_is_refused_with_where_it_goes(tmp_path):
    et.init(project="p", name="live", dir=str(tmp_path / "runs"))
    with pytest.raises(ValueError, match="alerts.rules"):
        et.add_alert_rule({"condition": "gpu0/util_pct < 5", "stream": "system"})
    assert et.list_alert_rules() == []


def test_rules_check_knows_the_stream_field(tmp_path):
    from expr_tracker.alerts.rules import entry_errors

    assert entry_errors({"condition": "gpu0/util_pct < 5", "stream": "system"}) == []
    (err,) = entry_errors({"condition": "x > 1", "stream": "data"})
    assert err.field == "stream" and "'system'" in str(err)


def test_a_run_ended_during_the_psutil_import_warns_nothing(caplog):
    """finish() right after init() on a loaded machine: the sampler's thread is still in
    ``import psutil`` when the run ends, and that import then fails as the interpreter
    shuts down. No "psutil is not installed", no wait, no row."""
    entered, release = threading.Event(), threading.Event()
    rows: list[dict] = []

    def slow_import():
        entered.set()
        release.wait(30)
        raise ModuleNotFoundError("No module named 'psutil'", name="psutil")

    s = SystemSampler(slow_import, rows.append, interval=0.01, host="h")
    with caplog.at_level(logging.DEBUG, logger="expr_tracker"):
        s.start()
        assert entered.wait(10)
        t0 = time.monotonic()
        assert s.close(5) is True and time.monotonic() - t0 < 1.0  # not held up
        release.set()
        s._thread.join(10)
    assert not s._thread.is_alive() and rows == [] and s.warner.counts == {}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # the same failure while the run goes on is reported, once
    s2 = SystemSampler(slow_import, rows.append, interval=0.01, host="h")
    s2.prepare()
    assert list(s2.warner.counts) == ["system: probes"]
