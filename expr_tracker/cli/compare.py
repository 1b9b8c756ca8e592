"""``et compare RUN RUN...``: runs side by side (see ``expr_tracker.query.compare``).

One table, a column per run: the identity keys that differ (status, steps, the run's
first start, wall duration and active time over every attempt, tags, group, git commit), the config keys that differ (``--all``: every key), and the summary
values (``--metrics`` picks them), the best run of a metric with a known direction marked
``*``. All text is printed literally (no rich markup); long values end in ``…``.

``--format json``/``jsonl``: :func:`~expr_tracker.query.compare.compare_runs`'s dict as
strict JSON, as every ``et`` command writes it: NaN and ±inf become ``null`` (the table shows
them; ``compare_runs`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from typing import IO, Any

from expr_tracker.cli import output
from expr_tracker.history.values import json_safe, json_text

#: the longest cell shown before it is cut with an ellipsis (terminal cells)
MAX_CELL = 60
#: the narrowest table (--width) that still shows a key and a value side by side
MIN_WIDTH = 20
#: a value this short is never cut to fit runs beside each other (they go below instead)
SHORT_CELL = 16
#: a number cell (never cut either: 1152921504606846976 and ...977 differ in the last digit)
_NUMBER = re.compile(r"-?[0-9][0-9.eE+-]*")


def register(subparsers: Any) -> None:
    """Add the ``compare`` sub-command to ``subparsers`` (sets ``func``)."""
    p = subparsers.add_parser(
        "compare",
        help="runs side by side: config and identity differences, summaries",
        description="Compare two or more runs: the config and identity keys that differ, "
        "and their summaries side by side (best run of a metric marked *).",
    )
    p.add_argument(
        "runs",
        nargs="*",
        metavar="RUN",
        help="a run directory, or project/name or name of a run under --dir (at least two); "
        "with --group-by or --sweep also a folder of runs (a Hydra multirun directory)",
    )
    p.add_argument("--dir", default="runs", help="where names are looked up (default ./runs)")
    p.add_argument(
        "--metrics",
        default=None,
        metavar="A,B",
        help="summary keys to show: names or globs (default: every numeric key but "
        "time_ms/* and count/*)",
    )
    p.add_argument(
        "--all", action="store_true", help="also list config and identity keys that are equal"
    )
    p.add_argument("--stream", default=None, help="compare this stream (default: the main one)")
    p.add_argument(
        "--rank", type=int, default=None, help="compare this rank (default 0, or the lowest)"
    )
    p.add_argument("--width", type=int, default=None, help="table width (default: the terminal)")
    p.add_argument(
        "--format",
        choices=("table", "json", "jsonl"),
        default="table",
        help="table (default); json: one JSON document (an object: runs, identity, config, "
        "summary), strict JSON (NaN/inf as null); jsonl: the same object on one line",
    )
    p.add_argument(
        "--group-by",
        default=None,
        metavar="KEYS|auto",
        help="a table of groups of runs (same values of config KEYS a,b; 'auto': every key "
        "but seed-like ones): per metric the final and best values, mean ± std, n, 95%% CI",
    )
    p.add_argument(
        "--sweep",
        action="store_true",
        help="the parameter-importance table of the runs (default: every run under --dir): "
        "random-forest permutation importance and correlations with --metric",
    )
    p.add_argument(
        "--metric",
        default=None,
        help="--sweep: the summary key to explain (default: the first loss/acc-like one)",
    )
    p.add_argument("--group", default=None, help="--sweep: only the runs of this group")
    p.add_argument(
        "--where",
        default=None,
        metavar="SQL",
        help="--sweep: an SQL condition over the runs view ('\"config.lr\" > 1e-3')",
    )
    from expr_tracker.cli.sync import on_buckets

    p.set_defaults(
        func=on_buckets(run_compare, "compare", "runs", "dir")
    )  # s3://, file:// (docs/team.md)


def run_compare(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """The ``et compare`` command; returns the exit code (0 ok, 1 a run or metric not
    found or not comparable, 2 fewer than two runs)."""
    from expr_tracker.query.compare import CompareError, compare_runs

    out = out or sys.stdout
    if args.sweep and args.group_by is not None:
        sys.stderr.write("et compare: give --sweep or --group-by, not both\n")
        return 2
    if not args.sweep and (args.metric or args.group is not None or args.where is not None):
        sys.stderr.write("et compare: --metric, --group and --where go with --sweep\n")
        return 2
    if args.sweep or args.group_by is not None:
        # the statistics need numpy (the query extra) and the runs view duckdb
        try:
            import duckdb  # noqa: F401
            import numpy  # noqa: F401
        except ImportError as exc:
            what = "--sweep" if args.sweep else "--group-by"
            sys.stderr.write(
                f"et compare {what} needs {exc.name}: pip install 'expr-tracker[query]'\n"
            )
            return 1
        return _run_sweep(args, out) if args.sweep else _run_groups(args, out)
    if len(args.runs) < 2:
        sys.stderr.write(f"et compare: give at least two runs (got {len(args.runs)})\n")
        return 2
    if args.width is not None and args.width < MIN_WIDTH:
        sys.stderr.write(
            f"et compare: --width {args.width} is too narrow: give {MIN_WIDTH} or more "
            "(a narrow table continues below, a block of runs at a time)\n"
        )
        return 2
    metrics = None
    if args.metrics is not None:
        metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    try:
        result = compare_runs(
            args.runs,
            root=args.dir,
            metrics=metrics,
            include_equal=args.all,
            stream=args.stream,
            rank=args.rank,
        )
    except CompareError as exc:
        sys.stderr.write(f"et compare: {exc}\n")
        return 1
    for w in result["warnings"]:
        sys.stderr.write(f"et compare: warning: {w}\n")
    if output.is_machine(args.format):
        indent = 2 if args.format == "json" else None
        out.write(json.dumps(json_safe(result, "null"), indent=indent, default=str) + "\n")
        return 0
    from expr_tracker.cli.history import table_width

    console = output.console(out, table_width(out, args.width), markup=False, emoji=False)
    console.print(compare_table(result, console.width))
    if any(r["best"] for r in result["summary"]):
        console.print("* best value (min/max: the metric's define_metric goal, else its name)")
    return 0


def _write_json(args: argparse.Namespace, result: dict[str, Any], out: IO[str]) -> None:
    indent = 2 if args.format == "json" else None
    out.write(json.dumps(json_safe(result, "null"), indent=indent, default=str) + "\n")


def _run_groups(args: argparse.Namespace, out: IO[str]) -> int:
    """``et compare --group-by``: one table per metric, a row per group."""
    from expr_tracker.query.compare import CompareError, compare_groups

    if not args.runs:
        sys.stderr.write("et compare: --group-by needs runs or a folder of runs\n")
        return 2
    try:
        result = compare_groups(
            args.runs,
            group_by=args.group_by,
            root=args.dir,
            metrics=args.metrics,
            stream=args.stream,
            rank=args.rank,
        )
    except CompareError as exc:
        sys.stderr.write(f"et compare: {exc}\n")
        return 1
    for w in result["warnings"]:
        sys.stderr.write(f"et compare: warning: {w}\n")
    if output.is_machine(args.format):
        _write_json(args, result, out)
        return 0
    from expr_tracker.cli.history import table_width

    console = output.console(out, table_width(out, args.width), markup=False, emoji=False)
    for t in groups_tables(result):
        console.print(t)
    console.print(
        "mean ± std over the group's runs; n: runs with a finite value; CI: 95 % bootstrap "
        "interval of the mean (below 6 runs it cannot reach 95 %: docs/compare.md)"
    )
    return 0


def _stat(s: dict[str, Any] | None) -> tuple[str, str]:
    """(``mean ± std``, ``[lo, hi]``) cells of one :func:`summarize` result."""
    if s is None or s["mean"] is None:
        return "", ""
    text = _number(s["mean"]) + (f" ± {_number(s['std'])}" if s["std"] is not None else "")
    ci = f"[{_number(s['ci'][0])}, {_number(s['ci'][1])}]" if s["ci"] else ""
    return text, ci


def groups_tables(result: dict[str, Any]) -> list[Any]:
    """Rich tables of a :func:`~expr_tracker.query.compare.compare_groups` result: one per
    metric, a row per group: its runs, then the final value's and (for a metric with a
    direction) the best value's mean ± std, n and 95 % CI. Every cell is a ``Text``."""
    from rich.table import Table
    from rich.text import Text

    tables = []
    for m in result["metrics"]:
        title = m["metric"] + (f" ({m['goal']})" if m["goal"] else "")
        t = Table(
            title=Text(output.printable(title), style="bold"),
            title_justify="left",
            box=None,
            pad_edge=False,
        )
        for head in ("group", "runs", "final mean ± std", "n", "final 95% CI"):
            t.add_column(Text(head, style="bold"), overflow="fold")
        if m["best"] is not None:
            for head in (f"best ({m['goal']}) mean ± std", "n", "best 95% CI"):
                t.add_column(Text(head, style="bold"), overflow="fold")
        for k, g in enumerate(result["groups"]):
            final = m["final"][k]
            cells = [
                output.printable(_cut(g["label"])),
                str(len(g["runs"])),
                *_stat(final)[:1],
                str(final["n"]),
                _stat(final)[1],
            ]
            if m["best"] is not None:
                best = m["best"][k]
                cells += [_stat(best)[0], str(best["n"]), _stat(best)[1]]
            t.add_row(*(Text(c) for c in cells))
        tables.append(t)
    if not tables:
        tables.append(Text("(no summary values)"))
    return tables


