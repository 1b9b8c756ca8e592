"""Runs side by side: what differs in their config and identity, and their summaries.

:func:`compare_runs` reads only small per-run files (``config[.S].json``,
``summary[.S][.rankN].json``, ``metric_defs[.S][.rankN].json``, every ``run*.json`` and the
tail of the compared metrics file); it needs neither DuckDB nor pyarrow and never writes.
``et compare`` (``expr_tracker/cli/compare.py``) prints its result.

A RUN is a run directory's path (or one of its files), or ``project/name`` or ``name`` of a
run under ``root``, by the one rule of ``catalog.resolve_run`` (docs/cli.md "Naming a
run"). Each run is
compared through one producer: the main stream's rank 0 unless ``stream``/``rank`` say
otherwise (a run holding only rank shards: its lowest rank).
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expr_tracker.errors import ExprTrackerError
from expr_tracker.history import untrusted
from expr_tracker.history.metricdefs import MetricDefs
from expr_tracker.history.paths import file_name, validate_stream
from expr_tracker.history.rundirs import producer_infos, producer_status, worst_status
from expr_tracker.history.runinfo import run_life
from expr_tracker.history.values import flatten
from expr_tracker.query.catalog import (
    Producer,
    RunEntry,
    RunNotFoundError,
    discover,
    resolve_run,
    run_entries,
)

__all__ = [
    "CompareError",
    "IDENTITY_KEYS",
    "compare_groups",
    "compare_runs",
    "goal_from_name",
    "run_config_view",
]

#: the identity rows, in the order shown
IDENTITY_KEYS = (
    "status",
    "steps",
    "first_started_at",
    "wall_duration_s",
    "active_duration_s",
    "tags",
    "group",
    "git.commit",
    "git.dirty",
)
#: summary keys left out by default (span timings and counts); ``metrics=`` can pick them
SPAN_PREFIXES = ("time_ms/", "count/")
#: words of a metric's last name part that say lower is better / higher is better
MIN_WORDS = ("loss", "err", "error", "ppl", "perplexity", "mse", "mae", "rmse", "wer", "cer")
MAX_WORDS = ("acc", "accuracy", "f1", "auc", "score", "reward", "bleu", "precision", "recall")


class CompareError(ExprTrackerError, ValueError):
    """Runs that cannot be compared: a RUN that names no run or several, a run given twice,
    fewer than two runs, a stream or rank a run lacks, ``metrics=`` that match nothing."""


@dataclass(frozen=True)
class _Run:
    """A run to compare: the RUN ``given`` and the run it names."""

    given: str
    entry: RunEntry

    @property
    def path(self) -> Path:
        return self.entry.path

    @property
    def project(self) -> str | None:
        return self.entry.project

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def run_id(self) -> str:  # as the ``run`` column of ``et query`` names it
        return self.entry.run_id

    @property
    def rel(self) -> str | None:  # path relative to root, posix, when under root
        return self.entry.rel

    @property
    def producers(self) -> tuple[Producer, ...]:
        return self.entry.producers


def goal_from_name(name: str) -> str | None:
    """``"min"`` when the last part of a metric name says lower is better (loss, err, ppl,
    mse ...), ``"max"`` when it says higher is better (acc, f1, auc, score, reward ...),
    None when it says neither or both (``"val/acc_loss"``)."""
    leaf = name.rsplit("/", 1)[-1].lower()
    words = [w for w in re.split(r"[^a-z0-9]+", leaf) if w]
    lo = any(w.startswith(m) for w in words for m in MIN_WORDS)
    hi = any(w.startswith(m) for w in words for m in MAX_WORDS)
    if lo == hi:
        return None
    return "min" if lo else "max"


# ---------------------------------------------------------------------------- resolving


def _runs_of(producers: list[Producer], root: Path, given: str = "") -> list[_Run]:
    """Producers grouped by run directory (in discovery order)."""
    return [_Run(given, e) for e in run_entries(producers, root)]


def _index(root: Path) -> list[RunEntry] | None:
    try:
        return run_entries(discover(root), root)
    except FileNotFoundError:
        return None


def _resolve(given: str | os.PathLike[str], root: Path, index: list[RunEntry] | None) -> _Run:
    """The run RUN names (``catalog.resolve_run``: docs/cli.md "Naming a run"); a path must
    be a run directory or one of its files."""
    text = os.fspath(given)
    try:
        match = resolve_run(text, root, index)
    except RunNotFoundError as exc:
        raise CompareError(str(exc)) from None
    if match.entry is not None:
        return _Run(text, match.entry)
    p = match.path if match.path.is_dir() else match.path.parent
    found = [r for r in _runs_of(discover(p), root, text) if r.path == p]
    if not found:
        try:
            os.listdir(p)
        except OSError as exc:  # a colleague's 0700 folder: say so, not "not a run"
            from expr_tracker.history.rundirs import os_reason

            raise CompareError(
                f"run {text!r}: the folder cannot be listed: {os_reason(exc)}"
            ) from None
        raise CompareError(
            f"run {text!r} is a directory but not a run (no run*.json or metrics*.jsonl in it)"
        )
    return found[0]


# ---------------------------------------------------------------------------- reading


def _pick_producer(run: _Run, label: str, stream: str | None, rank: int | None) -> Producer:
    ranks = sorted(p.rank for p in run.producers if p.stream == stream)
    if not ranks:
        streams = {p.stream for p in run.producers}
        names = ", ".join(sorted("(main)" if x is None else x for x in streams)) or "none"
        raise CompareError(
            f"run {label!r} has no {'main stream' if stream is None else f'stream {stream!r}'}"
            f" (streams there: {names}); pick one with --stream"
        )
    if rank is not None and rank not in ranks:
        raise CompareError(
            f"run {label!r} has no rank {rank} in "
            f"{'the main stream' if stream is None else f'stream {stream!r}'} "
            f"(ranks there: {', '.join(map(str, ranks))})"
        )
    want = ranks[0] if rank is None else rank
    return next(p for p in run.producers if p.stream == stream and p.rank == want)


def _read_object(path: Path | None, warnings: list[str], label: str) -> dict[str, Any] | None:
    """The JSON object in ``path`` (NaN/Infinity accepted); None when there is no file, and
    None with a warning when it is unreadable or not an object (a torn write)."""
    if path is None:
        return None
    try:  # a regular file inside its run directory, JSON depth-limited (docs/query.md)
        value = untrusted.read_json(path, root=path.parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        warnings.append(f"{label}: {path.name} unreadable ({exc}); left out")
        return None
    except ValueError as exc:
        warnings.append(f"{label}: {path.name} is not valid JSON ({exc}); left out")
        return None
    if not isinstance(value, dict):
        warnings.append(f"{label}: {path.name} is not a JSON object; left out")
        return None
    return value


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _steps_and_last_time(metrics: Path) -> tuple[int | None, float | None]:
    """(highest step + 1, the last row's ``_time``) of a metrics file; (None, None) without
    one. Reads the sidecar and the file's tail only."""
    from expr_tracker.history.reader import JsonlReader

    if not metrics.is_file():
        return None, None
    reader = JsonlReader(metrics)
    try:
        rows = reader.tail(1)
    except OSError:
        rows = []
    meta_max = (reader.meta or {}).get("max_step") if reader.meta else None
    cands = [r.get("_step") for r in rows] + [meta_max]
    ints = [s for s in cands if type(s) is int]
    last_time = rows[-1].get("_time") if rows else None
    return (max(ints) + 1 if ints else None), (last_time if _num(last_time) else None)


def _identity_values(run_dir: Path, prod: Producer) -> dict[str, Any]:
    infos = producer_infos(run_dir)
    status = worst_status(producer_status(v) for v in infos.values())
    info = infos.get(prod.run_file.name) if prod.run_file is not None else None
    info = info or {}
    steps, last_time = (None, None)
    if prod.metrics is not None:
        steps, last_time = _steps_and_last_time(prod.metrics)
    if steps is None and type(info.get("steps")) is int:
        steps = info["steps"]
    # the run's whole life over every attempt and producer (durations to the millisecond,
    # as run.json's: finer differences are noise); a killed attempt up to its last row
    life = run_life(list(infos.values()), last_time=last_time)
    git = info.get("git") if isinstance(info.get("git"), dict) else {}
    return {
        "status": status,
        "steps": steps,
        **life,
        "tags": info.get("tags"),
        "group": info.get("group"),
        "git.commit": git.get("commit"),
        "git.dirty": git.get("dirty"),
    }


def _same(values: Sequence[Any], missing: Sequence[bool]) -> bool:
    """Every run has the key and all values are the same JSON value (``1`` and ``1.0``,
    ``true`` and ``1`` differ; NaN equals NaN)."""
    if any(missing):
        return all(missing)
    texts = {json.dumps(v, sort_keys=True, default=repr) for v in values}
    return len(texts) == 1


def _rows(tables: list[dict[tuple[str, ...], Any]], include_equal: bool) -> list[dict[str, Any]]:
    keys: dict[tuple[str, ...], None] = {}
    for t in tables:
        keys.update(dict.fromkeys(t))
    out = []
    for k in keys:
        missing = [k not in t for t in tables]
        values = [t.get(k) for t in tables]
        equal = _same(values, missing)
        if equal and not include_equal:
            continue
        out.append(
            {
                "key": ".".join(k),
                "path": list(k),
                "values": values,
                "missing": [i for i, m in enumerate(missing) if m],
                "equal": equal,
            }
        )
    return out


def _summary_keys(
    summaries: list[dict[tuple[str, ...], Any]], metrics: Sequence[str] | None
) -> list[tuple[str, ...]]:
    keys: dict[tuple[str, ...], None] = {}
    for s in summaries:
        keys.update(dict.fromkeys(k for k in s if not k[0].startswith("_")))
    if metrics is None:
        return [
            k
            for k in keys
            if not k[0].startswith(SPAN_PREFIXES) and any(_num(s.get(k, None)) for s in summaries)
        ]
    picked: dict[tuple[str, ...], None] = {}
    unmatched = []
    for pat in metrics:
        hits = [
            k
            for k in keys
            if fnmatch.fnmatchcase(".".join(k), pat) or fnmatch.fnmatchcase(k[0], pat)
        ]
        if not hits:
            unmatched.append(pat)
        picked.update(dict.fromkeys(hits))
    if unmatched:
        names = sorted({".".join(k) for k in keys} | {k[0] for k in keys})
        hints = []
        for pat in unmatched:
            close = difflib.get_close_matches(pat, names, n=5, cutoff=0.5)
            hints.append(f"{pat!r}" + (f" (close: {', '.join(close)})" if close else ""))
        raise CompareError(
            f"metrics: {', '.join(hints)} match no summary key of these runs; summary keys: "
            f"{', '.join(names[:30]) or 'none'}{' ...' if len(names) > 30 else ''}"
        )
    return list(picked)


def _goal(key: tuple[str, ...], defs: list[MetricDefs]) -> tuple[str | None, str | None]:
    goals = set()
    for d in defs:
        found = d.lookup(key[0])
        if found is not None and found.goal:
            goals.add("min" if found.goal == "minimize" else "max")
    if len(goals) == 1:
        return goals.pop(), "define_metric"
    if len(goals) > 1:
        return None, "define_metric (runs disagree)"
    g = goal_from_name(key[0])
    return g, ("name" if g else None)


def _best(values: list[Any], missing: list[int], goal: str | None) -> list[int]:
    if goal is None:
        return []
    cands = [
        (i, v)
        for i, v in enumerate(values)
        if i not in missing and _num(v) and not (isinstance(v, float) and math.isnan(v))
    ]
    if len(cands) < 2:
        return []
    target = min(v for _, v in cands) if goal == "min" else max(v for _, v in cands)
    best = [i for i, v in cands if v == target]
    return [] if len(best) == len(cands) else best  # all the same: none is better


# ---------------------------------------------------------------------------- public


def compare_runs(
    runs: Iterable[str | os.PathLike[str]],
    *,
    root: str | os.PathLike[str] = "runs",
    metrics: str | Sequence[str] | None = None,
    include_equal: bool = False,
    stream: str | None = None,
    rank: int | None = None,
) -> dict[str, Any]:
    """Compare two or more runs: config differences, identity differences, summaries.

    Args:
        runs: each a run directory's path, or ``project/name`` / ``name`` of a run under
            ``root``.
        root: where names are looked up (default ``./runs``).
        metrics: summary keys to show, names or globs (``"val/*"``), a list or ``"a,b"``;
            a pattern also matches a nested summary's top key (``"val/acc"`` picks ``val/acc.max``). Default: every
            numeric summary key but span timings (``time_ms/...``, ``count/...``).
        include_equal: also list config and identity keys whose values are equal.
        stream, rank: the producer compared in each run (default: the main stream, rank 0,
            or the lowest rank present).

    Returns:
        A dict of plain values (``json.dumps`` writes it; NaN/±inf stay floats)::

            {"root": str, "stream": str | None,
             "runs": [{"run": label, "path", "project", "name", "stream", "rank"}],
             "identity": [row], "config": [row],
             "summary": [{"metric", "path", "values", "missing", "goal": "min"|"max"|None,
                          "goal_from": "define_metric"|"name"|None, "best": [index]}],
             "warnings": [str]}

        A row is ``{"key": "model.depth", "path": ["model", "depth"], "values": [one per
        run], "missing": [indexes of runs without the key], "equal": bool}``; a missing
        key's value is None there (a null value is None and not missing). Identity keys:
        ``status`` (the worst of all the run's producers, as ``et runs``), ``steps``
        (highest step + 1 of the compared metrics file), the run's whole life over every
        attempt (a run resumed under its name has several): ``first_started_at`` (epoch
        seconds), ``wall_duration_s`` (first start to the latest end; to now while it runs)
        and ``active_duration_s`` (the attempts' durations summed; a killed attempt's up to
        its last row), ``tags``, ``group``, ``git.commit``, ``git.dirty``.
        ``best`` lists the runs holding the best value (ties: all; NaN never; none when
        fewer than two runs have a number, when all are equal or the direction is unknown). ``goal`` comes from
        a ``define_metric(goal=...)`` of the runs, else from the name (see
        :func:`goal_from_name`).

    Raises:
        CompareError: fewer than two runs, a run given twice, a RUN that names no run (with
            close matches) or several (listing them), a stream or rank a run lacks,
            ``metrics`` patterns that match no summary key.
    """
    if not isinstance(root, (str, os.PathLike)):
        raise CompareError(f"root={root!r} is not valid: give a folder's path (default 'runs')")
    root_p = Path(root)
    if isinstance(runs, (str, bytes, os.PathLike)):
        raise CompareError(
            f"runs={runs!r} is one value: give a list of two or more runs (run directories, "
            "project/name or name)"
        )
    given = []
    for r in runs:
        if not isinstance(r, (str, os.PathLike)):
            raise CompareError(
                f"runs: {r!r} is not a run: give run directories, project/name or name (strings)"
            )
        given.append(os.fspath(r))
    if len(given) < 2:
        raise CompareError(f"compare needs at least two runs, got {len(given)}: {given!r}")
    try:
        validate_stream(stream)
    except ValueError as exc:
        raise CompareError(f"stream {stream!r}: {exc}") from None
    if rank is not None and (type(rank) is not int or rank < 0):
        raise CompareError(f"rank={rank!r} is not valid: an integer >= 0")
    if metrics is not None:
        if isinstance(metrics, str):  # "loss,val/*", as on the command line
            metrics = metrics.split(",")
        for m in metrics:
            if not isinstance(m, str):
                raise CompareError(
                    f"metrics: {m!r} is not a name or glob: give strings such as 'loss', 'val/*'"
                )
        metrics = [m.strip() for m in metrics if m and m.strip()]
        if not metrics:
            raise CompareError("metrics: empty; give names or globs such as 'loss,val/*'")
    index = None if all(Path(g).is_dir() for g in given) else _index(root_p)
    resolved = [_resolve(g, root_p, index) for g in given]
    seen: dict[Path, str] = {}
    for r in resolved:
        key = r.path.resolve()
        if key in seen:
            raise CompareError(
                f"run {r.given!r} is the same run as {seen[key]!r} ({r.path}); give each run once"
            )
        seen[key] = r.given
    ids = [r.run_id for r in resolved]
    if len(set(ids)) < len(ids):  # copied trees: same identity, different folders
        ids = [r.rel or str(r.path) for r in resolved]
    if len(set(ids)) < len(ids):
        ids = [str(r.path) for r in resolved]
    warnings: list[str] = []
    runs_out, configs, idents, summaries, defs = [], [], [], [], []
    for r, label in zip(resolved, ids, strict=True):
        prod = _pick_producer(r, label, stream, rank)
        runs_out.append(
            {
                "run": label,
                "path": str(r.path),
                "project": r.project,
                "name": r.name,
                "stream": prod.stream,
                "rank": prod.rank,
            }
        )
        config = _read_object(prod.config, warnings, label)
        configs.append(flatten(config) if config else {})
        ident = _identity_values(r.path, prod)
        idents.append({(key,): v for key, v in ident.items()})
        summary = _read_object(prod.summary, warnings, label)
        summaries.append(flatten(summary) if summary else {})
        d = MetricDefs()
        defs_path = r.path / file_name("metric_defs", prod.stream, prod.rank)
        raw = _read_object(defs_path, warnings, label)
        if raw:
            try:
                d.load(raw)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                warnings.append(f"{label}: {defs_path.name} unusable ({exc}); goals by name")
        defs.append(d)
    summary_rows = []
    for key in _summary_keys(summaries, metrics):
        missing = [i for i, s in enumerate(summaries) if key not in s]
        values = [s.get(key) for s in summaries]
        goal, source = _goal(key, defs)
        summary_rows.append(
            {
                "metric": ".".join(key),
                "path": list(key),
                "values": values,
                "missing": missing,
                "goal": goal,
                "goal_from": source,
                "best": _best(values, missing, goal),
            }
        )
    identity_rows = _rows(idents, include_equal)
    for row in identity_rows:
        row["missing"] = []  # every run has every identity key (None: not known)
    return {
        "root": str(root_p),
        "stream": stream,
        "runs": runs_out,
        "identity": identity_rows,
        "config": _rows(configs, include_equal),
        "summary": summary_rows,
        "warnings": warnings,
    }


def compare_groups(
    runs: Iterable[str | os.PathLike[str]],
    *,
    group_by: str | Sequence[str],
    root: str | os.PathLike[str] = "runs",
    metrics: str | Sequence[str] | None = None,
    stream: str | None = None,
    rank: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Groups of runs side by side: per group and metric, the final and the best value of
    its runs summarised (docs/compare.md "Groups of runs").

    Args:
        runs: as :func:`compare_runs`; a folder that holds runs but is none (a Hydra
            multirun directory, a project) stands for the runs in it.
        group_by: config keys (a list or ``"a,b"``) or ``"auto"``: every config key but the
            seed-like ones (``seed``, ``*_seed``, ``rng``).
        root, metrics, stream, rank: as :func:`compare_runs`.
        seed: the bootstrap's random seed.

    Returns:
        ``{"root", "stream", "group_keys": [key], "groups": [{"label", "values": {key:
        value}, "runs": [run labels]}], "metrics": [{"metric", "goal", "goal_from",
        "final": [stats per group], "best": [stats per group] or None}], "warnings"}``.
        ``final`` summarises each run's ``summary.json`` value (its last value, or what the
        run set), ``best`` its lowest (goal ``min``) or highest (``max``) finite value over
        its whole series (None for a metric without a known direction or a nested summary
        key). Stats: :func:`~expr_tracker.query.stats.summarize` (``n``, ``mean``, ``std``,
        ``median``, ``min``, ``max``, ``ci``: the 95 % bootstrap interval of the mean, and
        the counts of values left out).

    Raises:
        CompareError: as :func:`compare_runs`, or a bad ``group_by`` (naming the config
            keys there are).
    """
    from expr_tracker.query.groups import expand_run_args
    from expr_tracker.query.stats import GroupError, group_runs, summarize

    if isinstance(runs, (str, bytes, os.PathLike)):
        raise CompareError(f"runs={runs!r} is one value: give a list of runs or folders of runs")
    given = expand_run_args([os.fspath(r) for r in runs])
    res = compare_runs(
        given, root=root, metrics=metrics, include_equal=True, stream=stream, rank=rank
    )
    n = len(res["runs"])
    configs: list[dict[str, Any]] = [{} for _ in range(n)]
    for row in res["config"]:
        for i, v in enumerate(row["values"]):
            if i not in row["missing"]:
                configs[i][row["key"]] = v
    try:
        keys, groups = group_runs(configs, group_by)
    except GroupError as exc:
        raise CompareError(str(exc)) from None
    flat = [r for r in res["summary"] if len(r["path"]) == 1 and r["goal"]]
    has_best = {id(r) for r in flat}
    bests = _best_values(res["runs"], [r["metric"] for r in flat], res["warnings"])
    out_metrics = []
    for row in res["summary"]:
        vals = [None if i in row["missing"] else v for i, v in enumerate(row["values"])]
        best = None
        if id(row) in has_best:
            per_run = [b.get((row["metric"], row["goal"])) for b in bests]
            best = [summarize([per_run[i] for i in g.members], seed=seed) for g in groups]
        out_metrics.append(
            {
                "metric": row["metric"],
                "goal": row["goal"],
                "goal_from": row["goal_from"],
                "final": [summarize([vals[i] for i in g.members], seed=seed) for g in groups],
                "best": best,
            }
        )
    return {
        "root": res["root"],
        "stream": stream,
        "group_keys": keys,
        "groups": [
            {
                "label": g.label,
                "values": g.values,
                "runs": [res["runs"][i]["run"] for i in g.members],
            }
            for g in groups
        ],
        "metrics": out_metrics,
        "warnings": res["warnings"],
    }


def _best_values(
    runs: list[dict[str, Any]], names: list[str], warnings: list[str]
) -> list[dict[tuple[str, str], float]]:
    """Per run, ``(metric, goal) -> `` the lowest and highest finite value of each metric
    over its whole series (a metrics file that cannot be read: none, with a warning)."""
    from expr_tracker.history.columns import read_columns

    want = set(names)
    out: list[dict[tuple[str, str], float]] = []
    for r in runs:
        got: dict[tuple[str, str], float] = {}
        path = Path(r["path"]) / file_name("metrics", r["stream"], r["rank"])
        if want and path.is_file():
            try:
                cols = read_columns(path, want.__contains__)
            except OSError as exc:
                warnings.append(f"{r['run']}: {path.name} unreadable ({exc}); no best values")
                cols = None
            for name, col in cols.columns.items() if cols is not None else ():
                finite = [v for v in col.values if math.isfinite(v)]
                if finite:
                    got[(name, "min")] = min(finite)
                    got[(name, "max")] = max(finite)
        out.append(got)
    return out


def run_config_view(
    run: str | os.PathLike[str],
    baseline: str | os.PathLike[str] | None = None,
    root: str | os.PathLike[str] = "runs",
) -> dict:
    """:func:`~expr_tracker.query.configview.config_view` of the run ``run`` names (a run directory, or ``project/name``
    or ``name`` under ``root``, as ``et compare``), against ``baseline`` when given; plus
    ``run`` and ``baseline_run`` (their ids) and ``warnings`` (files left out).

    Raises:
        CompareError: a name that names no run, or several.
    """
    from expr_tracker.query.configview import config_view, hydra_overrides

    root_p = Path(root)
    index = _index(root_p)
    warnings: list[str] = []

    def load(given: Any) -> tuple[str, Any, Any]:
        r = _resolve(given, root_p, index)
        main = min(r.producers, key=lambda p: (p.stream is not None, p.rank or 0))
        cfg = _read_object(main.config, warnings, r.run_id)
        info = _read_object(main.run_file, warnings, r.run_id)
        return r.run_id, cfg, info

    rid, cfg, info = load(run)
    if baseline is None:
        view = config_view(cfg, overrides=hydra_overrides(info))
        return {**view, "run": rid, "baseline_run": None, "warnings": warnings}
    bid, bcfg, _ = load(baseline)
    view = config_view(cfg, overrides=hydra_overrides(info), baseline=bcfg)
    return {**view, "run": rid, "baseline_run": bid, "warnings": warnings}
