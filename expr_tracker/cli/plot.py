"""``et plot RUN [METRIC ...]``: a run's metrics as charts in the terminal (plotext).

One chart per metric, with every run given overlaid on it (``et plot a b loss``,
``et plot --runs a,b loss``). RUN is a run directory, a metrics file, or a run's name under
``--dir`` (default ``./runs``: ``project/name``, or ``name`` alone when it is unique there).
Without ``--runs``, the leading arguments that name a run are runs and the rest metrics (a
metric of the first run is a metric, also when a run has its name); with ``--runs``, every
argument is a metric. A METRIC is a name or a glob (``'train/*'``, quoted so the shell
leaves it alone); none: the run's main metrics, as ``et runs`` picks them.

What is drawn, and what is not hidden:

- x is the step (``--x time``: seconds since the run's first row); ``--since STEP`` starts
  there.
- A long series is cut to the chart's width by M4 (``history/downsample.py``): per column
  the first, last, lowest and highest value, so spikes stay visible.
- NaN and ±inf cannot be placed on a y axis: each is marked on the chart's edge (NaN ``✗``
  and +inf ``▲`` on the top edge, -inf ``▼`` on the bottom one, at its x; the line is broken
  there), and the legend under the chart counts them. Values that are not numbers (strings, lists) are counted
  there too; with ``--log-y``, so are the values <= 0 that a log axis cannot show.
- ``--smooth ema:W|mean:N`` draws the smoothed series (``history/smoothing.py``: the
  debiased EMA of weight W as TensorBoard's, or the mean of the last N points, computed on
  every point before the cut) instead of the raw line — the terminal has no faint colour
  to keep both readable; the legend's ``last`` is still the raw last value. NaN/inf are not
  averaged in (they are marked as above). A plain number ALPHA (the older form) is
  ``ema:1-ALPHA``.

``--follow`` redraws as the runs write (only the bytes appended since the last poll are
read), until every run's ``run.json`` says it ended (a final draw, exit 0) or Ctrl-C (exit
130, the cursor shown again). On a terminal each frame replaces the last; piped, frames
follow one another. Colours only on a terminal, and never with ``--no-color`` or
``NO_COLOR`` set.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import os
import re
import shutil
import sys
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from expr_tracker.cli import output, runfiles
from expr_tracker.cli.plotrender import Layout, render_frame, render_group_frame

PLOT_EXTRA = "pip install 'expr-tracker[plot]'"
_ENDED = ("finished", "failed", "crashed", "preempted", "pruned")


class PlotError(Exception):
    """A problem to report on stderr with exit code ``code`` (1: not found, 2: usage)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def register(subparsers: Any) -> None:
    """Add the ``plot`` sub-command to ``subparsers`` (sets ``func``)."""
    p = subparsers.add_parser(
        "plot",
        help="chart a run's metrics in the terminal (several runs overlaid; --follow a live run)",
        description=(
            "Chart metrics of one or more runs in the terminal, one chart per metric. RUN: a "
            "run directory, a metrics file, a run name under --dir, or a run of a sync bucket "
            "(s3://bucket/prefix/PROJECT/RUN, file:///path/PROJECT/RUN; --dir may name a "
            "bucket too: docs/team.md); METRIC: names or globs "
            "('train/*'); default: the run's main metrics. Needs the plot extra: "
            f"{PLOT_EXTRA}."
        ),
    )
    p.add_argument("args", nargs="*", metavar="RUN [METRIC]", help="runs, then metrics")
    p.add_argument(
        "--runs",
        default=None,
        metavar="A,B",
        help="runs to overlay (then every positional argument is a metric)",
    )
    p.add_argument(
        "--dir",
        default="runs",
        help="where run names are looked up (default ./runs; a sync bucket's URL too)",
    )
    p.add_argument("--since", type=int, default=None, metavar="STEP", help="from step STEP on")
    p.add_argument(
        "--x",
        choices=("step", "time"),
        default=None,
        help="x axis: step (default) or time (seconds since the run's first row; the "
        "default of --stream system, whose step is the wall time in ms)",
    )
    p.add_argument(
        "--smooth",
        default=None,
        metavar="ema:W|mean:N",
        help="draw each series smoothed: ema:0.9 (the debiased EMA of weight W, 0 <= W < 1, "
        "as TensorBoard's) or mean:20 (the mean of the last N points); a plain number ALPHA "
        "is ema:1-ALPHA",
    )
    p.add_argument("--log-y", action="store_true", help="logarithmic y axis")
    p.add_argument(
        "--width", type=int, default=None, help="chart width in cells (default: the terminal's)"
    )
    p.add_argument(
        "--height",
        type=int,
        default=None,
        help="height of each chart in lines (default: the terminal's height shared by the charts)",
    )
    runfiles.add_producer_options(p, "metrics", "metrics")
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="redraw while the runs write, until they end (or Ctrl-C)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="seconds between redraws with --follow (default 1)",
    )
    p.add_argument("--no-color", action="store_true", help="no colours (also: NO_COLOR set)")
    p.add_argument(
        "--group-by",
        default=None,
        metavar="KEYS|auto",
        help="one line per group of runs with the same config values of KEYS (a,b), or "
        "'auto': every config key but seed-like ones (seed, *_seed, rng); a folder of runs "
        "(a Hydra multirun) stands for the runs in it",
    )
    p.add_argument(
        "--agg", choices=("mean", "median"), default="mean", help="a group's line (default mean)"
    )
    p.add_argument(
        "--band",
        choices=("minmax", "std", "sem", "ci", "none"),
        default="std",
        help="a group's band: min-max, ± std (default), ± standard error, 95%% bootstrap "
        "CI, or none",
    )
    from expr_tracker.cli.sync import on_buckets

    # s3://, file:// (docs/team.md): in DIR, a RUN and each run of --runs A,B
    p.set_defaults(func=on_buckets(run_plot, "plot", "args", "dir", lists=("runs",)))


