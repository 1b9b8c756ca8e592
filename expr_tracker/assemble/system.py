"""The system side of a run: the background sampler of the machine, its file
``metrics.system[.rankN].jsonl`` and the alert rules that read it (docs/system.md).

One sampler per host: only the main stream's process samples, and of a ``torchrun``
launch only the local rank 0 (``LOCAL_RANK``, else ``SLURM_LOCALID``); a second process
that finds the file's one-writer lock taken (another stream's run on the same folder)
skips with one debug line. The file is opened with the first row (one interval after the
start), so a run shorter than that leaves none. Nothing here ever fails the start: a sampler that cannot be
made is a warning, and the run goes on without it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from expr_tracker._warn import Warner
from expr_tracker.history.paths import hostname
from expr_tracker.runs import Run

__all__ = ["SYSTEM_STREAM", "build_system", "local_rank", "sampler_pids"]

log = logging.getLogger("expr_tracker")

#: the stream the sampler writes (``metrics.system[.rankN].jsonl``)
SYSTEM_STREAM = "system"
#: seconds finish() waits for the sampler's thread (a probe stuck in a driver call)
CLOSE_TIMEOUT_S = 2.0


def local_rank(environ: Mapping[str, str]) -> int:
    """The rank of this process on its node: ``LOCAL_RANK`` (torchrun), else
    ``SLURM_LOCALID``, else 0 (one process per node as far as we can tell)."""
    for var in ("LOCAL_RANK", "SLURM_LOCALID"):
        raw = environ.get(var)
        if raw:
            try:
                return max(0, int(raw))
            except ValueError:
                return 0
    return 0


def sampler_pids(psutil: Any, environ: Mapping[str, str]) -> Any:
    """A callable giving the processes whose GPU memory counts as the run's on this node:
    this one and, under ``torchrun`` (``LOCAL_WORLD_SIZE`` > 1), its sibling workers (the
    children of the same agent)."""
    me = os.getpid()
    try:
        several = int(environ.get("LOCAL_WORLD_SIZE") or 1) > 1
    except ValueError:
        several = False
    if not several or psutil is None:
        return lambda: {me}

    def pids() -> set[int]:
        parent = psutil.Process(me).parent()
        found = {me}
        if parent is not None:
            found.update(child.pid for child in parent.children())
        return found

    return pids


def build_system(
    run: Run,
    resolved: Any,
    run_dir: Path,
    stream: str | None,
    file_rank: int,
    rank: int,
    environ: Mapping[str, str],
) -> None:
    """Start the sampler of ``resolved.spec.system`` (when on, on the main stream, on local
    rank 0) with its writer and the ``stream: system`` rules' engine; hooked into the run
    (closer ``system``, stats section ``system``). Never raises for a sampler that cannot
    start: one warning, and the run goes on."""
    spec = resolved.spec
    s = spec.system
    if not s.enabled or stream is not None:
        return
    if local_rank(environ) != 0:
        log.debug("expr_tracker: local rank %s: the local rank 0 samples this host", rank)
        return

    warner = Warner()
    info = run.info_record if isinstance(run.info_record, dict) else {}
    host = info.get("host") or hostname()
    from expr_tracker.history.codec import encode_row
    from expr_tracker.system.sampler import SystemSampler

    engine, record = _rules(run, resolved, run_dir, file_rank, rank)
    out = _SystemFile(spec, run_dir, file_rank, rank, host, info.get("started_at"), warner)

    def write(row: dict[str, Any]) -> None:
        writer = out.open()
        if writer is None:
            sampler.close(0)  # another process samples this host, or the file failed
            return
        writer.append(encode_row(row), row["_step"])

    sampler = SystemSampler(
        lambda: _make_probes(run_dir, s.gpu, environ, warner),
        write,
        interval=s.interval,
        host=host,
        on_row=engine.on_step if engine is not None else None,
        warner=warner,
    )

    def close() -> None:
        try:
            sampler.close(CLOSE_TIMEOUT_S)
        finally:
            if engine is not None:
                engine.close()
            out.close()
            if record is not None:
                record.close()

    run.add_closer("system", close)
    run.add_stats("system", sampler.stats)
    run.system = sampler
    sampler.start()


class _SystemFile:
    """The sampler's writer, opened with its first row (a run shorter than one interval
    leaves no system file), on the sampler's thread; None once it cannot be (its one-writer
    lock is another process's: that one samples this host; or an I/O error, warned once)."""

    def __init__(
        self,
        spec: Any,
        run_dir: Path,
        file_rank: int,
        rank: int,
        host: str,
        started_at: Any,
        warner: Warner,
    ) -> None:
        self._args = (spec, run_dir, file_rank, rank, host, started_at)
        self._warner = warner
        self._lock = threading.Lock()  # the sampler's thread vs the closer
        self.writer: Any = None
        self._done = False  # failed or closed: never opened again

    def open(self) -> Any:
        with self._lock:
            if self.writer is None and not self._done:
                try:
                    self.writer = self._make()
                except Exception as exc:  # noqa: BLE001 - the run goes on without the file
                    self._done = True
                    from expr_tracker.errors import RunLockedError

                    if isinstance(exc, RunLockedError):
                        log.debug("expr_tracker: another process samples this host: %s", exc)
                    else:
                        self._warner.warn(
                            ("system", "file"),
                            "expr_tracker: system metrics are off: the file could not be "
                            "opened (%s: %s)",
                            type(exc).__name__,
                            exc,
                        )
            return self.writer

    def _make(self) -> Any:
        from expr_tracker.history.paths import file_name
        from expr_tracker.history.writer import JsonlWriter

        spec, run_dir, file_rank, rank, host, started_at = self._args
        return JsonlWriter(
            run_dir / file_name("metrics", SYSTEM_STREAM, file_rank),
            buffer_size=1,  # one row every interval: written at once, on the sampler's thread
            interval=None,
            max_seconds=None,
            async_write=False,  # never the shared flusher: no lock shared with log()
            meta_path=run_dir / file_name("meta", SYSTEM_STREAM, file_rank),
            run_meta={
                "project": spec.project,
                "name": spec.name,
                "stream": SYSTEM_STREAM,
                "rank": rank,
                "host": host,
                "started_at": started_at,
            },
            warner=self._warner,
        )

    def close(self) -> None:
        with self._lock:
            self._done = True
            writer, self.writer = self.writer, None
        if writer is not None:
            writer.close()


