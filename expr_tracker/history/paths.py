"""File names inside a run directory, rank detection, finding a run's history file, and
writing small files atomically.

Layout (docs/architecture.md "Files of a run"): ``<dir>/<project>/<name>/`` holds, per producer
(stream ``S`` and rank ``N`` suffixes, in that order)::

    metrics[.S][.rankN].jsonl        metrics[.S][.rankN].meta.json
    spans[.S][.rankN].jsonl          summary[.S][.rankN].json
    alerts[.S][.rankN].jsonl         run[.S][.rankN].json
    config[.S].json                  spec.json   (once per run)
    artifacts[.S][.rankN].jsonl      (artifacts logged and used: expr_tracker.artifacts)
    metric_defs[.S][.rankN].json     (define_metric: definitions and summary state)

The system sampler's producer is the stream ``system`` (``metrics.system[.rankN].jsonl``,
docs/system.md).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("expr_tracker")

STREAM_RE = re.compile(r"^[A-Za-z0-9_-]+$")
#: the longest stream et.init accepts (``spec.fields.MAX_STREAM_CHARS``: its files' names
#: must fit 255 bytes); a reader asked for a longer one says so, not "file name too long"
MAX_STREAM_CHARS = 64
#: stream names that would collide with a rank shard's file name (``metrics.rank1.jsonl``)
_RANK_LIKE = re.compile(r"^rank[0-9]+$", re.IGNORECASE)

#: the files of one producer; ``config`` has no rank suffix (one config per stream)
KINDS = {
    "metrics": "jsonl",
    "meta": "meta.json",
    "spans": "jsonl",
    "summary": "json",
    "alerts": "jsonl",
    "run": "json",
    "config": "json",
    "artifacts": "jsonl",
    "metric_defs": "json",
}


#: the folder of a run's query cache (derived Parquet parts, rebuilt from the JSONL when
#: missing: see expr_tracker.query.cache); copying or archiving a run may leave it out
QUERY_CACHE_DIR = ".et-cache"


def hostname() -> str:
    """This machine's name as ``socket.gethostname()`` gives it (the same ``uname`` field),
    without importing :mod:`socket` (a run's start has no other use for it)."""
    uname = getattr(os, "uname", None)
    if uname is None:  # not POSIX
        import socket

        return socket.gethostname()
    return str(uname().nodename)


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Replace ``path`` with ``data`` atomically (a temporary file beside it + ``os.replace``).

    The temporary name carries the pid and thread id, so processes and threads writing the
    same file (every rank writes ``config.json``) never share one. Raises ``OSError``.
    """
    import threading

    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def validate_stream(stream: str | None) -> str | None:
    """Return ``stream`` if it is a safe file-name part, else raise ``ValueError``.

    Valid: letters, digits, ``_`` and ``-`` (so a stream can never contain ``/``, ``..`` or
    a dot that would make file names ambiguous), at most :data:`MAX_STREAM_CHARS`, and not
    ``rank<N>`` (the rank suffix).
    """
    if stream is None:
        return None
    if not isinstance(stream, str) or not STREAM_RE.match(stream):
        raise ValueError(
            f"stream {stream!r} is not valid: use letters, digits, '_' and '-' only "
            "(a stream name becomes part of a file name inside the run directory)"
        )
    if len(stream) > MAX_STREAM_CHARS:
        raise ValueError(
            f"stream {stream[:40]!r}... is not valid: must be at most {MAX_STREAM_CHARS} "
            f"characters (this one has {len(stream)}), as et.init allows: no run has it"
        )
    if _RANK_LIKE.match(stream):
        raise ValueError(
            f"stream {stream!r} is not valid: it reads as a rank suffix "
            f"(metrics.{stream}.jsonl is a rank shard of the main stream); no stream has it"
        )
    return stream


def detect_rank(environ: Mapping[str, str] | None = None) -> int:
    """The process rank from ``RANK`` (else ``LOCAL_RANK``), 0 when unset or not an int."""
    env = os.environ if environ is None else environ
    for var in ("RANK", "LOCAL_RANK"):
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        try:
            return max(0, int(raw))
        except ValueError:
            log.warning("expr_tracker: ignoring %s=%r: not an integer", var, raw)
    return 0


def file_name(kind: str, stream: str | None = None, rank: int | None = None) -> str:
    """The file name of ``kind`` (a key of :data:`KINDS`) for a stream and rank.

    ``rank`` None or 0 adds no suffix. ``config`` never takes a rank suffix.
    """
    stem = "metrics" if kind == "meta" else kind
    parts = [stem]
    if stream:
        parts.append(stream)
    if rank and kind != "config":
        parts.append(f"rank{rank}")
    return ".".join(parts) + "." + KINDS[kind]


_METRICS_RE = re.compile(r"^metrics(?:\.([A-Za-z0-9_-]+?))??(?:\.rank(\d+))?\.jsonl$")


def parse_metrics_name(name: str) -> tuple[str | None, int] | None:
    """``metrics.data.rank2.jsonl`` -> ``("data", 2)``; None when not a metrics file."""
    m = _METRICS_RE.match(name)
    if not m:
        return None
    return m.group(1), int(m.group(2) or 0)


#: a producer's metrics or span file: the stream is group 1
_PRODUCER_RE = re.compile(r"^(?:metrics|spans)(?:\.([A-Za-z0-9_-]+?))??(?:\.rank(\d+))?\.jsonl$")


def list_streams(run_dir: str | os.PathLike[str]) -> list[str | None]:
    """The streams of a run directory: None (the main stream) first when it has files,
    then the named streams in order: ``[None, "data", "system"]``. Each value goes back as
    ``stream=`` to ``read_history``, ``et.history(run=...)`` and
    ``expr_tracker.trace.read_spans`` (docs/streams.md "Reading streams").

    A stream is listed when it has a metrics or span file (any rank) that is a regular
    file inside ``run_dir``; the folder is untrusted (docs/query.md "Security"): nothing
    is opened, a link pointing out of the folder or a FIFO named like a metrics file does
    not count.

    Raises:
        FileNotFoundError: ``run_dir`` is not a directory.
    """
    from expr_tracker.history.untrusted import inside

    p = Path(run_dir)
    if not p.is_dir():
        raise FileNotFoundError(f"no run directory at {str(p)!r}")
    found: set[str | None] = set()
    with os.scandir(p) as entries:
        for entry in entries:
            m = _PRODUCER_RE.match(entry.name)
            if m is None or m.group(1) in found:
                continue
            try:
                if not entry.is_file() or (entry.is_symlink() and not inside(entry.path, p)):
                    continue
            except OSError:
                continue
            found.add(m.group(1))
    return ([None] if None in found else []) + sorted(s for s in found if s is not None)


def resolve_run_path(
    path: str | os.PathLike[str], stream: str | None = None, rank: int | None = None
) -> Path:
    """The metrics file a run path names.

    ``path`` may be a metrics file itself or a run directory; from a directory the file is
    chosen by exact name (``metrics[.stream][.rankN].jsonl``), never by the first glob hit
    (``metrics.data.jsonl`` sorts before ``metrics.jsonl``); ``rank`` N > 0 names the shard
    ``metrics[.stream].rankN.jsonl``. When rank shards exist beside the chosen file an info
    line says which one was taken (the CLI prints it: :func:`rank_shards`).

    Raises ``FileNotFoundError`` naming the file looked for and the files that exist — and,
    when the directory holds only rank shards of that stream, the ranks and ``rank=N`` — or
    saying that what has the name is not a regular file (a FIFO, a device or a socket: no
    reader opens one, docs/history.md "Unreadable runs").
    """
    p = Path(path)
    if p.is_file():
        return p
    if not p.is_dir():
        kind = _special_kind(p)
        if kind:
            raise FileNotFoundError(f"{str(p)!r} is {kind}, not a regular file")
        raise FileNotFoundError(f"no run at {str(p)!r}: not a file or directory")
    validate_stream(stream)
    want = p / file_name("metrics", stream, rank)
    present = sorted(q.name for q in p.glob("metrics*.jsonl"))
    kind = _special_kind(want)
    if kind:
        raise FileNotFoundError(f"{want.name} in {str(p)!r} is {kind}, not a regular file")
    if want.is_file():
        shards = rank_shards(p, stream) if not rank else {}
        if shards:
            log.info(
                "expr_tracker: %s has rank shards (%s); reading %s — read a shard by its "
                "path, with resolve_run_path(..., rank=N) or with et history --rank N",
                p,
                ", ".join(shards.values()),
                want.name,
            )
        return want
    hint = f"; files here: {', '.join(present)}" if present else "; the directory has none"
    shards = rank_shards(p, stream)
    if shards:
        has_main = (p / file_name("metrics", stream)).is_file()
        ranks = ", ".join(str(r) for r in ([0] if has_main else []) + list(shards))
        first = next(iter(shards))
        hint += (
            f"; {'ranks' if has_main else 'only rank shards'} of this "
            f"{'stream' if stream else 'run'}: {ranks} — read one with rank={first} "
            f"(et history --rank {first}) or by its path"
        )
    raise FileNotFoundError(f"no {want.name} in {str(p)!r}{hint}")


def _special_kind(p: Path) -> str | None:
    """``"a FIFO"``, ``"a socket"``, ``"a device"`` for such a file at ``p`` (followed
    links); None for anything else, or nothing."""
    import stat

    try:
        mode = p.stat().st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return None


def rank_shards(run_dir: str | os.PathLike[str], stream: str | None = None) -> dict[int, str]:
    """The rank shards (rank > 0) of ``stream`` in a run directory: ``{rank: file name}``,
    by rank (``metrics[.stream].rank1.jsonl`` -> ``{1: ...}``)."""
    found: dict[int, str] = {}
    for q in Path(run_dir).glob("metrics*.jsonl"):
        parsed = parse_metrics_name(q.name)
        if parsed is not None and parsed[0] == stream and parsed[1] > 0:
            found[parsed[1]] = q.name
    return dict(sorted(found.items()))