def _run_sweep(args: argparse.Namespace, out: IO[str]) -> int:
    """``et compare --sweep``: the importance table of the runs under --dir (or given)."""
    from expr_tracker.query.groups import expand_run_args
    from expr_tracker.query.sweep import SweepError, sweep

    runs = None
    if args.runs:
        runs = expand_run_args(args.runs)
        missing = [r for r in runs if not os.path.isdir(r)]
        if missing:
            sys.stderr.write(
                f"et compare: --sweep takes run directories or folders of runs: "
                f"{', '.join(repr(m) for m in missing)} is none\n"
            )
            return 1
    try:
        result = sweep(
            args.dir if runs is None else os.path.commonpath([os.path.abspath(r) for r in runs]),
            runs=runs,
            metric=args.metric,
            group=args.group,
            where=args.where,
        )
    except SweepError as exc:
        sys.stderr.write(f"et compare: {exc}\n")
        return 1
    except ImportError as exc:
        sys.stderr.write(f"et compare: {exc}\n")
        return 1
    if output.is_machine(args.format):
        _write_json(args, result, out)
        return 0
    from expr_tracker.cli.history import table_width

    console = output.console(out, table_width(out, args.width), markup=False, emoji=False)
    console.print(sweep_table(result))
    for note in result["notes"]:
        console.print(f"note: {note}")
    return 0