# --------------------------------------------------------------------------- plotext


def load_plotext() -> Any:
    """The plotext module (>= 6: ``plotext.figure.signal``).

    Raises:
        PlotError: plotext is missing or too old; the message names the extra to install.
    """
    try:
        import plotext
    except ImportError:
        raise PlotError(f"et plot needs plotext, which is not installed: {PLOT_EXTRA}") from None
    fig = getattr(plotext, "figure", None)
    if fig is None or not hasattr(fig, "signal"):
        version = getattr(plotext, "__version__", "?")
        raise PlotError(
            f"et plot needs plotext >= 6 (found {version}, whose API differs): "
            f"pip install -U 'expr-tracker[plot]'"
        )
    return plotext


# --------------------------------------------------------------------------- runs


@dataclass
class RunSource:
    """One run to draw: its label, its metrics file, its ``run*.json`` (or None), the
    columns read so far and where reading stopped."""

    label: str
    path: Path
    info: Path | None
    columns: Any = None  # history.columns.MetricColumns
    offset: int = 0
    carry: bytes = b""
    inode: tuple[int, int] | None = None  # (st_dev, st_ino) of the file read
    #: an overlay's summaries per metric, extended as --follow reads (cli/plotrender.py)
    pyramids: dict = field(default_factory=dict)


def _run_path(arg: str, root: Path, entries: list[Any] | None) -> Path:
    """The run directory or file ``arg`` names (``catalog.resolve_run``, the rule of every
    command: docs/cli.md "Naming a run"); ``entries``: the runs under ``root``.

    Raises:
        PlotError: no such run (close names listed) or an ambiguous name.
    """
    from expr_tracker.query.catalog import RunNotFoundError, resolve_run

    try:
        return resolve_run(arg, root, entries).path
    except RunNotFoundError as exc:
        raise PlotError(str(exc)) from None


def _entries(root: Path) -> list[Any]:
    """The runs under ``root`` a name is looked up among (none when it is no folder)."""
    from expr_tracker.query.catalog import discover, run_entries

    return run_entries(discover(root), root) if root.is_dir() else []


