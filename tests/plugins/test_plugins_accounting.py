"""Plugin protocol and the accounting of CpuTime, TorchMemory and GpuStats (fake CUDA/NVML)."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from expr_tracker.plugins import CpuTime, GpuStats, TorchMemory
from expr_tracker.spans import SpanRecorder, set_active_recorder, span
from expr_tracker.spans import plugins as P

MB = 1 << 20


class FakeCuda:
    """A global allocator counter with one resettable high-water mark per device."""

    def __init__(self) -> None:
        self.alloc: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.lock = threading.Lock()
        self.device = 0

    def current_device(self) -> int:
        return self.device

    def malloc(self, n: int, dev: int = 0) -> None:
        with self.lock:
            self.alloc[dev] = self.alloc.get(dev, 0) + n
            self.peak[dev] = max(self.peak.get(dev, 0), self.alloc[dev])

    def free(self, n: int, dev: int = 0) -> None:
        with self.lock:
            self.alloc[dev] -= n

    def memory_allocated(self, dev: int) -> int:
        return self.alloc.get(dev, 0)

    def max_memory_allocated(self, dev: int) -> int:
        return self.peak.get(dev, 0)

    def reset_peak_memory_stats(self, dev: int) -> None:
        self.peak[dev] = self.alloc.get(dev, 0)


@pytest.fixture
def cuda(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(P, "_import_cuda", lambda: fake)
    P._cuda_state.clear()
    P._registries.clear()
    yield fake
    P._cuda_state.clear()
    P._registries.clear()


class FakeNvml:
    def __init__(self) -> None:
        self.util = 50.0
        self.used = 100 * MB
        self.fail = False
        self.reads = 0

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("h", i)

    def nvmlDeviceGetUtilizationRates(self, h):
        self.reads += 1
        if self.fail:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return SimpleNamespace(gpu=self.util)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=self.used)


@pytest.fixture
def nvml(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setattr(P, "_import_nvml", lambda: fake)
    P.stop_samplers()
    P._nvml_state.clear()
    yield fake
    P.stop_samplers()
    P._nvml_state.clear()


def wait_for(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.005)


# ---------------------------------------------------------------------- protocol


def test_plugin_forms_reserved_keys_and_failures(caplog):
    calls = []

    class Obj:
        def start(self, s):
            calls.append(("start", s.path))

        def end(self, s):
            return {"custom": 2, "time_ms": 99, "count": 5}

    def fn(s):
        return {"fn_metric": 1.5}

    def broken(s):
        raise RuntimeError("nope")

    for _ in range(3):
        with span("x", plugins=[Obj(), fn, broken]) as s:
            pass
    assert s.metrics["custom"] == 2 and s.metrics["fn_metric"] == 1.5
    assert s.metrics["time_ms"] == s.duration_ms  # not the plugin's 99
    assert "count" not in s.metrics
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("raised in end()" in m for m in msgs) == 1  # logged once
    assert any("reserved" in m for m in msgs)


def test_plugins_inherited_and_overridden():
    seen = []

    def p(s):
        seen.append(s.path)
        return {}

    with span("a", plugins=[p]):
        with span("b"):
            pass
        with span("c", plugins=[]):
            pass
    assert seen == ["a/b", "a"]


def test_numpy_plugin_values_normalised_with_a_run():
    import numpy as np

    class Store:
        open_step = 0

        def __init__(self):
            self.m = []

        def ingest_span(self, m, d):
            self.m.append(m)
            return 0

    st = Store()
    prev = set_active_recorder(SpanRecorder(st, None))
    try:
        with span("f", plugins=[lambda s: {"v": np.float32(2.5), "arr": np.arange(2)}]) as s:
            pass
    finally:
        set_active_recorder(prev)
    assert type(st.m[0]["v/f"]) is float and st.m[0]["arr/f"] == [0, 1]
    assert type(s.metrics["v"]) is float


# ---------------------------------------------------------------------- CpuTime


def test_cputime_pairs_by_span_identity():
    cpu = CpuTime()
    a, b = span("a"), span("b")
    cpu.start(a)
    cpu.start(b)
    x = 0
    for i in range(200_000):
        x += i
    rb = cpu.end(b)
    ra = cpu.end(a)
    assert ra["cpu_time_ms"] >= rb["cpu_time_ms"] >= 0
    assert ra["cpu_percent"] >= 0
    assert cpu.end(a) == {}  # unknown span: nothing
    assert not cpu._starts


def test_cputime_async_overlap():
    cpu = CpuTime()

    async def work(n):
        async with span(n, plugins=[cpu]) as s:
            await asyncio.sleep(0.01)
        return s.metrics

    async def main():
        return await asyncio.gather(work("a"), work("b"))

    ma, mb = asyncio.run(main())
    assert "cpu_percent" in ma and "cpu_percent" in mb
    assert not cpu._starts


# ---------------------------------------------------------------------- TorchMemory


def test_torch_memory_nested_resets_keep_parent_peak(cuda):
    tm = TorchMemory()
    cuda.malloc(10 * MB)  # held before the span opened: counts toward its peak
    with span("outer", plugins=[tm]) as outer:
        cuda.malloc(90 * MB)  # 100
        cuda.free(90 * MB)  # 10
        with span("inner", plugins=[tm]) as inner:  # resets the global mark
            cuda.malloc(20 * MB)  # 30
        cuda.malloc(5 * MB)  # 35
    assert inner.metrics["gpu_mem_peak_mb"] == 30
    assert inner.metrics["gpu_mem_delta_mb"] == 20
    assert outer.metrics["gpu_mem_peak_mb"] == 100  # survived the child's reset
    assert outer.metrics["gpu_mem_delta_mb"] == 25


def test_torch_memory_across_instances_and_threads(cuda):
    a, b = TorchMemory(), TorchMemory(device="cuda:0")
    started, done = threading.Event(), threading.Event()
    out = {}

    def other():
        started.wait()
        with span("t", plugins=[b]) as s:  # different thread, different instance: resets
            cuda.malloc(1 * MB)
            cuda.free(1 * MB)
        out["t"] = s.metrics
        done.set()

    th = threading.Thread(target=other)
    th.start()
    with span("main", plugins=[a]) as m:
        cuda.malloc(64 * MB)
        cuda.free(64 * MB)
        started.set()
        done.wait()
    th.join()
    assert m.metrics["gpu_mem_peak_mb"] == 64
    assert out["t"]["gpu_mem_peak_mb"] == 1


def test_torch_memory_keeps_start_device(cuda):
    tm = TorchMemory()
    cuda.device = 1
    with span("d1", plugins=[tm]) as s:
        cuda.malloc(3 * MB, dev=1)
        cuda.device = 0
    assert s.metrics["gpu_mem_peak_mb"] == 3


def test_torch_memory_without_cuda_reports_once(monkeypatch, caplog):
    def missing():
        raise RuntimeError("torch.cuda.is_available() is False")

    monkeypatch.setattr(P, "_import_cuda", missing)
    P._cuda_state.clear()
    try:
        for _ in range(3):
            with span("x", plugins=[TorchMemory()]) as s:
                pass
        assert set(s.metrics) == {"time_ms"}
        assert sum("TorchMemory measures nothing" in r.getMessage() for r in caplog.records) == 1
    finally:
        P._cuda_state.clear()


# ---------------------------------------------------------------------- GpuStats


def test_gpustats_short_span_takes_one_live_reading(nvml):
    g = GpuStats(interval=10.0)
    nvml.util, nvml.used = 42.0, 7 * MB
    with span("short", plugins=[g]) as s:
        pass
    assert s.metrics["gpu_percent"] == 42.0 and s.metrics["gpu_mem_used_mb"] == 7


def test_gpustats_window_mean_and_peak_and_shared_sampler(nvml):
    g1, g2 = GpuStats(interval=0.01), GpuStats(interval=0.01)
    with span("long", plugins=[g1]) as s:
        sampler = P._samplers[(0, 0.01)]
        wait_for(lambda: sampler.samples >= 3)
        nvml.util, nvml.used = 100.0, 300 * MB
        n = sampler.samples
        wait_for(lambda: sampler.samples >= n + 3)
        nvml.util, nvml.used = 0.0, 50 * MB
        with span("other", plugins=[g2]):
            assert P._samplers[(0, 0.01)] is sampler  # one thread per (device, interval)
    m = s.metrics
    assert 0 < m["gpu_percent"] < 100
    assert m["gpu_mem_used_mb"] == 300
    assert sum(t.name.startswith("expr_tracker-gpustats") for t in threading.enumerate()) == 1


def test_gpustats_sampler_failure_invalidates_open_windows(nvml, caplog):
    g = GpuStats(interval=0.01)
    with span("broken", plugins=[g]) as s:
        sampler = P._samplers[(0, 0.01)]
        wait_for(lambda: sampler.samples >= 1)
        nvml.fail = True
        wait_for(lambda: not sampler.alive)
    assert "gpu_percent" not in s.metrics  # no partial window reported as complete
    assert any("sampler for GPU 0 failed" in r.getMessage() for r in caplog.records)
    nvml.fail = False
    with span("after", plugins=[g]) as s2:  # a fresh sampler takes over
        pass
    assert "gpu_percent" in s2.metrics


def test_gpustats_stop_invalidates(nvml):
    g = GpuStats(interval=0.01)
    with span("x", plugins=[g]) as s:
        P.stop_samplers()
    assert "gpu_percent" not in s.metrics


def test_gpustats_without_nvml(monkeypatch, caplog):
    def missing():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(P, "_import_nvml", missing)
    P._nvml_state.clear()
    try:
        with span("x", plugins=[GpuStats()]) as s:
            pass
        with span("y", plugins=[GpuStats()]):
            pass
        assert set(s.metrics) == {"time_ms"}
        assert sum("GpuStats measures nothing" in r.getMessage() for r in caplog.records) == 1
    finally:
        P._nvml_state.clear()


def test_gpustats_validates_interval():
    with pytest.raises(ValueError):
        GpuStats(interval=0)
