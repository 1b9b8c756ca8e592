"""The wandb mirror: one wandb run per stream and rank of an expr_tracker run.

``wandb`` is imported on the mirror's thread, when the backend starts; a missing package is
a :class:`BackendUnavailable` (one warning naming ``pip install 'expr-tracker[wandb]'``).

What it does with each call (docs/mirrors.md):

- ``init``: ``wandb.init(project=, name=, group=<run name>, id=<stable id>,
  resume="allow", reinit="create_new", config=, tags=, notes=, entity=, job_type= (when
  the run has them), dir=<run directory>
  unless ``WANDB_DIR`` or a ``dir`` keyword says otherwise, settings={"console": "off"})``,
  with the spec's ``backend_kwargs.wandb`` (and a ``{type: wandb, ...}`` entry's keys) over
  these. ``reinit="create_new"`` leaves the user's own ``wandb.run`` alone.
- ``log``: ``run.log(metrics, step=<_step>, commit=True)``: our step is wandb's step; media
  references become ``wandb.Image(path)``, ``wandb.Histogram(np_histogram=(values, bins))``
  and ``wandb.Table(columns, data)`` (``backends/mediaconv.py``).
- events: ``config`` -> ``run.config.update(allow_val_change=True)``; ``summary`` ->
  ``run.summary.update`` (the final summary without the metrics wandb was logged: it
  summarises those itself, honouring the mirrored ``define_metric``); ``define_metric`` -> ``run.define_metric`` (name, step_metric,
  summary, hidden: wandb 0.31 takes no ``goal``); ``artifact`` -> a
  wandb ``Artifact`` holding ``file://`` references to the version directory (checksummed,
  never copied), logged with its aliases, or used (online only: wandb records no use of an
  artifact in offline mode, so a use is not mirrored there).
- ``finish``: ``run.finish(exit_code=)``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any

from expr_tracker.backends.mediaconv import MediaConverter
from expr_tracker.backends.mirror import BackendUnavailable

__all__ = ["WandbBackend"]

_ARTIFACT_NAME = re.compile(r"[^A-Za-z0-9_.\-]")


def _one_traceback(before: Any) -> None:
    """The first ``wandb.init`` of a process wraps ``sys.excepthook`` in one that prints the
    traceback, then calls the hook it replaced (ours, which prints it again): keep wandb's
    record of the exit code (its service teardown reads it), drop its second print."""
    hooks = getattr(sys.excepthook, "__self__", None)
    if (
        before is sys.__excepthook__
        or getattr(hooks, "_orig_excepthook", None) is not before
        or not hasattr(hooks, "exit_code")
    ):
        return

    def excepthook(etype: Any, value: Any, tb: Any) -> None:
        hooks.exit_code = 255 if issubclass(etype, KeyboardInterrupt) else 1
        hooks.exception = value
        before(etype, value, tb)

    sys.excepthook = excepthook


class WandbBackend:
    """The built-in ``wandb`` backend (see the module docstring).

    Args:
        kwargs: ``wandb.init`` keywords from the spec (``backend_kwargs.wandb`` merged with
            the entry's own keys); they win over the ones derived from the run.
    """

    name = "wandb"

    def __init__(self, kwargs: dict[str, Any] | None = None) -> None:
        self.kwargs = dict(kwargs or {})
        self.run: Any = None
        self._wandb: Any = None
        self._logged: set[str] = set()  # metric names wandb summarises itself
        self._media: MediaConverter | None = None

    def init(self, **info: Any) -> None:
        try:
            import wandb
        except ImportError:
            raise BackendUnavailable("wandb", "wandb") from None
        self._wandb = wandb
        self._media = MediaConverter(
            wandb, info["run_dir"], logging.getLogger("expr_tracker").warning, "wandb"
        )
        kw: dict[str, Any] = {
            "project": info["project"],
            "name": info["name"],
            "group": info["group"],
            "id": info["id"],
            "resume": "allow",
            "reinit": "create_new",
            "config": info.get("config") or {},
            "tags": list(info.get("tags") or []) or None,
            "notes": info.get("notes"),
            "settings": {"console": "off"},
        }
        for key in ("entity", "job_type"):  # et.init(entity=, job_type=) as wandb takes them
            if info.get(key) is not None:
                kw[key] = info[key]
        if not os.environ.get("WANDB_DIR") and "dir" not in self.kwargs:
            kw["dir"] = info["run_dir"]
        user = dict(self.kwargs)
        settings = user.pop("settings", None)
        if isinstance(settings, dict):
            kw["settings"] = {**kw["settings"], **settings}
        elif settings is not None:
            kw["settings"] = settings
        kw.update(user)
        before = sys.excepthook
        self.run = wandb.init(**kw)
        _one_traceback(before)

    def log(self, metrics: dict[str, Any], step: int, commit: bool = True) -> None:
        if self._media is not None:
            metrics = self._media.row(metrics)
        self._logged.update(metrics)
        self.run.log(metrics, step=step, commit=commit)

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        run = self.run
        if event == "config":
            run.config.update(payload.get("changes") or {}, allow_val_change=True)
        elif event == "summary":
            changes = payload.get("changes") or {}
            if payload.get("final"):
                # wandb keeps the last value (or the define_metric aggregate) of what it was
                # logged itself; overwriting those would replace its {"max": ...} summaries
                changes = {k: v for k, v in changes.items() if k not in self._logged}
            if changes:
                run.summary.update(changes)
        elif event == "define_metric":
            # wandb 0.31's define_metric has no ``goal`` (it is not mirrored)
            kw = {
                k: payload[k]
                for k in ("step_metric", "summary", "hidden")
                if payload.get(k) is not None
            }
            run.define_metric(payload["name"], **kw)
        elif event == "artifact":
            self._artifact(payload)

    def _artifact(self, payload: dict[str, Any]) -> None:
        wandb = self._wandb
        metadata = dict(payload.get("metadata") or {})
        metadata.setdefault("expr_tracker_version", payload.get("version"))
        metadata.setdefault("expr_tracker_digest", payload.get("digest"))
        art = wandb.Artifact(
            _ARTIFACT_NAME.sub("-", str(payload["name"])),
            type=str(payload.get("type") or "dataset"),
            metadata=metadata,
        )
        path = payload.get("path")
        if path:
            art.add_reference("file://" + os.path.abspath(str(path)), checksum=True)
        if payload.get("action") == "used":
            if getattr(self.run, "offline", False):
                return  # wandb cannot record a use offline ("Cannot use artifact when in offline mode")
            self.run.use_artifact(art)
        else:
            self.run.log_artifact(art, aliases=list(payload.get("aliases") or []) or None)

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