def _rules(run: Run, resolved: Any, run_dir: Path, file_rank: int, rank: int) -> Any:
    """The engine of the ``stream: system`` rules (None, None without one), its record
    ``alerts.system[.rankN].jsonl`` and the run's delivery (the same channels)."""
    from expr_tracker.assemble.check import make_engine

    engine = make_engine(resolved, SYSTEM_STREAM, rank, rule_stream=SYSTEM_STREAM)
    if engine is None:
        return None, None
    from expr_tracker.history.alertlog import AlertLog
    from expr_tracker.history.paths import file_name

    record = AlertLog(run_dir / file_name("alerts", SYSTEM_STREAM, file_rank))
    engine.record = record
    engine.on_action = run.take_action  # a system rule may stop the run too
    dispatcher = run.dispatcher
    engine.notify = dispatcher.notify if dispatcher is not None and engine.deliver else None
    return engine, record


def _make_probes(run_dir: Path, gpu: bool, environ: Mapping[str, str], warner: Warner) -> list[Any]:
    """On the sampler's thread: psutil's probes and, with ``gpu``, NVML's (when the GPU
    extra is installed and the host has a GPU; a hint once when there is a GPU device but
    no nvidia-ml-py)."""
    from expr_tracker.system.probes import GPU_EXTRA_HINT, gpu_probes, host_probes, load_nvml

    try:
        import psutil
    except ModuleNotFoundError as exc:
        if exc.name != "psutil":  # psutil is there, one of its parts is not
            raise RuntimeError(f"psutil cannot be imported: {exc}") from None
        raise RuntimeError(
            "psutil is not installed (pip install psutil); set system.enabled: false to "
            "silence this"
        ) from None
    except ImportError as exc:  # e.g. the interpreter shutting down under the thread
        raise RuntimeError(f"psutil cannot be imported: {exc}") from None
    probes = host_probes(psutil, run_dir)
    if gpu:
        nvml = load_nvml()
        if nvml is not None:
            try:
                probes += gpu_probes(nvml, sampler_pids(psutil, environ))
            except Exception as exc:  # noqa: BLE001 - the host's readings go on
                warner.warn(("system", "nvml"), "expr_tracker: no GPU metrics: NVML: %s", exc)
        elif os.path.exists("/dev/nvidia0"):
            warner.warn(("system", "nvml"), "expr_tracker: no GPU metrics: %s", GPU_EXTRA_HINT)
    return probes
