"""The rows a metrics JSONL should give in the query cache's LONG layout, decoded by the
standard json module (which keeps ints beyond 64 bits exact): the model the cache tests
compare the Parquet parts against."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def long_value(v: Any) -> tuple[float | None, str | None]:
    """``(value, text)`` of one logged value, as the cache stores it."""
    if isinstance(v, bool):
        return float(v), None
    if isinstance(v, float):
        return v, None
    if isinstance(v, int):
        return float(v), (None if int(float(v)) == v else str(v))
    if isinstance(v, str):
        return None, v
    return None, json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def step_of(v: Any) -> int | None:
    """``_step`` as the cache stores it: an int in [0, 2**63-1], else NULL (no step)."""
    return v if type(v) is int and 0 <= v < 2**63 else None


def long_metric_rows(path: Path, *, skip_bad: bool = False) -> list[dict[str, Any]]:
    """One dict (step, time, metric, value, text, line) per metric of every complete line of
    ``path``, in file order; ``skip_bad`` leaves out lines that are not JSON objects."""
    out = []
    for i, raw in enumerate(Path(path).read_bytes().split(b"\n")[:-1]):  # complete lines
        try:
            d = json.loads(raw)
        except ValueError:
            if skip_bad:
                continue
            raise
        if not isinstance(d, dict):
            if skip_bad:
                continue
            raise ValueError(f"line {i} is not an object")
        for k, v in d.items():
            if k.startswith("_"):
                continue
            val, text = long_value(v)
            out.append(
                {
                    "step": step_of(d.get("_step")),
                    "time": d.get("_time"),
                    "metric": k,
                    "value": val,
                    "text": text,
                    "line": i,
                }
            )
    return out


def long_metric_keys(path: Path, *, skip_bad: bool = False) -> list[tuple]:
    """:func:`long_metric_rows` as sorted ``(line, metric, value bits or None, text, step)``
    tuples (``float.hex`` of the value: NaN and ±0.0 compare exactly), what a cache's parts
    are compared with."""
    return sorted(
        (
            r["line"],
            r["metric"],
            None if r["value"] is None else r["value"].hex(),
            r["text"],
            r["step"],
        )
        for r in long_metric_rows(path, skip_bad=skip_bad)
    )
