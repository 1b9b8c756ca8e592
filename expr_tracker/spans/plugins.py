"""Built-in span plugins: CpuTime, TorchMemory, GpuStats.

A plugin is any object with ``start(span)`` and ``end(span) -> dict`` (or a plain
``fn(span) -> dict``, an end-only plugin). ``start`` runs before the span's clock starts and
``end`` after it stops. Every plugin here pairs ``start`` and ``end`` by span identity, so
overlapping asyncio tasks and spans ended out of order never exchange measurements.

torch and pynvml are imported lazily, on the first span that needs them. Without CUDA or
NVML a plugin says so once (a warning) and returns ``{}``: the span still works.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Any

log = logging.getLogger("expr_tracker.spans")

_MB = float(1 << 20)  # "mb" in metric names means MiB (2**20 bytes)


class PluginOptionError(ValueError):
    """A plugin option has the wrong type or value (raised by the constructor, so at
    configuration time). ``option`` is its name, ``problem`` what is valid."""

    def __init__(self, plugin: str, option: str, problem: str, value: Any) -> None:
        shown = repr(value) if isinstance(value, (str, int, float)) else _type_name(value)
        super().__init__(f"{plugin} option {option}: {problem}, got {shown}")
        self.option = option
        self.problem = problem
        self.value = value


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


# ---------------------------------------------------------------------- CpuTime


class CpuTime:
    """Process CPU time over the span: ``cpu_time_ms`` (ms) and ``cpu_percent``.

    ``cpu_percent`` = 100 × CPU time / wall time, so above 100 means more than one core was
    busy. It counts every thread of the process (unrelated concurrent work inflates it) and
    is noise on spans under a millisecond.
    """

    __slots__ = ("_starts",)

    def __init__(self) -> None:
        self._starts: dict[Any, tuple[int, int]] = {}

    def start(self, span: Any) -> None:
        self._starts[span] = (time.process_time_ns(), time.perf_counter_ns())

    def end(self, span: Any) -> dict[str, float]:
        s = self._starts.pop(span, None)
        if s is None:
            return {}
        cpu = time.process_time_ns() - s[0]
        wall = time.perf_counter_ns() - s[1]
        out = {"cpu_time_ms": cpu / 1e6}
        if wall > 0:
            out["cpu_percent"] = 100.0 * cpu / wall
        return out

    def __repr__(self) -> str:
        return "CpuTime()"


# ---------------------------------------------------------------------- lazy imports

_lock = threading.Lock()
_cuda_state: list[Any] = []  # [] unknown, [module] available, [None] unavailable
_nvml_state: list[Any] = []


def _import_cuda() -> Any:
    """``torch.cuda`` if CUDA is usable, else raise (replaced by a fake in tests)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False")
    return torch.cuda