def _labels(paths: list[Path], suffixes: list[str] | None = None) -> list[str]:
    """Short distinct labels: the fewest trailing path parts that, with each run's suffix
    (``[rank1]``, ``[data]``), tell the runs apart."""
    ends = suffixes or [""] * len(paths)
    parts = [p.resolve().parts for p in paths]
    for k in range(1, max((len(x) for x in parts), default=1) + 1):
        labels = ["/".join(x[-k:]) + e for x, e in zip(parts, ends, strict=True)]
        if len(set(labels)) == len(labels):
            return labels
    return [str(p) + e for p, e in zip(paths, ends, strict=True)]


def _status(info: Path | None) -> str | None:
    from expr_tracker.history.runinfo import read_run_info

    if info is None:
        return None
    data = read_run_info(info, repair=False)
    st = data.get("status") if data else None
    return st if isinstance(st, str) else None


def open_runs(args: argparse.Namespace, names: list[str]) -> list[RunSource]:
    """The runs ``names`` name, with their metrics files (for ``--stream``/``--rank``)."""
    from expr_tracker.history.paths import file_name, resolve_run_path
    from expr_tracker.history.rundirs import find_runs

    root = Path(args.dir)
    known: list[Any] | None = None
    picked: list[tuple[Path, Path, Path | None]] = []
    for name in names:
        if known is None and not Path(name).exists():
            known = _entries(root)
        run = _run_path(name, root, known)
        info = runfiles.producer_file(run, "run", args.stream, args.rank)
        try:
            path = resolve_run_path(run, stream=args.stream, rank=args.rank)
        except ValueError as exc:
            raise PlotError(str(exc), 2) from None
        except FileNotFoundError as exc:
            # a live run that has not written a row yet: wait for its file (--follow)
            if args.follow and run.is_dir() and _status(info) == "running":
                path = run / file_name("metrics", args.stream, args.rank)
            elif len(names) > 1 and run.is_dir() and info is not None and info.exists():
                # a run with no row (yet) among others: drawn empty, the others still are
                path = run / file_name("metrics", args.stream, args.rank)
                sys.stderr.write(
                    f"et plot: warning: {output.printable(str(run))} has no rows"
                    f"{'' if path.name == 'metrics.jsonl' else ' in ' + path.name}\n"
                )
            else:
                inside = find_runs(run) if run.is_dir() else []
                if inside and run not in inside:  # a project (or runs) directory
                    names = sorted(d.relative_to(run).as_posix() for d in inside)
                    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
                    listed = ", ".join(output.printable(n) for n in names[:5]) + more
                    raise PlotError(
                        f"{str(run)!r} is no run but holds {len(names)} runs: {listed}; give "
                        "one, or several (et plot RUN1 RUN2 METRIC, or --runs A,B)"
                    ) from None
                raise PlotError(str(exc)) from None
        if any(path.resolve() == q.resolve() for q, _, _ in picked):
            continue  # the same run twice
        run_dir = run if run.is_dir() else run.parent
        picked.append((path, run_dir, info if info is not None and info.exists() else None))
    suffixes = []
    for path, _, _ in picked:
        inner = ""
        if path.name != "metrics.jsonl":  # another stream or rank: st[data], st[rank1]
            inner = path.name
            if inner.startswith("metrics.") and inner.endswith(".jsonl"):
                inner = inner[len("metrics.") : -len(".jsonl")]
            inner = f"[{inner}]"
        suffixes.append(inner)
    labels = _labels([d for _, d, _ in picked], suffixes)
    return [
        RunSource(output.printable(label), path, info)
        for (path, _, info), label in zip(picked, labels, strict=True)
    ]


def _split_runs(text: str, root: Path) -> list[str]:
    """The runs of ``--runs A,B``; a run whose name has a comma (``lr=0.1,bs=32``) stays
    whole: a piece that names no run is joined with the next ones until they name one."""

    pieces = text.split(",")
    known: list[Any] | None = None
    out = []
    i = 0
    while i < len(pieces):
        take = 1
        if len(pieces) - i > 1:
            if known is None:
                known = _entries(root)
            for j in range(i + 1, len(pieces) + 1):
                name = ",".join(pieces[i:j]).strip()
                try:
                    _run_path(name, root, known)
                except PlotError:
                    continue
                take = j - i
                break
        name = ",".join(pieces[i : i + take]).strip()
        if name:
            out.append(name)
        i += take
    return out