def sweep_table(result: dict[str, Any]) -> Any:
    """A title line and a rich ``Table`` of a :func:`~expr_tracker.query.sweep.sweep`
    result: a row per varying config key, its kind, importance ± std and correlations with
    the metric."""
    from rich.table import Table
    from rich.text import Text

    title = (
        f"{result['metric']}"
        + (f" ({result['goal']})" if result["goal"] else "")
        + f" over {len(result['runs'])} runs: {result['method']}"
        + f", fitted on {result['fitted_on']}"
    )
    t = Table(box=None, pad_edge=False)
    for head in ("key", "kind", "importance", "± std", "pearson", "spearman"):
        t.add_column(Text(head, style="bold"), overflow="fold")
    kinds = {k["key"]: k["kind"] for k in result["keys"]}

    def num(v: Any) -> str:
        return "" if v is None else f"{v:.3f}"

    for row in result["importance"]:
        t.add_row(
            *(
                Text(c)
                for c in (
                    output.printable(_cut(row["key"])),
                    kinds.get(row["key"], ""),
                    num(row["importance"]),
                    num(row["std"]),
                    num(row["pearson"]),
                    num(row["spearman"]),
                )
            )
        )
    from rich.console import Group

    return Group(Text(output.printable(title)), t)


def _cut(text: str) -> str:
    """``text`` cut to :data:`MAX_CELL` terminal cells (an ellipsis marks the cut), in one
    pass: a key of 100,000 characters once took 35 s, a character at a time."""
    from rich.cells import cell_len, get_character_cell_size

    if cell_len(text) <= MAX_CELL:
        return text
    width = 0
    for i, ch in enumerate(text):
        width += get_character_cell_size(ch)
        if width > MAX_CELL - 1:
            return text[:i] + "…"
    return text  # pragma: no cover - cell_len said it was wider


def _number(v: Any) -> str:
    if type(v) is float:
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return f"{v:.6g}"
    if type(v) is int:
        return str(v)
    return json_text(v)


def _duration(s: Any) -> str:
    if type(s) not in (int, float) or not math.isfinite(s):
        return ""
    if s < 60:
        return f"{s:.3g}s"
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _when(t: Any) -> str:
    """Epoch seconds as local time to the minute, as ``et runs`` shows a start
    (``2026-12-02 03:08``: a short cell); "" for what is no time."""
    if type(t) not in (int, float) or not math.isfinite(t) or not 0 <= t <= 253402300799:
        return ""
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return ""


def _identity_cell(key: str, v: Any) -> str:
    if v is None:
        return ""
    if key in ("wall_duration_s", "active_duration_s"):
        return _duration(v)
    if key == "first_started_at":
        return _when(v)
    if key == "tags" and isinstance(v, list):
        return ", ".join(str(t) for t in v)
    if isinstance(v, str):
        return v
    return json_text(v)


