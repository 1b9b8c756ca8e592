"""``build(resolved) -> Run``: the only place runtime objects are constructed from a spec.

Reads the validated :class:`~expr_tracker.spec.models.RunSpec` once and hands plain values
to the runtime (the hot path never touches Pydantic): the run directory and file names,
the one-writer lock, resume, the history store and its writer, ``run.json``,
``config.json``, ``spec.json``, the summary, the span recorder and the alert engine.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from expr_tracker.errors import ExprTrackerError
from expr_tracker.history.codec import Warner, dumps_pretty, normalize_value
from expr_tracker.history.paths import atomic_write, detect_rank, file_name
from expr_tracker.history.recovery import release_lock_fd
from expr_tracker.history.runinfo import new_run_info, read_run_info, write_run_info
from expr_tracker.history.store import HistoryStore
from expr_tracker.history.writer import JsonlWriter
from expr_tracker.run import Run, Summary
from expr_tracker.spans.core import AGGREGATION as SPAN_AGGREGATION

log = logging.getLogger("expr_tracker")


class ResumeError(ExprTrackerError, FileExistsError):
    """``resume="never"`` found an existing run, or ``resume="must"`` found none."""


def run_directory(spec: Any) -> Path:
    """``run_dir`` when given, else ``<dir>/<project>/<name>``."""
    if spec.run_dir:
        return Path(spec.run_dir).expanduser()
    return Path(spec.dir).expanduser() / spec.project / spec.name


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


def build(resolved: Any, *, environ: dict[str, str] | None = None) -> Run:
    """Construct a :class:`Run` from a resolved spec (``expr_tracker.spec.resolve``).

    Everything that can fail on configuration (rules, plugin types, channels) is checked
    before anything touches the disk; if construction still fails afterwards, what this
    attempt created is removed and the one-writer lock released, so fixing the spec and
    calling ``et.init`` again in the same process works.

    Raises:
        SpecError: everything :func:`check` finds (plugins, rules, channels), each problem
            with its spec path.
        ResumeError: ``resume`` forbids what is on disk.
        RunLockedError: another live process writes the same stream and rank.
    """
    spec = resolved.spec
    env = os.environ if environ is None else environ
    warner = Warner()
    stream = spec.stream
    rank = detect_rank(env)
    file_rank = rank if spec.history.rank_aware else 0
    run_dir = run_directory(spec)
    metrics_path = run_dir / file_name("metrics", stream, file_rank)
    info_path = run_dir / file_name("run", stream, file_rank)

    # 1. configuration checks: nothing on disk yet; the same function as `et config validate`
    engine = check(resolved, env, stream=stream, rank=rank)

    # 2. the one-writer lock comes before anything of the run directory is read, snapshotted
    # or undone: a refused process (RunLockedError) has touched nothing of the holder's
    attempt = _Attempt(run_dir, stream, file_rank)
    attempt.lock(metrics_path, warner)
    try:
        exists = metrics_path.exists() or info_path.exists()
        if spec.resume == "never" and exists:
            raise ResumeError(
                f"resume='never' but {run_dir} already holds this run ({metrics_path.name}); "
                "pick another name, or use resume='allow' to continue it"
            )
        if spec.resume == "must" and not exists:
            raise ResumeError(
                f"resume='must' but there is no run to continue at {run_dir} "
                f"(no {metrics_path.name}); check project/name/dir or use resume='allow'"
            )
        attempt.snapshot()

        # 3. construction; undone if anything fails
        run = _construct(resolved, spec, env, warner, stream, rank, file_rank, run_dir, attempt)
        attempt.closers.append(lambda: _undo_runtime(run, engine))
        _build_spans(run, spec, run_dir, stream, file_rank, rank, warner)
        _build_alerts(run, spec, run_dir, stream, file_rank, rank, warner, engine)
    except BaseException as exc:
        attempt.undo()
        from expr_tracker.alerts.delivery.channels import ChannelConfigError

        if isinstance(exc, ChannelConfigError):  # the environment changed since check()
            from expr_tracker.spec import SpecError

            raise SpecError([_channel_issue(resolved, exc)]) from None
        raise
    attempt.done()
    if attempt.notice:
        _announce(attempt.notice)
    if spec.backends:
        unknown = [b for b in spec.backends if b != "jsonl"]
        if unknown:
            warner.warn(
                ("backends",),
                "expr_tracker: backends %r are not available yet (the JSONL history is always "
                "written); ignored",
                unknown,
            )
    return run


def _undo_runtime(run: Run, engine: Any) -> None:
    """Stop what a failed build started (span recorder, watchdog, delivery threads)."""
    if run.spans is not None:
        run.spans.close()
    if engine is not None:
        engine.close()
    dispatcher = run.dispatcher
    if dispatcher is not None:
        dispatcher.close(timeout=0.5)


def check(
    resolved: Any,
    environ: Any = None,
    *,
    stream: str | None = None,
    rank: int = 0,
    channels: bool = True,
) -> Any:
    """Everything a spec can get wrong beyond its schema, checked with no side effect: span
    plugins (types and options: each built-in plugin is constructed), alert rules (compiled)
    and channels (types, options and URLs of every channel; the ones that are on built with
    ``environ``, not started). ``et.init`` (through :func:`build`), ``et.configure_alert``
    and ``et config validate`` all call this, so they accept and reject the same specs.

    Returns the alert engine with the rules compiled (None when alerts are disabled), for
    :func:`build` to use. ``channels=False`` skips the channels.

    Raises:
        SpecError: every problem found, each with its spec path
            (``spans.plugins[0].options.interval``, ``alerts.rules.r.condition``,
            ``alerts.channels.ops.options.port``), its source and ``file:line:column``.
    """
    from expr_tracker.spec import SpecError

    spec = resolved.spec
    env = os.environ if environ is None else environ
    issues = _plugin_issues(resolved)
    engine = None
    try:
        engine = _make_engine(resolved, stream, rank)
    except SpecError as exc:
        issues.extend(exc.issues)
    if channels and spec.alerts.enabled and spec.alerts.channels:
        issues.extend(_channel_issues(resolved, env))
    if issues:
        if engine is not None:
            engine.close()
        raise SpecError(issues)
    return engine


def _location(resolved: Any, path: str) -> Any:
    """``(file, line, column)`` of ``path``, else of its nearest enclosing value, else None."""
    locations = getattr(resolved, "locations", None) or {}
    while path:
        if path in locations:
            return locations[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return None


def _issue(resolved: Any, path: str, message: str, **extra: Any) -> Any:
    from expr_tracker.spec import SpecIssue

    source = resolved.source_of(path) if hasattr(resolved, "source_of") else None
    return SpecIssue(
        path=path,
        message=message,
        source=source,
        location=_location(resolved, path),
        **extra,
    )


def _plugin_issues(resolved: Any) -> list[Any]:
    """Span plugins: unknown types (with close matches), unknown options and options of the
    wrong type, each a SpecIssue at ``spans.plugins[i].<field>`` (nothing built is kept)."""
    entries = list(resolved.spec.spans.plugins or ())
    if not any(getattr(e, "type", None) is not None for e in entries):
        return []
    from expr_tracker.spans.recorder import plugin_problems

    issues = []
    for p in plugin_problems(entries):
        path = f"spans.plugins[{p['index']}].{p['field']}"
        extra = {"suggestion": p.get("suggestion")}
        if "value" in p:
            extra["value"] = p["value"]
        issues.append(_issue(resolved, path, p["message"], **extra))
    return issues


def _channel_path(name: Any, field: str | None) -> str:
    from expr_tracker.spec.errors import join_path

    path = join_path("alerts.channels", name)
    for part in (field or "").split(".") if field else ():
        path = join_path(path, part)
    return path


def _channel_issue(resolved: Any, exc: Any) -> Any:
    """A SpecIssue for a ``ChannelConfigError`` (its text never holds a secret)."""
    name = getattr(exc, "channel", None)
    if name is None:
        return _issue(resolved, "alerts.channels", str(exc))
    return _issue(resolved, _channel_path(name, exc.field), exc.problem or str(exc))


def _channel_issues(resolved: Any, env: Any) -> list[Any]:
    """Every channel's problems (``alerts.channels.channel_problems``) as SpecIssues."""
    from expr_tracker.alerts.delivery.channels import channel_problems

    issues = []
    for channel in resolved.spec.alerts.channels:
        issues.extend(_channel_issue(resolved, exc) for exc in channel_problems(channel, env))
    return issues


