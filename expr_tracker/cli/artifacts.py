"""``et artifacts``: the versioned files of a project (docs/artifacts.md).

    et artifacts list [PROJECT_DIR] [--format table|json|jsonl]
    et artifacts show NAME[:VERSION] [--project-dir DIR] [--format text|json|jsonl]

PROJECT_DIR is a project directory (``<dir>/<project>``, holding ``artifacts/``), the
``artifacts/`` directory itself, or a directory of projects (default ``./runs``: every
project under it). ``list`` prints one line per artifact: its project, name, number of
versions, latest version, type, size of the latest version and aliases. ``show`` prints one
version (default ``latest``; ``:v3`` or ``:<alias>``): the manifest, its files and
references, and its lineage — which runs logged and used it, at which step — read from the
runs' ``artifacts*.jsonl`` in the project.

Exit codes: 0 ok (``list`` with no artifacts prints ``no artifacts under DIR``, ``[]`` for
json); 1 no such directory, artifact, version or alias; 2 usage error (a bad name, or an
artifact found in several projects without ``--project-dir``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import IO, Any

from expr_tracker.cli import output


def register(subparsers: Any) -> None:
    """Add the ``artifacts`` sub-command to ``subparsers`` (sets ``func``)."""
    p = subparsers.add_parser(
        "artifacts",
        help="list a project's artifacts, show one version with its files and lineage",
        description="Versioned files stored per project by et.log_artifact.",
    )
    sub = p.add_subparsers(dest="artifacts_command", metavar="ACTION")
    ls = sub.add_parser("list", help="one line per artifact of a project (or of every project)")
    ls.add_argument(
        "project_dir",
        nargs="?",
        default="runs",
        metavar="PROJECT_DIR",
        help="a project directory, its artifacts/ directory, or a directory of projects "
        "(default ./runs)",
    )
    output.add_format_option(ls, "table", what="artifacts")
    ls.set_defaults(func=run_list)
    show = sub.add_parser("show", help="one version: manifest, files, lineage")
    show.add_argument("ref", metavar="NAME[:VERSION]", help="name, name:v3 or name:<alias>")
    show.add_argument(
        "--project-dir",
        default="runs",
        metavar="DIR",
        help="the project (or a directory of projects; default ./runs)",
    )
    output.add_format_option(show, "text", what="versions")
    show.set_defaults(func=run_show)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def find_stores(root: str | Path) -> list[tuple[str, Any]]:
    """(project name, ArtifactStore) for ``root``: a project directory, its ``artifacts``
    directory, or a directory whose sub-directories are projects. Sorted by project."""
    from expr_tracker.artifacts import ArtifactStore
    from expr_tracker.artifacts.store import INDEX
    from expr_tracker.history.untrusted import present

    # present(): a store of someone else's that cannot be looked into is found, and its
    # listing reports why, instead of ending the command (pathlib's is_file() raised)
    root = Path(root)
    if present(root / INDEX) and root.name == "artifacts":
        return [(root.absolute().parent.name, ArtifactStore(root))]
    if present(root / "artifacts" / INDEX):
        return [(root.absolute().name, ArtifactStore(root / "artifacts"))]
    found = []
    for child in sorted(root.iterdir()) if os.path.isdir(root) else ():
        if os.path.isdir(child) and present(child / "artifacts" / INDEX):
            found.append((child.name, ArtifactStore(child / "artifacts")))
    return found


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1024
    return ""  # pragma: no cover


def list_records(root: str | Path, problems: list[str] | None = None) -> list[dict[str, Any]]:
    """One record per artifact under ``root`` (see :func:`find_stores`): project, name,
    versions, latest, type, size (bytes of the latest), aliases (alias -> version),
    created_at (of the latest). A store whose index cannot be read is left out and one line
    saying why goes to ``problems`` (when given), as does a count of bad index lines."""
    from expr_tracker.artifacts import ArtifactError

    out = []
    for project, store in find_stores(root):
        try:
            catalog = store.catalog()
        except ArtifactError as exc:
            if problems is not None:
                problems.append(str(exc))
            continue
        if store.skipped and problems is not None:
            problems.append(f"{store.root / 'index.jsonl'}: {store.skipped} bad line(s) skipped")
        for name, item in catalog.items():
            latest = max(item["versions"])
            rec = item["versions"][latest]
            out.append(
                {
                    "project": project,
                    "name": name,
                    "versions": len(item["versions"]),
                    "latest": latest,
                    "type": rec.get("type"),
                    "size": rec.get("size"),
                    "aliases": dict(sorted(item["aliases"].items())),
                    "created_at": rec.get("created_at"),
                    "path": str(store.root / name),
                }
            )
    return out


def run_list(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """``et artifacts list``; returns the exit code."""
    from rich.table import Table

    from expr_tracker.cli.history import table_width

    out = out or sys.stdout
    root = Path(args.project_dir)
    if not root.is_dir():
        sys.stderr.write(f"et artifacts list: {str(root)!r} is not a directory\n")
        return 1
    problems: list[str] = []
    records = list_records(root, problems)
    _warn("list", problems)
    if output.is_machine(args.format):
        output.write_records(records, args.format, out)
        return 0
    console = output.console(out, table_width(out))
    if not records:
        console.print(f"no artifacts under {_text(str(root))}", markup=False)
        return 0
    table = Table(box=None, header_style="bold", pad_edge=False)
    several = len({r["project"] for r in records}) > 1
    if several:
        table.add_column("project", overflow="fold")
    table.add_column("name", overflow="fold")
    table.add_column("versions", justify="right", no_wrap=True)
    table.add_column("latest", no_wrap=True)
    table.add_column("type", overflow="fold")
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("aliases", overflow="fold")
    for r in records:
        cells = [
            r["name"],
            str(r["versions"]),
            f"v{r['latest']}",
            r["type"] or "",
            _size(r["size"]),
            ", ".join(f"{a}→v{v}" for a, v in r["aliases"].items()),
        ]
        table.add_row(*map(_text, [*([r["project"]] if several else []), *cells]))
    console.print(table, markup=False)
    return 0


def _warn(command: str, problems: list[str]) -> None:
    """One stderr line per problem (a store or lineage file left out, bad lines skipped),
    escaped for the terminal."""
    for p in problems:
        sys.stderr.write(f"et artifacts {command}: warning: {output.printable(p)}\n")


def lineage_of(
    project_dir: Path, name: str, version: int | None = None, problems: list[str] | None = None
) -> list[dict[str, Any]]:
    """The lineage lines of artifact ``name`` (of ``version`` when given) in every run of a
    project: each with ``run`` (the run directory's name) added, ordered by time. Lineage
    files that cannot be read, and bad lines, are skipped and named in ``problems``."""
    from expr_tracker.artifacts import read_lineage

    out = []
    try:
        children = sorted(p for p in project_dir.iterdir() if p.is_dir())
    except OSError:
        return []
    for run_dir in children:
        if run_dir.name == "artifacts" or run_dir.name.startswith("."):
            continue
        for rec in read_lineage(run_dir, problems):
            if rec.get("name") != name:
                continue
            if version is not None and rec.get("version") != version:
                continue
            out.append({"run": run_dir.name, **rec})
    out.sort(key=_time_key)
    return out


def _time_key(rec: dict[str, Any]) -> float:
    t = rec.get("time")
    if type(t) is int or type(t) is float:
        return float(t) if t == t else 0.0  # NaN never breaks the sort
    return 0.0


def run_show(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """``et artifacts show``; returns the exit code."""
    from expr_tracker.artifacts import ArtifactError, ArtifactNameError
    from expr_tracker.artifacts.names import parse_ref

    out = out or sys.stdout
    try:
        name, selector = parse_ref(args.ref)
    except ArtifactNameError as exc:
        sys.stderr.write(f"et artifacts show: {exc}\n")
        return 2
    root = Path(args.project_dir)
    if not root.is_dir():
        sys.stderr.write(f"et artifacts show: {str(root)!r} is not a directory\n")
        return 1
    stores = find_stores(root)
    problems: list[str] = []
    holding = []
    for p, s in stores:
        try:
            if name in s.catalog():
                holding.append((p, s))
        except ArtifactError as exc:
            problems.append(str(exc))
            continue
        if s.skipped:
            problems.append(f"{s.root / 'index.jsonl'}: {s.skipped} bad line(s) skipped")
    _warn("show", problems)
    if len(holding) > 1:
        projects = ", ".join(p for p, _ in holding)
        sys.stderr.write(
            f"et artifacts show: {name!r} is in several projects ({projects}); pass "
            f"--project-dir {root}/<project>\n"
        )
        return 2
    if not holding:
        where = ", ".join(p for p, _ in stores) or "none"
        sys.stderr.write(
            f"et artifacts show: no artifact {name!r} under {root} (projects with "
            f"artifacts: {where})\n"
        )
        return 1
    project, store = holding[0]
    try:
        version = store.get(name, selector)
    except ArtifactError as exc:
        sys.stderr.write(f"et artifacts show: {output.printable(str(exc))}\n")
        return 1
    problems = []
    lineage = lineage_of(store.root.parent, name, version.version, problems)
    _warn("show", problems)
    manifest = version.manifest
    doc = {
        "project": project,
        **version.to_dict(),
        "description": version.description,
        "mode": manifest.get("mode"),
        "files": manifest.get("files", []),
        "references": manifest.get("references", []),
        "lineage": lineage,
    }
    if output.is_machine(args.format):
        output.write_object(doc, args.format, out)
        return 0
    _print_show(doc, out)
    return 0


#: files (and references) the text of `et artifacts show` lists; json and jsonl list all
SHOW_FILES = 200


def _when(t: Any) -> str:
    if type(t) is not float:
        return ""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):  # a time from a hand-edited file
        return ""


def _text(value: Any) -> str:
    """A cell for the terminal: any value as text, control characters escaped (a name or
    a value read from someone's store cannot move the cursor or write the clipboard)."""
    return output.printable(value if isinstance(value, str) else str(value))


def _print_show(doc: dict[str, Any], out: IO[str]) -> None:
    from rich.table import Table

    from expr_tracker.cli.history import table_width
    from expr_tracker.history.values import format_value

    console = output.console(out, table_width(out))
    run = doc.get("run") or {}
    head = [
        ("artifact", f"{doc['name']}:v{doc['version']}  ({doc['project']})"),
        ("type", doc["type"]),
        ("aliases", ", ".join(doc["aliases"])),
        ("digest", doc["digest"]),
        ("size", f"{_size(doc['size'])} in {len(doc['files'])} files"),
        ("created", _when(doc["created_at"])),
        ("logged by", f"{run.get('project', '')}/{run.get('name', '')}" if run else ""),
        ("path", doc["path"]),
    ]
    if doc.get("description"):
        head.append(("description", doc["description"]))
    for k, v in doc["metadata"].items():
        head.append((f"metadata.{k}", format_value(v, "cell")))
    width = max(len(_text(k)) for k, _ in head) + 2
    for k, v in head:
        console.print(f"{_text(k) + ':':<{width}}{_text(v)}", markup=False, highlight=False)
    files = Table(box=None, header_style="bold", pad_edge=False, title_justify="left")
    files.add_column("file", overflow="fold")
    files.add_column("size", justify="right", no_wrap=True)
    files.add_column("sha256", no_wrap=True)
    files.add_column("stored", no_wrap=True)
    rows = [
        (f["name"], _size(f["size"]), f["sha256"][:16], f.get("stored") or "") for f in doc["files"]
    ]
    rows += [(r["name"], "", "", f"reference {r['uri']}") for r in doc["references"]]
    for row in rows[:SHOW_FILES]:
        files.add_row(*map(_text, row))
    console.print()
    console.print(files, markup=False)
    if len(rows) > SHOW_FILES:  # a dataset of a million files: a table of them helps no one
        console.print(
            f"... and {len(rows) - SHOW_FILES} more (--format json lists them all)",
            markup=False,
            highlight=False,
        )
    console.print()
    if not doc["lineage"]:
        console.print("lineage: no run recorded logging or using it", markup=False)
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("run", overflow="fold")
    table.add_column("producer", no_wrap=True)
    table.add_column("action", no_wrap=True)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("time", no_wrap=True)
    for rec in doc["lineage"]:
        producer = "/".join(
            x for x in (rec.get("stream"), f"rank{rec['rank']}" if rec.get("rank") else None) if x
        )
        action = rec.get("action", "")
        if action == "logged" and rec.get("new") is False:
            action = "logged (same content)"
        table.add_row(
            _text(rec["run"]),
            _text(producer or "main"),
            _text(action),
            "" if rec.get("step") is None else str(rec["step"]),
            _when(rec.get("time")),
        )
    console.print(table, markup=False)
