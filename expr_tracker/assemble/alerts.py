"""The alert side of a run: the engine (rules compiled by ``check.make_engine``), the
alert log, the watchdog and the row sink, hooked into the run; its delivery (channels,
policies, dispatcher) comes from :mod:`.delivery` (``attach_delivery``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from expr_tracker._warn import Warner
from expr_tracker.history.paths import file_name
from expr_tracker.runs import Run

log = logging.getLogger("expr_tracker")


def build_alerts(
    run: Run,
    spec: Any,
    run_dir: Path,
    stream: str | None,
    file_rank: int,
    rank: int,
    warner: Warner,
    engine: Any,
    world_size: int = 1,
) -> None:
    """Hook the alert engine (rules compiled by :func:`make_engine`) into the run: its
    record file, delivery, the watchdog and the row sink.

    Rules on a rank that does not alert (``alerts.on_rank``) stay registered, listed and
    evaluated, and recorded in that rank's ``alerts.rankN.jsonl``; they just do not deliver.

    On rank 0 of a multi-rank run (``world_size`` > 1, rank-aware files) the engine reads
    the other ranks' metrics files for ``skew(m)`` (docs/streams.md "Straggler ranks").
    """
    if engine is None:
        return
    from expr_tracker.history.alertlog import AlertLog

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
    engine.on_action = run.take_action  # => stop / => prune (docs/alerts.md "Actions")
    open_baselines(engine, spec, run_dir)
    engine.notify = _delivery(run, a, alerts_path, record, engine.deliver)
    run.add_closer("alert_log", record.close, late=True)  # after delivery records outcomes
    engine.start_watchdog(a.watchdog_interval)
    run.alerts = engine
    if rank == 0 and world_size > 1 and spec.history.rank_aware:
        from expr_tracker.history.peers import PeerFiles, RankSkew

        peers = RankSkew(PeerFiles(run_dir, stream, world_size, warner=warner))
        engine.peers = peers
        run.add_closer("peers", peers.close, late=True)
    if engine.rules:
        run.history.sinks.append(engine.on_step)
    run.add_stats("alerts", engine.stats)


def open_baselines(engine: Any, spec: Any, run_dir: Path) -> None:
    """Read the peer runs of the engine's ``baseline()`` calls, once (docs/alerts.md
    "Comparing with other runs"): under the runs root (``dir``; with ``run_dir=`` given, the
    folder two levels above it), this run excluded. A root that cannot be read leaves the
    tables empty (``baseline()`` UNKNOWN), with one warning."""
    baselines = getattr(engine, "baselines", None)
    if baselines is None:
        return
    root = Path(spec.dir).expanduser() if not spec.run_dir else run_dir.parent.parent
    try:
        baselines.open(root, spec.project, run_dir)
    except Exception as exc:  # noqa: BLE001 - a peer that cannot be read never stops the start
        log.warning("expr_tracker: baseline(): the runs under %s could not be read: %s", root, exc)


def _delivery(run: Run, alerts: Any, alerts_path: Path, record: Any, deliver: bool) -> Any:
    """The callable rule events go to: the run's dispatcher (channels with their policies;
    with no channel configured, the console and ``alerts.jsonl``). None on a rank that does
    not alert."""
    if not deliver:
        return None
    from expr_tracker.assemble.delivery import attach_delivery  # only with rules: cold start

    dispatcher = attach_delivery(run, alerts, record)
    return dispatcher.notify