class _Attempt:
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
    SMALL = ("meta", "summary", "run")

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


def _announce(line: str) -> None:
    """Print the one resume line on stderr (never breaks the run)."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must not stop training
        pass


def _construct(
    resolved: Any,
    spec: Any,
    env: Any,
    warner: Warner,
    stream: str | None,
    rank: int,
    file_rank: int,
    run_dir: Path,
    attempt: _Attempt,
) -> Run:
    # the directory exists and this producer's lock is held (_Attempt.lock): reading the
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
        previous["status"] = "crashed"
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
        project=spec.project, name=spec.name, stream=stream, rank=rank, run_dir=run_dir
    )
    writer.run_meta["started_at"] = info["started_at"]  # the sidecar's run identity (A.2)
    info["group"] = spec.group
    info["tags"] = list(spec.tags)
    info["notes"] = spec.notes
    if resumed or previous is not None:
        attempts = list((previous or {}).get("previous_attempts", []))
        if previous is not None:
            prev = {k: previous.get(k) for k in ("status", "started_at", "ended_at", "pid", "host")}
            if "exception" in previous:
                prev["exception"] = {"type": previous["exception"].get("type")}
            attempts.append(prev)
        info["previous_attempts"] = attempts
        info["resumed_at_step"] = start_step
        attempt.notice = _resume_line(spec, run_dir, stream, rank, start_step, previous)
    try:
        write_run_info(info_path, info)
    except OSError as exc:
        warner.warn(("run.json",), "expr_tracker: cannot write %s (%s)", info_path, exc)

    config = normalize_config(spec.config, warner)
    # run-level files: rank 0 only (the other ranks keep their run/summary/shard files and
    # never overwrite rank 0's). config[.S].json by rank 0 of each stream; spec.json by rank 0
    # of the main stream, or by rank 0 of another stream while the run has none yet
    # credentials hidden on disk (a Hydra app's whole cfg may carry the tracker's webhook
    # URL); hyper-parameters kept as they are (redact_config)
    if file_rank == 0:
        from expr_tracker.spec.errors import redact_config

        attempt.write_shared(run_dir / file_name("config", stream), redact_config(config), warner)
        spec_path = run_dir / "spec.json"
        if not stream or not spec_path.exists():
            try:
                redacted = resolved.redacted()
            except Exception as exc:  # noqa: BLE001 - a spec that cannot be rendered never stops a run
                warner.warn(("spec.json",), "expr_tracker: cannot write spec.json (%s)", exc)
            else:
                attempt.write_shared(spec_path, redacted, warner)

    summary_path = run_dir / file_name("summary", stream, file_rank)
    summary = Summary(summary_path, _resumed_summary(summary_path, writer) if resumed else None)
    store.sinks.append(summary.on_row)

    return Run(
        spec=spec,
        resolved=resolved,
        run_dir=run_dir,
        stream=stream,
        rank=rank,
        store=store,
        summary=summary,
        config=config,
        info=info,
        info_path=info_path,
        warner=warner,
        started_mono=started_mono,
    )


def _resume_line(
    spec: Any,
    run_dir: Path,
    stream: str | None,
    rank: int,
    start_step: int,
    previous: dict[str, Any] | None,
) -> str:
    """The one stderr line that says a run is being continued, not started."""
    who = "".join([f" stream {stream}" if stream else "", f" rank {rank}" if rank else ""]).strip()
    status = (previous or {}).get("status") or "unknown (no run.json)"
    return (
        f"expr_tracker: resuming run {spec.project}/{spec.name}"
        f"{f' ({who})' if who else ''} at step {start_step}; previous attempt: {status}; "
        f"in {run_dir} (resume='allow': give another name, or resume='never', to start anew)"
    )


def _resumed_summary(summary_path: Path, writer: JsonlWriter) -> dict[str, Any]:
    """The summary of a resumed run: ``summary.json`` as last saved, caught up with the rows
    the file holds after the step it had seen (a crash leaves it up to one save interval
    behind); rebuilt from the whole file when it is missing or unreadable."""
    from expr_tracker.history.reader import JsonlReader

    try:
        saved = json.loads(summary_path.read_text("utf-8"))
        if not isinstance(saved, dict):
            saved = {}
    except (OSError, ValueError):
        saved = {}
    seen = saved.get("_step")
    start = seen + 1 if type(seen) is int else None
    try:
        rows = JsonlReader(writer.path, meta=writer.meta()).read_range(start, None)
    except OSError:
        rows = []
    for row in rows:
        saved.update(row)
    return saved


def _build_spans(
    run: Run,
    spec: Any,
    run_dir: Path,
    stream: str | None,
    file_rank: int,
    rank: int,
    warner: Warner,
) -> None:
    """The span recorder and its writer (spans.jsonl), made the active recorder."""
    from expr_tracker.spans.recorder import build_recorder

    run.spans = build_recorder(
        run=run,
        spec=spec.spans,
        run_dir=run_dir,
        stream=stream,
        file_rank=file_rank,
        rank=rank,
        warner=warner,
    )
    if run.spans is not None:
        run.history.flush_hooks.append(run.spans.flush)


def _make_engine(resolved: Any, stream: str | None, rank: int) -> Any:
    """The alert engine with every rule compiled; no thread, no file.

    Raises:
        SpecError: listing every rule that does not compile, each with its path
            (``alerts.rules.<name>.condition``), its source and file:line:column.
    """
    spec = resolved.spec
    a = spec.alerts
    if not a.enabled:
        return None
    from expr_tracker.alerts.delivery import rank_alerts
    from expr_tracker.alerts.engine import AlertEngine
    from expr_tracker.alerts.parse import RuleError

    engine = AlertEngine(
        (),
        window=spec.history.alert_window,
        run_info={"project": spec.project, "run": spec.name, "stream": stream, "rank": rank},
        deliver=rank_alerts(a.on_rank, rank),
    )
    issues = []
    for i, rule in enumerate(a.rules):
        try:
            engine.add_rule(rule)
        except RuleError as exc:
            issues.append(_rule_issue(resolved, i, rule, exc))
    if issues:
        from expr_tracker.spec import SpecError

        raise SpecError(issues)
    return engine


def _rule_issue(resolved: Any, index: int, rule: Any, exc: Exception) -> Any:
    """A SpecIssue for a rule that does not compile: where it is, where it came from."""
    from expr_tracker.spec import SpecIssue
    from expr_tracker.spec.errors import join_path

    # the spec names entries of `alerts.rules` by name; a one-line string rule is its own name
    name = rule if isinstance(rule, str) else getattr(rule, "name", None)
    base = join_path("alerts.rules", name) if name else f"alerts.rules[{index}]"
    field = getattr(exc, "field", None) or "condition"
    if field == "expr":
        field = "condition"
    path = base if isinstance(rule, str) else join_path(base, field)
    text = rule if isinstance(rule, str) else getattr(rule, field, None)
    locations = getattr(resolved, "locations", {}) or {}
    return SpecIssue(
        path=path,
        message=str(exc).replace("\n", "\n    "),
        value=text,
        source=resolved.source_of(path) if hasattr(resolved, "source_of") else None,
        location=locations.get(path) or locations.get(base),
    )


def _build_alerts(
    run: Run,
    spec: Any,
    run_dir: Path,
    stream: str | None,
    file_rank: int,
    rank: int,
    warner: Warner,
    engine: Any,
) -> None:
    """Hook the alert engine (rules compiled by :func:`_make_engine`) into the run: its
    record file, delivery, the watchdog and the row sink.

    Rules on a rank that does not alert (``alerts.on_rank``) stay registered, listed and
    evaluated, and recorded in that rank's ``alerts.rankN.jsonl``; they just do not deliver.
    """
    if engine is None:
        return
    from expr_tracker.alerts.delivery.record import AlertLog

    a = spec.alerts
    alerts_path = run_dir / file_name("alerts", stream, file_rank)
    record = AlertLog(alerts_path)

    def close() -> None:
        engine.close()
        for message in engine.finish_warnings():
            log.warning("expr_tracker: %s", message)

    # closers run in order: stop the engine (and its watchdog) before delivery drains, so
    # nothing is submitted to a closed dispatcher; the record file closes last
    run.add_closer("alerts", close)
    engine.record = record
    engine.notify = _delivery(run, a, alerts_path, record, engine.deliver)
    run.add_closer("alert_log", record.close, late=True)  # after delivery records outcomes
    engine.start_watchdog(a.watchdog_interval)
    run.alerts = engine
    if engine.rules:
        run.history.sinks.append(engine.on_step)
    run.add_stats("alerts", engine.stats)


def _delivery(run: Run, alerts: Any, alerts_path: Path, record: Any, deliver: bool) -> Any:
    """The callable rule events go to: the run's dispatcher (channels with their policies;
    with no channel configured, the console and ``alerts.jsonl``). None on a rank that does
    not alert."""
    if not deliver:
        return None
    from expr_tracker.alerts.delivery import attach_delivery

    dispatcher = attach_delivery(run, alerts, record)
    return dispatcher.notify