def _split_args(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(runs, metric patterns) from the positional arguments and ``--runs``."""
    from expr_tracker.history.rundirs import find_runs
    from expr_tracker.query.catalog import match_runs

    pos = list(args.args)
    if args.runs is not None:
        runs = _split_runs(args.runs, Path(args.dir))
        if not runs:
            raise PlotError("--runs names no run (give A,B)", 2)
        return runs, pos
    if not pos:
        raise PlotError("give a run: et plot RUN [METRIC ...] (or --runs A,B)", 2)
    runs = [pos.pop(0)]
    root = Path(args.dir)
    known: list[Any] | None = None
    first_metrics: set[str] | None = None  # read only when a name is both
    while pos:
        a = pos[0]
        p = Path(a)
        holds = getattr(args, "group_by", None) and p.is_dir() and find_runs(p)
        if (
            (p.is_file() and p.suffix == ".jsonl")
            or (p.is_dir() and find_runs(p, max_depth=0))
            or holds
        ):
            runs.append(pos.pop(0))  # a metrics file or a run directory (not any path)
            continue
        if known is None:
            known = _entries(root)
        if len(match_runs(a, known)) == 1:
            if first_metrics is None:
                first_metrics = _metric_names(runs[0], root, known, args)
            if a in first_metrics:  # `et plot RUN m`: the metric m, not also a run named m
                break
            runs.append(pos.pop(0))
            continue
        break
    return runs, pos


def _metric_names(arg: str, root: Path, known: list[Any], args: argparse.Namespace) -> set[str]:
    """Every metric name in the metrics file of the run ``arg`` names (empty when it
    cannot be read: the error comes later)."""
    from expr_tracker.history.columns import read_columns
    from expr_tracker.history.paths import resolve_run_path

    try:
        run = _run_path(arg, root, known)
        path = resolve_run_path(run, stream=args.stream, rank=args.rank)
        return set(read_columns(path, lambda name: False).names)
    except (PlotError, ValueError, OSError):
        return set()


# --------------------------------------------------------------------------- metrics


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _selector(patterns: list[str]) -> Any:
    exact = set(patterns)  # also 'grad[3]': a name with glob characters is itself too
    globs = [p for p in patterns if _is_glob(p)]

    def select(name: str) -> bool:
        return name in exact or any(fnmatch.fnmatchcase(name, g) for g in globs)

    return select


def default_metrics(sources: list[RunSource], problems: list[str] | None = None) -> list[str]:
    """The main metrics of each run (as ``et runs`` picks them), in order, each once; a
    metrics file that cannot be read adds ``'PATH': why`` to ``problems`` (when given)."""
    from expr_tracker.cli.runs import main_metrics
    from expr_tracker.history.reader import JsonlReader
    from expr_tracker.history.rundirs import os_reason

    names: dict[str, None] = {}
    for src in sources:
        try:
            rows = JsonlReader(src.path).tail(100)
        except OSError as exc:
            if problems is not None:
                problems.append(f"{str(src.path)!r}: {os_reason(exc)}")
            continue
        for m in main_metrics(rows, None):
            names.setdefault(m, None)
    return list(names)


def chart_metrics(patterns: list[str], sources: list[RunSource]) -> list[str]:
    """The metrics to chart, in the order of the patterns (a glob's matches in order of
    first appearance over the runs)."""
    seen: dict[str, None] = {}
    for pat in patterns:
        for src in sources:
            for name in src.columns.names:
                if name in src.columns.columns and (
                    name == pat or (_is_glob(pat) and fnmatch.fnmatchcase(name, pat))
                ):
                    seen.setdefault(name, None)
    return list(seen)


def missing_patterns(
    patterns: list[str], sources: list[RunSource], since: int | None = None
) -> list[str]:
    """A message per pattern that matches no metric of any run (close names listed; with
    ``since``, of the rows from that step on)."""
    known: dict[str, None] = {}
    for src in sources:
        for name in src.columns.names:
            known.setdefault(name, None)
    out = []
    where = f" from step {since} on" if since is not None else ""
    for pat in patterns:
        if _is_glob(pat):
            if pat not in known and not any(fnmatch.fnmatchcase(n, pat) for n in known):
                out.append(f"pattern {pat!r} matches no metric{where}")
        elif pat not in known:
            close = difflib.get_close_matches(pat, list(known), n=3, cutoff=0.6)
            hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
            out.append(f"unknown metric {pat!r}{where}{hint}")
    if out:
        names = [n for n in known if not n.startswith(("time_ms/", "count/"))] or list(known)
        listed = ", ".join(output.printable(n) for n in names[:12])
        more = f" and {len(names) - 12} more" if len(names) > 12 else ""
        out[-1] += f"; metrics in the run{'s' if len(sources) > 1 else ''}: " + (
            f"{listed}{more}" if names else "none (no rows yet)"
        )
    return [output.printable(m) for m in out]


# --------------------------------------------------------------------------- frames


def frame(
    plt: Any,
    sources: list[RunSource],
    patterns: list[str],
    args: argparse.Namespace,
    layout: Layout,
    color: bool,
) -> str:
    """Every chart of the current data, as text (``cli/plotrender.py`` draws them); with
    ``--group-by``, one line and band per group of runs."""
    if getattr(args, "groups", None) is not None:
        return render_group_frame(
            plt,
            sources,
            args.groups,
            chart_metrics(patterns, sources),
            agg=args.agg,
            band=args.band,
            smooth=args.smooth,
            log_y=args.log_y,
            layout=layout,
            color=color,
        )
    return render_frame(
        plt,
        sources,
        chart_metrics(patterns, sources),
        x_mode=args.x or ("time" if args.stream == "system" else "step"),
        since=args.since,
        smooth=args.smooth,
        log_y=args.log_y,
        layout=layout,
        color=color,
    )


# --------------------------------------------------------------------------- reading


def complete_end(path: Path) -> int:
    from expr_tracker.cli.history import complete_end as end

    return end(path)


def read_all(src: RunSource, select: Any, since: int | None) -> None:
    """Read ``src``'s metrics file up to its last complete line."""
    from expr_tracker.history.columns import MetricColumns, read_columns

    src.columns = MetricColumns(select, since)
    src.offset, src.carry = 0, b""
    if not src.path.is_file():
        return
    try:
        st = os.stat(src.path)
        src.inode = (st.st_dev, st.st_ino)
    except OSError:
        return
    end = complete_end(src.path)
    read_columns(src.path, select, since=since, end=end, into=src.columns)
    src.offset = end


def poll(src: RunSource, select: Any, since: int | None) -> bool:
    """Take the lines appended to ``src``'s file since the last read; True when some came.
    A file that shrank (rewritten) or is another file now (replaced) is read again from
    its start."""
    from expr_tracker.history.reader import decode_appended

    try:
        st = os.stat(src.path)
    except OSError:
        return False
    size = st.st_size
    if size < src.offset or (src.inode is not None and (st.st_dev, st.st_ino) != src.inode):
        # rewritten, or replaced by another file (a run deleted and started again): its
        # bytes at our offset are not the continuation of what was read
        read_all(src, select, since)
        return True
    if src.inode is None:  # a file that appeared after the first read
        src.inode = (st.st_dev, st.st_ino)
    if size == src.offset:
        return False
    with open(src.path, "rb") as f:
        f.seek(src.offset)
        data = f.read(size - src.offset)
    src.offset += len(data)
    rows, src.carry = decode_appended(src.carry, data)
    src.columns.add_rows(rows)
    return bool(rows)


# --------------------------------------------------------------------------- command


def _use_color(args: argparse.Namespace, out: Any) -> bool:
    if args.no_color or os.environ.get("NO_COLOR", ""):
        return False
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):
        return False


