"""A fake NVML with the call shapes of ``pynvml`` (nvidia-ml-py): module-level functions
over handles, result structs with the same attribute names, the NVMLError family and the
constants the sampler passes. Only for tests: no GPU exists on the test machine."""

from __future__ import annotations

from types import SimpleNamespace

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2


class NVMLError(Exception):
    """pynvml.NVMLError: the base of every NVML failure (it carries a return code)."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 9: "Driver Not Loaded", 999: "Unknown Error"}.get(
            self.value, f"NVML error {self.value}"
        )


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's name
    def __init__(self) -> None:
        super().__init__(3)


class FakeNVML:
    """One fake library: ``gpus`` is a list of dicts (util, mem_util, used, total, temp,
    power_mw, sm, mem_clock, procs: [(pid, used or None)], and ``unsupported``: the calls
    that raise NVMLError_NotSupported on that GPU). Counts every call in ``calls``."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_CLOCK_MEM = NVML_CLOCK_MEM

    def __init__(self, gpus: list[dict]) -> None:
        self.gpus = gpus
        self.calls: list[str] = []
        self.initialised = 0

    def _gpu(self, handle, call: str) -> dict:
        self.calls.append(call)
        if not self.initialised:
            raise NVMLError(1)  # NVML_ERROR_UNINITIALIZED
        gpu = self.gpus[handle.index]
        if call in gpu.get("unsupported", ()):
            raise NVMLError_NotSupported()
        return gpu

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self.initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int):  # noqa: N802
        if not 0 <= index < len(self.gpus):
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        return SimpleNamespace(index=index)  # pynvml: a c_nvmlDevice_t pointer

    def nvmlDeviceGetUtilizationRates(self, handle):  # noqa: N802
        g = self._gpu(handle, "utilization")
        return SimpleNamespace(gpu=g["util"], memory=g["mem_util"])  # c_nvmlUtilization_t

    def nvmlDeviceGetMemoryInfo(self, handle):  # noqa: N802
        g = self._gpu(handle, "memory")
        return SimpleNamespace(total=g["total"], used=g["used"], free=g["total"] - g["used"])

    def nvmlDeviceGetTemperature(self, handle, sensor: int) -> int:  # noqa: N802
        assert sensor == NVML_TEMPERATURE_GPU
        return self._gpu(handle, "temperature")["temp"]

    def nvmlDeviceGetPowerUsage(self, handle) -> int:  # noqa: N802
        return self._gpu(handle, "power")["power_mw"]  # milliwatts

    def nvmlDeviceGetClockInfo(self, handle, clock: int) -> int:  # noqa: N802
        g = self._gpu(handle, "clocks")
        return {NVML_CLOCK_SM: g["sm"], NVML_CLOCK_MEM: g["mem_clock"]}[clock]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):  # noqa: N802
        g = self._gpu(handle, "processes")
        # c_nvmlProcessInfo_t: pid, usedGpuMemory (None when the driver cannot tell)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in g["procs"]]


def two_gpus(pid: int) -> FakeNVML:
    """A host with two GPUs: gpu0 busy (this process holds 3 GiB of its 80 GiB, 97 %
    used); gpu1 idle, without a power reading."""
    gib = 1 << 30
    return FakeNVML(
        [
            {
                "util": 88,
                "mem_util": 40,
                "used": int(77.6 * gib),
                "total": 80 * gib,
                "temp": 71,
                "power_mw": 301_500,
                "sm": 1980,
                "mem_clock": 2619,
                "procs": [(pid, 3 * gib), (1, 5 * gib), (pid + 10_000_000, None)],
            },
            {
                "util": 0,
                "mem_util": 0,
                "used": 0,
                "total": 80 * gib,
                "temp": 30,
                "power_mw": 0,
                "sm": 210,
                "mem_clock": 405,
                "procs": [],
                "unsupported": ("power",),
            },
        ]
    )