def compare_table(result: dict[str, Any], width: int = 200) -> Any:
    """A rich ``Table`` of a :func:`compare_runs` result, ``width`` terminal cells wide at
    most: a column per run; sections run, config, summary. Every cell is a ``Text`` (never
    markup); missing keys read ``(missing)``, a JSON null ``null``. The key column takes
    up to a third of the width; runs that do not fit beside each other continue in another
    table below (a rich ``Group``), each with the key column; a cell too long ends in ``…``."""
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    n = len(result["runs"])
    missing = Text("(missing)", style="dim italic")
    heads = []
    for r in result["runs"]:
        head = r["run"] + (f" [{r['stream']}]" if r["stream"] else "")
        head += f" rank{r['rank']}" if r["rank"] else ""
        heads.append(Text(_cut(output.printable(head)), style="bold"))
    rows: list[tuple[Text, list[Text]]] = []

    def section(title: str, body: list[tuple[Text, list[Text]]], empty: str) -> None:
        rows.append((Text(title, style="bold underline"), [Text("")] * n))
        rows.extend(body or [(Text(empty, style="dim"), [Text("")] * n)])

    ident = []
    for row in result["identity"]:
        cells = [Text(_cut(output.printable(_identity_cell(row["key"], v)))) for v in row["values"]]
        ident.append((Text(_cut(output.printable(row["key"]))), cells))
    section("run", ident, "(identity the same)")
    config = []
    for row in result["config"]:
        cells = [
            missing.copy() if i in row["missing"] else Text(_cut(output.printable(json_text(v))))
            for i, v in enumerate(row["values"])
        ]
        config.append((Text(_cut(output.printable(row["key"]))), cells))
    section("config", config, "(no config differences)")
    summary = []
    for row in result["summary"]:
        cells = []
        for i, v in enumerate(row["values"]):
            if i in row["missing"]:
                cells.append(missing.copy())
            elif i in row["best"]:
                cells.append(Text(_cut(output.printable(_number(v))) + " *", style="bold green"))
            else:
                cells.append(Text(_cut(output.printable(_number(v)))))
        key = row["metric"] + (f" ({row['goal']})" if row["goal"] else "")
        summary.append((Text(_cut(output.printable(key))), cells))
    summary_at = len(rows)
    section("summary", summary, "(no summary values)")

    # widths: what the content needs. When the runs do not fit beside each other, long
    # text (a path, a long config value) is cut first, down to a floor that keeps the run's
    # name, its summary values (numbers, best marks), its numbers and short values whole; runs that
    # still do not fit go to the next block below (each with the key column), so a column
    # is never squeezed to "0.…" or a header to "sweep/l…"
    need = [max(cell_len(k.plain) for k, _ in rows)]
    floor = []
    for i in range(n):
        cells = [cell_len(c[i].plain) for _, c in rows]
        need.append(max(cell_len(heads[i].plain), *cells))
        keep = [cell_len(c.plain) for c in (row[i] for _, row in rows[summary_at:])]
        short = [
            cell_len(c[i].plain)
            for _, c in rows
            if cell_len(c[i].plain) <= SHORT_CELL or _NUMBER.fullmatch(c[i].plain)
        ]
        floor.append(max(cell_len(heads[i].plain), *keep, *short))
    key_w = min(need[0], max(8, width // 3, width - 2 - min(max(need[1:]), MAX_CELL)))
    room = max(width - key_w - 2, 1)  # for the run columns beside the key, two cells apart
    blocks: list[list[int]] = [[]]
    used = 0
    for i in range(n):
        w = min(floor[i], room)
        if blocks[-1] and used + 2 + w > room + 2:
            blocks.append([])
            used = 0
        blocks[-1].append(i)
        used += w + 2
    widths = {}
    for block in blocks:  # from the floors, the narrowest column grows first up to its need
        cur = {i: min(floor[i], room) for i in block}
        spare = room + 2 - sum(w + 2 for w in cur.values())
        while spare > 0:
            grow = [i for i in block if cur[i] < min(need[i + 1], room)]
            if not grow:
                break
            j = min(grow, key=lambda i: cur[i])
            cur[j] += 1
            spare -= 1
        widths.update(cur)
    tables = []
    for block in blocks:
        table = Table(box=None, pad_edge=False, show_edge=False, show_header=True)
        table.add_column(Text("key", style="bold"), overflow="ellipsis", no_wrap=True, width=key_w)
        for i in block:
            table.add_column(heads[i], overflow="ellipsis", no_wrap=True, width=widths[i])
        for key, cells in rows:
            table.add_row(key, *(cells[i] for i in block))
        tables.append(table)
    if len(tables) == 1:
        return tables[0]
    from rich.console import Group

    parts: list[Any] = []
    for k, t in enumerate(tables):
        parts += [Text(""), t] if k else [t]
    return Group(*parts)
