"""TorchMemory and GpuStats on a real GPU (skipped without CUDA / NVML)."""

from __future__ import annotations

import pytest

from expr_tracker.plugins import GpuStats, TorchMemory
from expr_tracker.spans import plugins as P
from expr_tracker.spans import span


def _cuda_ok() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


# a string condition: evaluated when a test runs, so collecting does not import torch
pytestmark = [pytest.mark.gpu, pytest.mark.skipif("not _cuda_ok()", reason="needs CUDA")]


def test_torch_memory_real_nested():
    import torch

    P._cuda_state.clear()
    tm = TorchMemory()
    mb = 1 << 20
    with span("outer", plugins=[tm]) as outer:
        big = torch.empty(256 * mb, dtype=torch.uint8, device="cuda")
        del big
        with span("inner", plugins=[tm]) as inner:
            keep = torch.empty(16 * mb, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
    assert outer.metrics["gpu_mem_peak_mb"] >= 256
    assert 16 <= inner.metrics["gpu_mem_peak_mb"] < 256
    assert inner.metrics["gpu_mem_delta_mb"] >= 16
    del keep


def test_gpustats_real():
    pytest.importorskip("pynvml")
    import torch

    P._nvml_state.clear()
    g = GpuStats(interval=0.01)
    with span("matmul", plugins=[g]) as s:
        a = torch.randn(4096, 4096, device="cuda")
        for _ in range(50):
            a = a @ a
            a = a / a.norm()
        torch.cuda.synchronize()
    assert 0 <= s.metrics["gpu_percent"] <= 100
    assert s.metrics["gpu_mem_used_mb"] > 0
    P.stop_samplers()
