"""The trackio mirror: one trackio run per stream and rank of an expr_tracker run.

``trackio`` is imported on the mirror's thread, when the backend starts; a missing package
is a :class:`BackendUnavailable` (one warning naming ``pip install 'expr-tracker[trackio]'``).

- ``init``: imports trackio; ``trackio.init(project=, name=, group=<run name>, config=,
  resume="allow", embed=False, auto_log_cpu=False, auto_log_gpu=False)`` (with
  ``backend_kwargs.trackio`` over these) is called with the first row (or at finish), so
  config changes made before it are part of the run's config. A failing ``trackio.init``
  turns the mirror off (one warning). trackio keeps its current run in a ``ContextVar``; the mirror's thread has a
  context of its own, so the user's own ``trackio`` run (on their thread) is left alone.
  trackio reserves config keys starting with ``_``: those keys are not mirrored (they stay
  in ``config.json``).
- ``log``: ``run.log(metrics, step=<_step>)``; media references become ``trackio.Image(path)``,
  ``trackio.Histogram(np_histogram=(values, bins))`` and ``trackio.Table(columns, data)``
  (``backends/mediaconv.py``; a type the installed trackio lacks: the key is left out, one
  warning).
- events: ``config`` updates the trackio run's config; after the first row, the change is
  sent with the next row (trackio stores a run's config with a logged row, and keeps the
  first config of rows it writes together: a change within the second of an earlier
  config write can be missed there; ``config.json`` has it). ``summary``, ``define_metric`` and ``artifact``
  are not mirrored: trackio 0.43 derives summaries from the history itself, has no
  ``define_metric``, and its artifacts are copies into its own store (ours are already
  versioned next to the runs; copying them again would double the disk use).
- ``finish``: ``run.finish()`` (trackio records no exit code).
"""

from __future__ import annotations

import logging
from typing import Any

from expr_tracker.backends.mediaconv import MediaConverter
from expr_tracker.backends.mirror import BackendOff, BackendUnavailable

__all__ = ["TrackioBackend"]


def _public(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if not str(k).startswith("_")}


class TrackioBackend:
    """The built-in ``trackio`` backend (see the module docstring).

    Args:
        kwargs: ``trackio.init`` keywords from the spec; they win over the derived ones.
    """

    name = "trackio"

    def __init__(self, kwargs: dict[str, Any] | None = None) -> None:
        self.kwargs = dict(kwargs or {})
        self.run: Any = None
        self._trackio: Any = None
        self._init_kwargs: dict[str, Any] = {}
        self._media: MediaConverter | None = None

    def init(self, **info: Any) -> None:
        try:
            import trackio
        except ImportError:
            raise BackendUnavailable("trackio", "trackio") from None
        self._trackio = trackio
        self._media = MediaConverter(
            trackio, info["run_dir"], logging.getLogger("expr_tracker").warning, "trackio"
        )
        kw: dict[str, Any] = {
            "project": info["project"],
            "name": info["name"],
            "group": info["group"],
            "config": _public(info.get("config") or {}),
            "resume": "allow",
            "embed": False,
            "auto_log_cpu": False,
            "auto_log_gpu": False,
        }
        kw.update(self.kwargs)
        self._init_kwargs = kw

    def _start(self) -> Any:
        if self.run is None:
            try:
                self.run = self._trackio.init(**self._init_kwargs)
            except Exception as exc:  # noqa: BLE001
                raise BackendOff(f"trackio.init failed ({type(exc).__name__}: {exc})") from exc
        return self.run

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self._media is not None:
            metrics = self._media.row(metrics)
        self._start().log(metrics, step=step)

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        if event != "config":
            return
        changes = _public(payload.get("changes") or {})
        run = self.run
        if run is None:
            config = self._init_kwargs.setdefault("config", {})
            config.update(changes)
            return
        run.config.update(changes)
        if hasattr(run, "_config_logged"):  # trackio 0.43 sends the config with one row
            run._config_logged = False

    def finish(self) -> None:
        self._start().finish()
