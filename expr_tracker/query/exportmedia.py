"""The media files of an export (``et export``, docs/media.md "Exporting").

Rows hold references like ``{"_type": "image", "path": "media/<sha256>.png", ...}`` (and
``histogram`` references to ``media/<sha256>.npz``, ``table`` references to
``media/<sha256>.parquet``, or ``.table.json`` in older runs), relative to the run
directory; a histogram of an older run holds its counts in the row and has no file. An
export copies each referenced file once into a media folder beside its output:

- one file ``out.parquet``: ``media/`` next to it, so the references keep their
  ``media/<sha256>.<ext>`` form, now relative to the output's folder;
- a partitioned export ``PATH/``: ``PATH/_media/`` (engines and pyarrow's datasets skip names
  starting with ``_``), the references rewritten to ``_media/<sha256>.<ext>``, relative to
  ``PATH``;
- ``media_dir=``: that folder, the references rewritten to its path relative to the
  output's folder (one file) or to ``PATH`` (partitioned).

Sources are read as every media reader reads them (:func:`expr_tracker.media.read_media`: a
name ``media/<64 hex>.<ext>``, a regular file inside the run's media folder, its SHA-256 its
name); a reference whose name or file fails that is left as it is in the row, not copied,
counted in ``refused`` and named in one warning. A table's image and histogram cells are
copied too (the table file itself is copied unchanged: its name is its hash, and its cells'
``media/...`` paths resolve against the media folder's parent, as in a run). Each file is written to a
temporary name and renamed; files this export created are removed again when it fails.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["MEDIA_FOLDER", "MediaCopier", "is_media_name", "prefix_for"]

#: the media folder of a partitioned export (inside it)
MEDIA_FOLDER = "_media"

log = logging.getLogger("expr_tracker")

_REF_TYPES = ("image", "histogram", "table")
# a reference's path inside the compact JSON text of a cell (our codec writes no spaces);
# RE2 syntax (pyarrow.compute)
_PATH_RE = r'("path":")media/([0-9a-f]{64}\.(?:png|jpg|gif|npz|parquet|table\.json)")'


class MediaCopier:
    """Collects the media references of exported rows and copies their files.

    Args:
        dest: the media folder to fill (made when the first file is copied).
        prefix: the path the references get instead of ``media/`` (``"media/"``: unchanged).
        identity: names of the columns that are not metrics (never scanned).
    """

    def __init__(self, dest: Path, prefix: str, identity: set[str]) -> None:
        self.dest = dest
        self.prefix = prefix
        self.identity = identity
        self.wanted: dict[str, Path] = {}  # "media/<sha>.<ext>" -> the run dir holding it
        self.refused: list[str] = []
        self.created: list[Path] = []
        self.files = 0
        self.bytes = 0

    # -- while the rows stream --------------------------------------------------------------

    def batches(self, run_dir: Path, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches`` (pyarrow record batches of one run), their references collected and,
        when the prefix is not ``media/``, rewritten."""
        import pyarrow as pa
        import pyarrow.compute as pc

        repl = None
        if self.prefix != "media/":
            # the prefix as JSON string content, escaped for RE2's replacement (\1, \2)
            text = json.dumps(self.prefix)[1:-1].replace("\\", "\\\\")
            repl = r"\1" + text + r"\2"
        for b in batches:
            cols = list(b.columns)
            changed = False
            for i, field in enumerate(b.schema):
                if field.name in self.identity or not pa.types.is_string(field.type):
                    continue
                col = b.column(i)
                hit = pc.fill_null(pc.match_substring(col, '"_type":"'), False)
                if not pc.any(hit).as_py():
                    continue
                for cell in pc.filter(col, hit).to_pylist():
                    self._collect(run_dir, cell)
                if repl is not None:
                    cols[i] = pc.replace_substring_regex(col, _PATH_RE, repl)
                    changed = True
            yield pa.RecordBatch.from_arrays(cols, schema=b.schema) if changed else b

    def _collect(self, run_dir: Path, cell: str) -> None:
        try:
            value = json.loads(cell)
        except ValueError:
            return  # a string that is not JSON: not a reference
        for ref in _refs(value):
            self._want(run_dir, ref.get("path"))

    def _want(self, run_dir: Path, rel: Any) -> None:
        from expr_tracker.media import media_path

        try:
            media_path(run_dir, rel)
        except ValueError:
            self.refused.append(f"{str(rel)[:80]!r} (not media/<sha256>.<ext>)")
            return
        self.wanted.setdefault(rel, run_dir)

    # -- before the output is renamed into place ---------------------------------------------

    def copy(self) -> None:
        """Copy every collected file (and a table's image cells) into ``dest``.

        Raises: OSError when the destination cannot be written (a source that cannot be
        read or verified is refused, not raised)."""
        from expr_tracker.media import load_table, read_media

        done: set[str] = set()
        todo = list(self.wanted.items())
        while todo:
            rel, run_dir = todo.pop()
            if rel in done:
                continue
            done.add(rel)
            try:
                data = read_media(run_dir, rel)[0]
            except (OSError, ValueError) as exc:
                self.refused.append(f"{run_dir}/{rel} ({exc})")
                continue
            if rel.endswith((".parquet", ".table.json")):
                try:
                    table = load_table(run_dir, rel, output_type="dict")
                except (OSError, ValueError, ImportError):
                    table = None  # copied all the same: a reader says what is wrong with it
                for ref in _refs(table.get("data") if isinstance(table, dict) else None):
                    before = len(self.wanted)
                    self._want(run_dir, ref.get("path"))
                    if len(self.wanted) > before:
                        todo.append((ref["path"], run_dir))
            self._put(rel.split("/", 1)[1], data)
        if self.refused:
            shown = "; ".join(self.refused[:5])
            more = f" and {len(self.refused) - 5} more" if len(self.refused) > 5 else ""
            log.warning(
                "expr_tracker: %d media reference(s) not copied by the export, left as they "
                "are in the rows: %s%s",
                len(self.refused),
                shown,
                more,
            )

    def _put(self, name: str, data: bytes) -> None:
        target = self.dest / name
        if target.is_file() and not target.is_symlink():
            with open(target, "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() == name.split(".", 1)[0]:
                    return  # the same content is already there (an earlier export)
        self.dest.mkdir(parents=True, exist_ok=True)
        tmp = self.dest / f".{name}.{os.getpid()}.partial"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.created.append(target)
        self.files += 1
        self.bytes += len(data)

    def abort(self) -> None:
        """Remove the files this export created (the export failed)."""
        for p in self.created:
            p.unlink(missing_ok=True)
        self.created.clear()

    def summary(self) -> dict[str, Any]:
        """``{"dir", "files", "bytes", "refused"}``: files and bytes copied by this export
        (files already there with the same content are not counted), references refused."""
        return {
            "dir": str(self.dest),
            "files": self.files,
            "bytes": self.bytes,
            "refused": len(self.refused),
        }


def _refs(value: Any) -> Iterator[dict[str, Any]]:
    """The image and table references in a decoded cell (a reference, a gallery list, a
    table's rows), at most two levels deep."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            if v.get("_type") in _REF_TYPES and "path" in v:
                yield v
        elif isinstance(v, list) and depth < 2:
            stack.extend((x, depth + 1) for x in v)


def prefix_for(media_dir: Path, base: Path) -> str:
    """The path references get for files in ``media_dir``, relative to ``base`` (POSIX
    separators, ending in ``/``)."""
    rel = os.path.relpath(media_dir.resolve(), base.resolve())
    return Path(rel).as_posix().rstrip("/") + "/"


def is_media_name(name: str) -> bool:
    """Whether ``name`` is a media file's name, ``<sha256>.<png|jpg|gif|npz|parquet|table.json>``."""
    from expr_tracker.media import media_path

    try:
        media_path(".", "media/" + name)
    except ValueError:
        return False
    return True
