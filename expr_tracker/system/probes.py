"""What the system sampler reads: probes over psutil (CPU, memory, disk, network, open
files) and NVML (each GPU), each a small callable returning ``{metric: number}``.

A probe is ``(name, fn)``; ``fn()`` returns a flat dict of finite numbers and may raise
anything: the sampler drops a probe after its first failure, with one warning
(docs/system.md "Metrics"). Rates (``*_bytes_per_s``) are over the time since the probe's
previous call; the first call of a rate probe returns nothing (no baseline yet).

psutil and pynvml (the ``gpu`` extra, ``nvidia-ml-py``) are imported on the sampler's
thread when a run starts, never at ``import expr_tracker``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

__all__ = ["GPU_EXTRA_HINT", "Probe", "gpu_probes", "host_probes", "load_nvml"]

#: one probe: its name (the warning names it) and the callable reading it
Probe = tuple[str, Callable[[], dict[str, float]]]

GPU_EXTRA_HINT = "pip install 'expr-tracker[gpu]' (nvidia-ml-py) to sample the GPUs"


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 3) if whole else None


class _Rate:
    """Bytes per second of cumulative counters between two calls (None the first time, or
    when a counter went backwards: a wrap or a reset)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: tuple[float, dict[str, float]] | None = None

    def __call__(self, counters: dict[str, float]) -> dict[str, float]:
        now = self._clock()
        last, self._last = self._last, (now, counters)
        if last is None or now <= last[0]:
            return {}
        dt = now - last[0]
        out = {}
        for key, value in counters.items():
            before = last[1].get(key)
            if before is not None and value >= before:
                out[key] = round((value - before) / dt, 3)
        return out


def host_probes(
    psutil: Any, disk_path: str | os.PathLike[str], pid: int | None = None
) -> list[Probe]:
    """The psutil probes: ``cpu`` (``cpu/process_pct``, ``cpu/host_pct``: percent of one
    core for the process, of all cores for the host, since the previous sample), ``memory``
    (``mem/process_rss_bytes``, ``mem/host_used_bytes``, ``mem/host_available_bytes``,
    ``mem/host_total_bytes``, ``mem/host_used_pct``), ``disk`` (``disk/free_bytes``,
    ``disk/total_bytes``, ``disk/used_pct`` of the file system holding ``disk_path``),
    ``disk_io`` (``disk/read_bytes_per_s``, ``disk/write_bytes_per_s``, the host's),
    ``net`` (``net/sent_bytes_per_s``, ``net/recv_bytes_per_s``, the host's) and
    ``files`` (``proc/open_files``: the process's open descriptors, ``proc/threads``).

    ``psutil`` is the module (passed in, so a caller without it never imports it here).
    The CPU percentages are primed here: the first sample covers the time since this call.
    """
    proc = psutil.Process(pid)
    proc.cpu_percent(None)  # the baseline of the first sample
    psutil.cpu_percent(None)
    path = os.fspath(disk_path)

    def cpu() -> dict[str, float]:
        return {
            "cpu/process_pct": proc.cpu_percent(None),
            "cpu/host_pct": psutil.cpu_percent(None),
        }

    def memory() -> dict[str, float]:
        vm = psutil.virtual_memory()
        return {
            "mem/process_rss_bytes": proc.memory_info().rss,
            "mem/host_used_bytes": vm.total - vm.available,
            "mem/host_available_bytes": vm.available,
            "mem/host_total_bytes": vm.total,
            "mem/host_used_pct": vm.percent,
        }

    def disk() -> dict[str, float]:
        du = psutil.disk_usage(path)
        return {
            "disk/free_bytes": du.free,
            "disk/total_bytes": du.total,
            "disk/used_pct": du.percent,
        }

    io_rate = _Rate()

    def disk_io() -> dict[str, float]:
        c = psutil.disk_io_counters()
        if c is None:  # no disk the kernel counts (some containers)
            raise OSError("the host reports no disk I/O counters")
        rates = io_rate({"read": c.read_bytes, "write": c.write_bytes})
        return {f"disk/{k}_bytes_per_s": v for k, v in rates.items()}

    net_rate = _Rate()

    def net() -> dict[str, float]:
        c = psutil.net_io_counters()
        if c is None:
            raise OSError("the host reports no network counters")
        rates = net_rate({"sent": c.bytes_sent, "recv": c.bytes_recv})
        return {f"net/{k}_bytes_per_s": v for k, v in rates.items()}

    count_files = getattr(proc, "num_fds", None)  # POSIX: one listdir of /proc/PID/fd

    def files() -> dict[str, float]:
        n = count_files() if count_files is not None else len(proc.open_files())
        return {"proc/open_files": n, "proc/threads": proc.num_threads()}

    disk_io()  # baselines
    net()
    return [
        ("cpu", cpu),
        ("memory", memory),
        ("disk", disk),
        ("disk_io", disk_io),
        ("net", net),
        ("files", files),
    ]