def run_plot(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """The ``et plot`` command; returns the exit code (0 ok, 1 not found or nothing to
    plot, 2 usage, 130 Ctrl-C while following)."""
    out = out or sys.stdout
    try:
        return _plot(args, out)
    except PlotError as exc:
        sys.stderr.write(f"et plot: {exc}\n")
        return exc.code


def smoothing_option(text: Any) -> Any:
    """``--smooth``'s value as a :class:`~expr_tracker.history.smoothing.Smoothing` (None:
    none): ``ema:W``, ``mean:N``, or a plain number ALPHA in (0, 1] (``ema:1-ALPHA``; 1 is
    the raw series); :class:`PlotError` (usage) else."""
    from expr_tracker.history.smoothing import Smoothing, parse_smoothing

    if text is None or not isinstance(text, str):
        return text
    try:
        alpha = float(text)
    except ValueError:
        try:
            return parse_smoothing(text, name="--smooth")
        except ValueError as exc:
            raise PlotError(str(exc), 2) from None
    if not 0 < alpha <= 1:
        raise PlotError(
            f"--smooth {text} is not valid: ema:W (0 <= W < 1), mean:N (N >= 1), or a plain "
            "ALPHA with 0 < ALPHA <= 1 (1: raw)",
            2,
        )
    return None if alpha == 1 else Smoothing("ema", 1.0 - alpha)


def _check(args: argparse.Namespace) -> None:
    args.smooth = smoothing_option(args.smooth)
    if args.since is not None and args.since < 0:
        raise PlotError(f"--since {args.since} is not valid: a step >= 0", 2)
    if args.width is not None and args.width < 30:
        raise PlotError(f"--width {args.width} is not valid: at least 30 cells", 2)
    if args.height is not None and args.height < 6:
        raise PlotError(f"--height {args.height} is not valid: at least 6 lines", 2)
    if not (0 < args.interval <= 86400):  # NaN too: time.sleep would raise
        raise PlotError(
            f"--interval {args.interval:g} is not valid: seconds, > 0 and at most 86400", 2
        )
    try:
        runfiles.check_rank(args.rank)
    except ValueError as exc:
        raise PlotError(str(exc), 2) from None
    if getattr(args, "group_by", None) is not None and args.x is None:
        args.x = "step"  # groups align on the step, whatever the stream's default
    if getattr(args, "group_by", None) is not None and args.x != "step":
        raise PlotError(
            "--group-by aligns runs on the step: --x time cannot be grouped (two runs "
            "rarely log at the same second; see docs/compare.md)",
            2,
        )


def _plot(args: argparse.Namespace, out: IO[str]) -> int:
    _check(args)
    plt = load_plotext()
    run_names, patterns = _split_args(args)
    if getattr(args, "group_by", None) is not None:
        from expr_tracker.query.groups import expand_run_args

        run_names = expand_run_args(run_names)
    sources = open_runs(args, run_names)
    args.groups = _groups(args, sources) if getattr(args, "group_by", None) is not None else None
    if args.follow and not patterns:
        patterns = _wait_for_defaults(sources, args.interval)
    elif not patterns:
        unreadable: list[str] = []
        patterns = default_metrics(sources, unreadable)
        if not patterns and unreadable:  # not "no numeric metric": it could not be read
            raise PlotError("cannot read " + "; ".join(unreadable))
        if not patterns:
            raise PlotError(
                "nothing to plot: no numeric metric in the newest rows of "
                + ", ".join(repr(str(s.path)) for s in sources)
            )
    select = _selector(patterns)
    for src in sources:
        read_all(src, select, args.since)
    problems = missing_patterns(patterns, sources, args.since)
    if problems:
        live = [s for s in sources if _status(s.info) == "running"]
        if not (args.follow and live):  # no row can come that would have it
            if args.since is not None and not any(s.columns.rows for s in sources):
                raise PlotError(_nothing_since(sources, args.since))
            raise PlotError("; ".join(problems))
        for p in problems:  # a live run may log it later
            sys.stderr.write(f"et plot: warning: {p} (yet; waiting)\n")
    color = _use_color(args, out)

    def layout() -> Layout:
        width = args.width or shutil.get_terminal_size((100, 30)).columns
        return Layout(max(30, width), args.height)

    if not args.follow:
        out.write(frame(plt, sources, patterns, args, layout(), color))
        out.flush()
        return 0
    return _follow(plt, sources, patterns, select, args, layout, color, out)


def _groups(args: argparse.Namespace, sources: list[RunSource]) -> list[Any]:
    """The groups of ``sources`` by ``--group-by`` (``query/stats.py``), from each run's
    config of the plotted stream."""
    from expr_tracker.query.groups import read_config
    from expr_tracker.query.stats import GroupError, group_runs

    configs = [read_config(s.path.parent, args.stream) for s in sources]
    try:
        _, groups = group_runs(configs, args.group_by)
    except GroupError as exc:
        raise PlotError(f"--group-by: {exc}", 2) from None
    return groups


def _nothing_since(sources: list[RunSource], since: int) -> str:
    """The error for a ``--since`` beyond every run's last step (not an unknown metric)."""
    from expr_tracker.history.reader import JsonlReader

    parts = []
    for src in sources:
        try:
            rows = JsonlReader(src.path).tail_rows(1) if src.path.is_file() else []
        except OSError:
            rows = []
        step = rows[-1].get("_step") if rows else None
        last = f"its last step is {step}" if type(step) is int else "it has no rows"
        parts.append(f"{src.label}: {last}")
    return f"nothing to plot from step {since} on (--since {since}): " + "; ".join(parts)


def _wait_for_defaults(sources: list[RunSource], interval: float) -> list[str]:
    """--follow without metrics: the main metrics once some run has rows."""
    while True:
        names = default_metrics(sources)
        if names or all(_status(s.info) in _ENDED for s in sources if s.info):
            if not names:
                raise PlotError("nothing to plot: the runs ended without a numeric metric")
            return names
        time.sleep(interval)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _cells(line: str) -> int:
    """The terminal columns ``line`` takes (colour codes none, wide characters two)."""
    plain = _ANSI.sub("", line)
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in plain
    )


