"""The history side of a run: its directory, the one-writer lock taken first and the undo
of a failed attempt (:class:`Attempt`), resume, the history writer and store, ``run.json``,
``config[.S].json``, ``spec.json`` and the summary (:func:`construct_run`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from expr_tracker._warn import Warner
from expr_tracker.history.codec import dumps_pretty, normalize_value
from expr_tracker.history.metricdefs import MetricDefs
from expr_tracker.history.paths import atomic_write, file_name
from expr_tracker.history.recovery import release_lock_fd
from expr_tracker.history.runinfo import (
    dead_status,
    new_run_info,
    open_life,
    previous_attempt,
    read_run_info,
    write_run_info,
)
from expr_tracker.history.store import HistoryStore
from expr_tracker.history.writer import JsonlWriter
from expr_tracker.runconfig import RunConfig
from expr_tracker.runs import Run
from expr_tracker.runsummary import Summary
from expr_tracker.spans.core import AGGREGATION as SPAN_AGGREGATION
from expr_tracker.spec.errors import scrub_argv


def run_directory(spec: Any) -> Path:
    """``run_dir`` when given, else ``<dir>/<project>/<name>``, made absolute against the
    working directory of the moment the run starts: a script (or a framework) that
    changes directory later still writes every file of the run into that one folder."""
    if spec.run_dir:
        return Path(spec.run_dir).expanduser().absolute()
    path: Path = Path(spec.dir).expanduser() / spec.project / spec.name
    return path.absolute()


def normalize_config(config: Any, warner: Warner | None = None) -> dict[str, Any]:
    """The run config as JSON-able data (``config.json``).

    Takes mappings, OmegaConf containers (an interpolation that cannot be resolved stays
    literal, with a warning naming its key), sets, dtypes, dataclasses and nested mixes.
    """
    if config is None:
        return {}
    data = normalize_value(_resolve_omegaconf(config, "config"), warner)
    if not isinstance(data, dict):
        return {"value": data}
    return data


def _resolve_omegaconf(value: Any, path: str) -> Any:
    """Replace every OmegaConf container inside ``value`` by plain data, each value resolved
    on its own (one that cannot be resolved stays literal, with a warning naming its key)."""
    if type(value).__module__.startswith("omegaconf"):
        from expr_tracker.spec.models import omegaconf_to_plain

        return omegaconf_to_plain(value, key_path=path)
    if isinstance(value, dict):
        return {k: _resolve_omegaconf(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_resolve_omegaconf(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


class Attempt:
    """What one ``build`` created, so a failed construction can be undone — and only that.

    :meth:`lock` takes the producer's one-writer lock first (creating the directories that
    are missing, remembered); :meth:`snapshot` is taken under the lock. An undo cuts this
    producer's append-only files (metrics, spans, alerts) back to their size, restores its
    small files (sidecar, summary, run.json), puts back ``config[.S].json``/``spec.json``
    only where they still hold what this attempt wrote, removes the lock file if this
    attempt created it (while still holding the lock), and then the directories it created
    if they are empty. Nothing is read in full, however long the run.
    """

    APPEND_ONLY = ("metrics", "spans", "alerts")
    SMALL = ("meta", "summary", "run", "metric_defs")

    def __init__(self, run_dir: Path, stream: str | None, file_rank: int) -> None:
        self.run_dir = run_dir
        self.stream = stream
        self.file_rank = file_rank
        self.created_dirs: list[Path] = []
        self.lock_fd: int | None = None  # handed to the writer, which releases it
        self._guard_fd: int | None = None  # keeps the lock held until the undo is complete
        self.lock_created = False
        self.lock_handed = False  # the history writer owns lock_fd (and closes it)
        self.lock_path: Path | None = None
        self.sizes: dict[Path, int | None] = {}
        self.contents: dict[Path, bytes | None] = {}
        self.written: dict[Path, tuple[bytes | None, bytes]] = {}  # shared files: before, ours
        self.closers: list[Any] = []
        self.notice: str | None = None  # the resume line, printed once the build succeeded

    def lock(self, metrics_path: Path, warner: Warner) -> None:
        """Create the run directory and take the lock of this producer.

        Raises:
            RunLockedError: another live process holds it (nothing was changed).
        """
        from expr_tracker.history.recovery import acquire_lock, lock_path_of, track_lock_fd

        for _ in range(20):
            try:
                self._make_dirs()
            except OSError as exc:
                warner.warn(
                    ("mkdir",),
                    "expr_tracker: cannot create %s (%s); training continues, records stay "
                    "in memory",
                    self.run_dir,
                    exc,
                )
                return
            try:
                fd, created = acquire_lock(metrics_path)
            except FileNotFoundError:
                continue  # an undone attempt removed the directory meanwhile: make it again
            except OSError as exc:
                warner.warn(
                    ("lock",),
                    "expr_tracker: cannot create the lock file for %s (%s); training "
                    "continues without the one-writer lock",
                    metrics_path,
                    exc,
                )
                return
            self.lock_fd, self.lock_created = fd, created
            self.lock_path = lock_path_of(metrics_path)
            self._guard_fd = os.dup(fd) if fd is not None else None
            track_lock_fd(self._guard_fd)
            return
        warner.warn(
            ("lock",),
            "expr_tracker: %s keeps disappearing while the lock is taken; training continues "
            "without the one-writer lock",
            self.run_dir,
        )

    def _make_dirs(self) -> None:
        missing = []
        d = self.run_dir
        while not d.exists() and d.parent != d:
            missing.append(d)
            d = d.parent
        for d in reversed(missing):
            try:
                d.mkdir()
            except FileExistsError:
                continue  # another process made it: not ours to remove
            self.created_dirs.append(d)

    def snapshot(self) -> None:
        """Sizes and contents of this producer's files, taken under the lock."""
        for kind in self.APPEND_ONLY:
            path = self.run_dir / file_name(kind, self.stream, self.file_rank)
            try:
                self.sizes[path] = path.stat().st_size if path.is_file() else None
            except OSError:
                self.sizes[path] = None
        for kind in self.SMALL:
            path = self.run_dir / file_name(kind, self.stream, self.file_rank)
            self.contents[path] = _read_or_none(path)

    def write_shared(self, path: Path, data: Any, warner: Warner) -> None:
        """Write a run-level file (``config[.S].json``, ``spec.json``), remembering what it
        held and what we wrote, so an undo restores it only if it is still ours."""
        before = _read_or_none(path)
        ours = dumps_pretty(data).encode("utf-8")
        try:
            atomic_write(path, ours)
        except OSError as exc:
            warner.warn(("write", path.name), "expr_tracker: cannot write %s (%s)", path, exc)
            return
        self.written[path] = (before, ours)

    def done(self) -> None:
        """The build succeeded: the writer alone holds the lock from now on."""
        self._close_guard()

    def _close_guard(self) -> None:
        if self._guard_fd is not None:
            release_lock_fd(self._guard_fd)
            self._guard_fd = None

    def undo(self) -> None:
        for close in reversed(self.closers):
            try:
                close()
            except Exception:  # noqa: BLE001 - undo as much as possible
                pass
        if self.lock_fd is not None and not self.lock_handed:
            release_lock_fd(self.lock_fd)  # the writer never took the lock over
        for path, size in self.sizes.items():
            try:
                if size is None:
                    path.unlink(missing_ok=True)
                elif path.is_file() and path.stat().st_size > size:
                    os.truncate(path, size)
            except OSError:
                pass
        for path, before in self.contents.items():
            _restore(path, before)
        for path, (before, ours) in self.written.items():
            if _read_or_none(path) == ours:  # nobody else wrote it since
                _restore(path, before)
        if self.lock_created and self.lock_path is not None:
            try:  # still held through the guard: no other process can have it
                self.lock_path.unlink(missing_ok=True)
            except OSError:
                pass
        self._close_guard()
        for d in reversed(self.created_dirs):
            try:
                d.rmdir()  # only when empty: another producer's files stay
            except OSError:
                pass


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError:
        return None