def load_nvml() -> Any:
    """The ``pynvml`` module (``nvidia-ml-py``), initialised; None when it is not installed
    or NVML does not start (no driver, no GPU). Raises nothing."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded ...
        return None
    return pynvml


def gpu_probes(nvml: Any, pids: Callable[[], set[int]]) -> list[Probe]:
    """One probe per GPU and reading, over an initialised NVML module (``pynvml``'s call
    shapes): ``gpu<i>.util`` (``gpu<i>/util_pct``, ``gpu<i>/memory_util_pct``),
    ``gpu<i>.memory`` (``gpu<i>/memory_used_bytes``, ``gpu<i>/memory_total_bytes``,
    ``gpu<i>/memory_used_pct``), ``gpu<i>.temperature`` (``gpu<i>/temperature_c``),
    ``gpu<i>.power`` (``gpu<i>/power_w``), ``gpu<i>.clocks`` (``gpu<i>/sm_clock_mhz``,
    ``gpu<i>/memory_clock_mhz``) and ``gpu<i>.process`` (``gpu<i>/process_memory_bytes``:
    the GPU memory of the processes ``pids()`` names: this one and, under ``torchrun``,
    the other ranks of this node). A GPU without a reading (power on some boards) loses
    that probe only. No probe when NVML counts no GPU.
    """
    probes: list[Probe] = []
    for i in range(nvml.nvmlDeviceGetCount()):
        probes += _one_gpu(nvml, i, nvml.nvmlDeviceGetHandleByIndex(i), pids)
    return probes


def _one_gpu(nvml: Any, i: int, handle: Any, pids: Callable[[], set[int]]) -> list[Probe]:
    p = f"gpu{i}/"

    def util() -> dict[str, float]:
        u = nvml.nvmlDeviceGetUtilizationRates(handle)
        return {p + "util_pct": u.gpu, p + "memory_util_pct": u.memory}

    def memory() -> dict[str, float]:
        m = nvml.nvmlDeviceGetMemoryInfo(handle)
        return {
            p + "memory_used_bytes": m.used,
            p + "memory_total_bytes": m.total,
            p + "memory_used_pct": _pct(m.used, m.total),
        }

    def temperature() -> dict[str, float]:
        return {
            p + "temperature_c": nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        }

    def power() -> dict[str, float]:
        return {p + "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0}  # milliwatts

    def clocks() -> dict[str, float]:
        return {
            p + "sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            p + "memory_clock_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
        }

    def process() -> dict[str, float]:
        mine = pids()
        used = 0
        for info in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            # usedGpuMemory is None where the driver cannot tell (Windows WDDM, some MIG)
            if info.pid in mine and info.usedGpuMemory is not None:
                used += info.usedGpuMemory
        return {p + "process_memory_bytes": used}

    q = f"gpu{i}."
    return [
        (q + "util", util),
        (q + "memory", memory),
        (q + "temperature", temperature),
        (q + "power", power),
        (q + "clocks", clocks),
        (q + "process", process),
    ]