def _screen(text: str, rows: int, first: bool, cols: int = 0) -> str:
    """A ``--follow`` frame for a terminal of ``rows`` lines and ``cols`` columns: drawn
    from the top-left corner over the last one (each line cleared before it is written,
    the rest of the screen after), so it does not flicker; the first frame clears the
    screen. A frame taller than the terminal (a line wider than it counts as the lines it
    wraps to) is cut to it, with a last line saying so: written whole, its top would scroll
    out of sight and every redraw would push a screenful into the scrollback."""
    lines = text.rstrip("\n").split("\n")
    room = max(2, rows) - 1  # the cursor ends on the line below the frame

    def height(line: str) -> int:
        return max(1, -(-_cells(line) // cols)) if cols > 0 else 1

    if sum(height(line) for line in lines) > room:
        kept: list[str] = []
        used = 0
        for line in lines:
            if used + height(line) > room - 1:
                break
            kept.append(line)
            used += height(line)
        note = f"({len(lines) - len(kept)} more lines: fewer metrics or a smaller --height)"
        lines = kept + [note[: cols - 1] if cols > 1 else note]
    body = "".join(f"\x1b[K{line}\n" for line in lines) + "\x1b[J"
    return ("\x1b[H\x1b[2J" if first else "\x1b[H") + body


def _follow(
    plt: Any,
    sources: list[RunSource],
    patterns: list[str],
    select: Any,
    args: argparse.Namespace,
    layout: Any,
    color: bool,
    out: IO[str],
) -> int:
    tty = False
    try:
        tty = bool(out.isatty())
    except (AttributeError, ValueError):
        pass

    first = True

    def draw() -> None:
        nonlocal first
        text = frame(plt, sources, patterns, args, layout(), color)
        if tty:
            size = shutil.get_terminal_size((100, 30))
            out.write(_screen(text, size.lines, first, size.columns))
            first = False
        else:
            out.write(text + "\n")
        out.flush()

    if tty:
        out.write("\x1b[?25l")  # hide the cursor while frames replace each other
    # on a terminal, SIGTERM (`timeout 60 et plot -f`) exits 143 with the cursor shown again
    try:
        with output.sigterm_as_exit(tty):
            draw()
            watched = [s for s in sources if s.info is not None]
            while True:
                time.sleep(args.interval)
                got = False
                for src in sources:
                    got = poll(src, select, args.since) or got
                if got:
                    draw()
                    continue
                if watched and all(_status(s.info) in _ENDED for s in watched):
                    # read once more: a run closes its metrics file before run.json says ended
                    if any([poll(src, select, args.since) for src in sources]):
                        draw()
                    break
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        if tty:
            out.write("\x1b[?25h")  # the frame's last line ends with a newline
        try:
            out.flush()
        except (OSError, ValueError):
            pass