def _import_nvml() -> Any:
    """The initialised ``pynvml`` module (nvidia-ml-py), else raise (faked in tests)."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def _load_once(state: list[Any], load: Any, plugin: str, missing: str, hint: str) -> Any:
    """The module ``load()`` returns, imported once per process; None (warned once) when it
    fails, so the plugin measures nothing and the span still works."""
    if state:
        return state[0]
    with _lock:
        if not state:
            try:
                state.append(load())
            except Exception as exc:  # noqa: BLE001
                log.warning(
                    "expr_tracker: %s measures nothing: %s (%s: %s); %s",
                    plugin,
                    missing,
                    type(exc).__name__,
                    exc,
                    hint,
                )
                state.append(None)
    return state[0]


def _cuda() -> Any:
    return _load_once(
        _cuda_state,
        _import_cuda,
        "TorchMemory",
        "CUDA is not available",
        "install torch with CUDA (pip install expr-tracker[torch])",
    )


def _nvml() -> Any:
    return _load_once(
        _nvml_state,
        _import_nvml,
        "GpuStats",
        "NVML is not available",
        "pip install expr-tracker[gpu]",
    )
    with _lock:
        if not _nvml_state:
            try:
                _nvml_state.append(_import_nvml())
            except Exception as exc:  # noqa: BLE001
                log.warning(
                    "expr_tracker: GpuStats measures nothing: NVML is not available (%s: %s)"
                    "; pip install expr-tracker[gpu]",
                    type(exc).__name__,
                    exc,
                )
                _nvml_state.append(None)
    return _nvml_state[0]


# ---------------------------------------------------------------------- TorchMemory


class _Frame:
    __slots__ = ("device", "start_alloc", "carried")

    def __init__(self, device: int, start_alloc: int) -> None:
        self.device = device
        self.start_alloc = start_alloc
        self.carried = 0  # the highest peak seen before the last reset of the global mark


class _DeviceRegistry:
    """Every active TorchMemory window on one device, across instances, threads and tasks."""

    __slots__ = ("lock", "active")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: set[_Frame] = set()


_registries: dict[int, _DeviceRegistry] = {}


def _registry(device: int) -> _DeviceRegistry:
    reg = _registries.get(device)
    if reg is None:
        with _lock:
            reg = _registries.setdefault(device, _DeviceRegistry())
    return reg


def _valid_device(device: Any) -> bool:
    if device is None:
        return True
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return device >= 0
    if isinstance(device, str):
        kind, sep, index = device.partition(":")
        return kind == "cuda" and (not sep or (index.isdigit() and index.isascii()))
    return type(device).__name__ == "device" and getattr(device, "type", None) == "cuda"


class TorchMemory:
    """What the CUDA caching allocator held during the span (MiB).

    - ``gpu_mem_peak_mb``: the highest ``torch.cuda.memory_allocated`` during the span
      (absolute: tensors alive when it opened count).
    - ``gpu_mem_delta_mb``: allocated at end minus allocated at start (what the span kept).

    ``device``: None (the current device when the span starts), an index, ``"cuda:N"`` or a
    ``torch.device``. ``torch.cuda.max_memory_allocated`` is one global high-water mark:
    each span resets it on start, after carrying the mark reached so far into every active
    span on that device (all instances, threads and tasks share one registry per device),
    so ``max(carried, mark)`` is each span's own peak. Resets made outside this plugin
    cannot be accounted for.
    """

    __slots__ = ("device", "_frames")

    def __init__(self, device: Any = None) -> None:
        """Raises ``PluginOptionError`` for a ``device`` that is not None, an index >= 0,
        ``"cuda"``, ``"cuda:N"`` or a ``torch.device``."""
        if not _valid_device(device):
            raise PluginOptionError(
                "TorchMemory",
                "device",
                "must be null (the current device), an index >= 0, 'cuda' or 'cuda:N'",
                device,
            )
        self.device = device
        self._frames: dict[Any, _Frame] = {}

    def _index(self, cuda: Any) -> int:
        d = self.device
        if d is None:
            return int(cuda.current_device())
        if isinstance(d, int):
            return d
        if isinstance(d, str):
            return int(d.rsplit(":", 1)[1]) if ":" in d else int(cuda.current_device())
        idx = getattr(d, "index", None)  # torch.device
        return int(idx) if idx is not None else int(cuda.current_device())

    def start(self, span: Any) -> None:
        cuda = _cuda()
        if cuda is None:
            return
        dev = self._index(cuda)
        reg = _registry(dev)
        with reg.lock:
            peak = cuda.max_memory_allocated(dev)
            for f in reg.active:
                if peak > f.carried:
                    f.carried = peak
            cuda.reset_peak_memory_stats(dev)
            frame = _Frame(dev, cuda.memory_allocated(dev))
            reg.active.add(frame)
        self._frames[span] = frame

    def end(self, span: Any) -> dict[str, float]:
        frame = self._frames.pop(span, None)
        if frame is None:
            return {}
        cuda = _cuda()
        reg = _registry(frame.device)
        with reg.lock:
            reg.active.discard(frame)
            peak = max(frame.carried, cuda.max_memory_allocated(frame.device))
            alloc = cuda.memory_allocated(frame.device)
        return {
            "gpu_mem_peak_mb": peak / _MB,
            "gpu_mem_delta_mb": (alloc - frame.start_alloc) / _MB,
        }

    def __repr__(self) -> str:
        return f"TorchMemory(device={self.device!r})"


# ---------------------------------------------------------------------- GpuStats


class _Window:
    __slots__ = ("total", "count", "peak", "valid")

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0
        self.peak = 0
        self.valid = True


class _Sampler:
    """One background NVML reader for a (device index, interval); shared by all GpuStats.

    Each sample adds utilisation to every active window's running sum and count and raises
    its memory peak, so a window's cost is O(1) memory however long it lasts. ``recent``
    keeps the last 256 samples for diagnostics only.
    """

    def __init__(self, nvml: Any, index: int, interval: float) -> None:
        self.nvml = nvml
        self.index = index
        self.interval = interval
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.cond = threading.Condition(threading.Lock())
        self.windows: set[_Window] = set()
        self.recent: deque[tuple[float, float, int]] = deque(maxlen=256)
        self.alive = True
        self.samples = 0
        self.error: str | None = None
        self.thread: threading.Thread | None = None

    def read(self) -> tuple[float, int]:
        """One live reading: (utilisation %, memory used in bytes)."""
        util = self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu
        used = self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used
        return float(util), int(used)

    def open(self) -> _Window | None:
        w = _Window()
        with self.cond:
            if not self.alive:
                return None
            self.windows.add(w)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run,
                    name=f"expr_tracker-gpustats-{self.index}",
                    daemon=True,
                )
                self.thread.start()
            self.cond.notify_all()
        return w

    def close(self, w: _Window) -> None:
        with self.cond:
            self.windows.discard(w)

    def _run(self) -> None:
        cond = self.cond
        try:
            while True:
                with cond:
                    while self.alive and not self.windows:
                        cond.wait()
                    if not self.alive:
                        return
                    deadline = time.monotonic() + self.interval
                    while self.alive:  # notify() on open must not shorten the cadence
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        cond.wait(left)
                    if not self.alive:
                        return
                    if not self.windows:
                        continue
                util, used = self.read()
                with cond:
                    for w in self.windows:
                        w.total += util
                        w.count += 1
                        if used > w.peak:
                            w.peak = used
                    self.samples += 1
                    self.recent.append((time.monotonic(), util, used))
        except Exception as exc:  # noqa: BLE001
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning(
                "expr_tracker: GpuStats sampler for GPU %d failed (%s); unfinished span "
                "measurements are discarded",
                self.index,
                self.error,
            )
            self.stop()

    def stop(self) -> None:
        """Stop sampling; every unfinished window becomes invalid (reports nothing)."""
        with self.cond:
            self.alive = False
            for w in self.windows:
                w.valid = False
            self.windows.clear()
            self.cond.notify_all()


_samplers: dict[tuple[int, float], _Sampler] = {}


def _sampler(nvml: Any, index: int, interval: float) -> _Sampler:
    key = (index, interval)
    s = _samplers.get(key)
    if s is None or not s.alive:
        with _lock:
            s = _samplers.get(key)
            if s is None or not s.alive:
                s = _Sampler(nvml, index, interval)
                _samplers[key] = s
    return s


def stop_samplers() -> None:
    """Stop every GpuStats sampler thread (unfinished windows report nothing)."""
    with _lock:
        samplers = list(_samplers.values())
        _samplers.clear()
    for s in samplers:
        s.stop()


class GpuStats:
    """Whole-device NVML readings over the span: ``gpu_percent`` (mean utilisation, %) and
    ``gpu_mem_used_mb`` (peak device memory used by all processes, MiB).

    A background thread shared by every GpuStats with the same ``index`` and ``interval``
    (seconds) samples NVML; each span averages the samples taken while it was open. A span
    with no sample (shorter than ``interval``) takes one live reading instead, whose
    utilisation is NVML's own rolling average. If the sampler stops or fails, unfinished
    spans report nothing rather than a partial window. Needs ``pip install
    expr-tracker[gpu]``. Raises ``PluginOptionError`` (a ``ValueError``) for an ``index``
    that is not an integer >= 0 or an ``interval`` that is not a positive number of seconds.
    """

    __slots__ = ("index", "interval", "_windows")

    def __init__(self, index: int = 0, interval: float = 0.1) -> None:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise PluginOptionError(
                "GpuStats", "index", "must be a GPU index (an integer >= 0)", index
            )
        if (
            isinstance(interval, bool)
            or not isinstance(interval, (int, float))
            or not 0 < interval < float("inf")
        ):
            raise PluginOptionError(
                "GpuStats", "interval", "must be a positive number of seconds", interval
            )
        self.index = int(index)
        self.interval = float(interval)
        self._windows: dict[Any, tuple[_Sampler, _Window]] = {}

    def start(self, span: Any) -> None:
        nvml = _nvml()
        if nvml is None:
            return
        sampler = _sampler(nvml, self.index, self.interval)
        w = sampler.open()
        if w is not None:
            self._windows[span] = (sampler, w)

    def end(self, span: Any) -> dict[str, float]:
        entry = self._windows.pop(span, None)
        if entry is None:
            return {}
        sampler, w = entry
        sampler.close(w)
        if not w.valid:
            return {}
        if w.count:
            return {"gpu_percent": w.total / w.count, "gpu_mem_used_mb": w.peak / _MB}
        try:
            util, used = sampler.read()
        except Exception:  # noqa: BLE001 - a failed live reading measures nothing
            return {}
        return {"gpu_percent": util, "gpu_mem_used_mb": used / _MB}

    def __repr__(self) -> str:
        return f"GpuStats(index={self.index}, interval={self.interval})"


def _reset_after_fork() -> None:
    # threads and locks do not survive fork: the child starts with empty registries
    global _lock
    _lock = threading.Lock()
    _registries.clear()
    _samplers.clear()
    _cuda_state.clear()
    _nvml_state.clear()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_reset_after_fork)
