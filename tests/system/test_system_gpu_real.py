"""The GPU probes over the real NVML (nvidia-ml-py) on a machine with a GPU; skipped
without one (the fake-NVML tests in test_system_sampler.py run everywhere)."""

from __future__ import annotations

import os

import pytest

from expr_tracker.system.probes import gpu_probes, load_nvml
from expr_tracker.system.sampler import SystemSampler

NVML = load_nvml()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(NVML is None, reason="needs nvidia-ml-py and an NVIDIA GPU"),
]


def test_real_nvml_reads_every_gpu():
    count = NVML.nvmlDeviceGetCount()
    assert count >= 1
    s = SystemSampler(
        lambda: gpu_probes(NVML, lambda: {os.getpid()}), lambda row: None, interval=1, host="h"
    )
    row = s.sample()
    for i in range(count):
        p = f"gpu{i}/"
        assert 0 <= row[p + "util_pct"] <= 100
        assert 0 < row[p + "memory_total_bytes"]
        assert 0 <= row[p + "memory_used_bytes"] <= row[p + "memory_total_bytes"]
        assert 0 <= row[p + "memory_used_pct"] <= 100
        assert row[p + "process_memory_bytes"] >= 0
    # a reading a board lacks (power, clocks under MIG) is dropped, never raised
    assert set(s.dropped) <= {
        f"gpu{i}.{k}" for i in range(count) for k in ("power", "clocks", "temperature", "process")
    }


def test_real_nvml_sees_this_process_memory():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA through torch")
    x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda:0")  # 256 MiB
    torch.cuda.synchronize()
    s = SystemSampler(
        lambda: gpu_probes(NVML, lambda: {os.getpid()}), lambda row: None, interval=1, host="h"
    )
    row = s.sample()
    del x
    if "gpu0.process" in s.dropped or row["gpu0/process_memory_bytes"] == 0:
        # the driver lists no process, or lists host PIDs another PID namespace cannot match
        pytest.skip("NVML names no process of this PID namespace here")
    assert row["gpu0/process_memory_bytes"] >= 256 << 20