def _restore(path: Path, before: bytes | None) -> None:
    try:
        if before is None:
            path.unlink(missing_ok=True)
        elif path.is_file() and path.read_bytes() != before:
            atomic_write(path, before)
    except OSError:
        pass


def announce(line: str) -> None:
    """Print the one resume line on stderr (never breaks the run)."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must not stop training
        pass


def construct_run(
    resolved: Any,
    spec: Any,
    env: Any,
    warner: Warner,
    stream: str | None,
    rank: int,
    file_rank: int,
    run_dir: Path,
    attempt: Attempt,
    choice: Any,
) -> Run:
    """The run in ``run_dir`` (``choice``: :func:`expr_tracker.assemble.identity.choose`'s, whose
    attempt holds this producer's lock)."""
    from expr_tracker.assemble.identity import notice

    # the directory exists and this producer's lock is held (Attempt.lock): reading the
    # previous attempt now sees a file no live process is writing
    h = spec.history
    metrics_path = run_dir / file_name("metrics", stream, file_rank)
    info_path = run_dir / file_name("run", stream, file_rank)
    previous = read_run_info(info_path, repair=False) if info_path.exists() else None

    writer = JsonlWriter(
        metrics_path,
        buffer_size=h.buffer.size,
        interval=h.buffer.interval,
        max_seconds=h.buffer.max_seconds,
        max_pending_records=h.buffer.max_pending_records,
        meta_path=run_dir / file_name("meta", stream, file_rank),
        run_meta={"project": spec.project, "name": spec.name, "stream": stream, "rank": rank},
        lock=False,  # taken by the attempt before anything was read; handed over here
        lock_fd=attempt.lock_fd,
        warner=warner,
    )
    attempt.lock_handed = True
    attempt.closers.append(writer.close)
    # we hold the one-writer lock now: a previous attempt that still says "running" is dead
    if previous is not None and previous.get("status") == "running":
        previous["status"] = dead_status(previous)  # crashed, or preempted when marked
    resumed = writer.prefix_lines > 0
    start_step = writer.max_step + 1 if writer.max_step is not None else 0
    store = HistoryStore(
        writer,
        step_policy=h.step_policy,
        max_open_seconds=h.max_open_seconds,
        cache_bytes=h.cache.bytes,
        cache_rows=h.cache.rows,
        start_step=start_step,
        warner=warner,
        aggregation=SPAN_AGGREGATION,
    )

    started_mono = time.monotonic()  # the same moment as run.json's started_at
    info = new_run_info(
        project=spec.project,
        name=spec.name,
        stream=stream,
        rank=rank,
        run_dir=run_dir,
        argv=scrub_argv(sys.argv),  # a Hydra override may carry a webhook URL
    )
    writer.run_meta["started_at"] = info["started_at"]  # the sidecar's run identity (A.2)
    info["group"] = spec.group
    info["tags"] = list(spec.tags)
    info["notes"] = spec.notes
    info["entity"] = spec.entity
    info["job_type"] = spec.job_type
    if file_rank == 0:  # what the next start compares its config with (identity.choose)
        info["init_config"] = choice.recorded
    if choice.launch is not None:  # the other ranks of the launch find this run by it
        info["launch"] = choice.launch
    if choice.requested is not None:
        info["requested_name"] = choice.requested
    if choice.changes:  # resume='must' (or a fixed folder) with another config
        info["config_changes"] = choice.changes
    resumed_line = None
    if resumed or previous is not None:
        attempts = list((previous or {}).get("previous_attempts", []))
        if previous is not None:  # with its duration (a killed one's up to its last row)
            attempts.append(previous_attempt(previous, metrics_path))
        info["previous_attempts"] = attempts
        info["resumed_at_step"] = start_step
        resumed_line = _resume_line(spec, stream, rank, start_step, previous)
    open_life(info)  # first_started_at: the whole life (docs/streams.md "Run identity")
    attempt.notice = notice(choice, resumed_line)
    try:
        write_run_info(info_path, info)
    except OSError as exc:
        warner.warn(("run.json",), "expr_tracker: cannot write %s (%s)", info_path, exc)

    config = choice.init_config
    config_path = None
    # run-level files: rank 0 only (the other ranks keep their run/summary/shard files and
    # never overwrite rank 0's). config[.S].json by rank 0 of each stream; spec.json by rank 0
    # of the main stream, or by rank 0 of another stream while the run has none yet
    # credentials hidden on disk (a Hydra app's whole cfg may carry the tracker's webhook
    # URL); hyper-parameters kept as they are (redact_config)
    from expr_tracker.spec.errors import redact_config

    if file_rank == 0:
        config_path = run_dir / file_name("config", stream)
        if resumed or previous is not None:
            # a resumed run keeps what earlier attempts added (et.config.update); the
            # values given now win (a change from the earlier attempt's init config is in
            # run.json: config_changes)
            config = {**_read_json(config_path), **config}
        on_disk = choice.recorded if config is choice.init_config else redact_config(config)
        attempt.write_shared(config_path, on_disk, warner)
        spec_path = run_dir / "spec.json"
        if not stream or not spec_path.exists():
            try:
                redacted = resolved.redacted()
            except Exception as exc:  # noqa: BLE001 - a spec that cannot be rendered never stops a run
                warner.warn(("spec.json",), "expr_tracker: cannot write spec.json (%s)", exc)
            else:
                attempt.write_shared(spec_path, redacted, warner)
    # later changes (et.config.update) rewrite the same file, atomically
    run_config = RunConfig(config, path=config_path, redact=redact_config, warn=warner.warn)

    summary_path = run_dir / file_name("summary", stream, file_rank)
    defs_path = run_dir / file_name("metric_defs", stream, file_rank)
    defs = MetricDefs()
    initial = None
    if resumed:
        initial = _resumed_summary(summary_path, defs_path, defs, writer)
    # the summary shares the store's lock: each committed row reaches it under that lock,
    # in commit order, before the sinks (docs/logging.md "What one log() costs")
    summary = Summary(summary_path, initial, defs_path=defs_path, defs=defs, lock=store.lock)
    summary.attach(store)

    return Run._assemble(
        spec=spec,
        resolved=resolved,
        run_dir=run_dir,
        stream=stream,
        rank=rank,
        store=store,
        summary=summary,
        config=run_config,
        info=info,
        info_path=info_path,
        warner=warner,
        started_mono=started_mono,
    )


def _resume_line(
    spec: Any,
    stream: str | None,
    rank: int,
    start_step: int,
    previous: dict[str, Any] | None,
) -> str:
    """What the one stderr line says of a run being continued, not started."""
    who = "".join([f" stream {stream}" if stream else "", f" rank {rank}" if rank else ""]).strip()
    status = (previous or {}).get("status") or "unknown (no run.json)"
    return (
        f"run {spec.project}/{spec.name}{f' ({who})' if who else ''} at step {start_step}; "
        f"previous attempt: {status}"
    )


def _resumed_summary(
    summary_path: Path, defs_path: Path, defs: MetricDefs, writer: JsonlWriter
) -> dict[str, Any]:
    """The summary of a resumed run: ``summary.json`` as last saved, caught up with the rows
    the file holds after the step it had seen (a crash leaves it up to one save interval
    behind); rebuilt from the whole file when it is missing or unreadable. ``defs`` takes
    the saved ``define_metric`` definitions and aggregation state, caught up the same way
    from the step they had seen."""
    from expr_tracker.history.reader import JsonlReader

    saved = _read_json(summary_path)
    defs.load(_read_json(defs_path))
    seen = saved.get("_step")
    start = seen + 1 if type(seen) is int else None
    defs_start = defs.step + 1 if defs.step is not None else None
    if defs.aggregating and (start is None or (defs_start is not None and defs_start < start)):
        start = defs_start
    try:
        rows = JsonlReader(writer.path, meta=writer.meta()).read_range(start, None)
    except OSError:
        rows = []
    for row in rows:
        step = row.get("_step")
        if type(seen) is not int or (type(step) is int and step > seen):
            saved.update(row)
        if defs.aggregating and (defs.step is None or (type(step) is int and step > defs.step)):
            defs.update(row)
    return saved


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
