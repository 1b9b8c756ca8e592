"""The trackio mirror: one trackio run per stream and rank of an expr_tracker run.

``trackio`` is imported on the mirror's thread, when the backend starts; a missing package
is a :class:`BackendUnavailable` (one warning naming ``pip install 'expr-tracker[trackio]'``).

- ``init``: ``trackio.init(project=, name=, group=<run name>, config=, resume="allow",
  embed=False, auto_log_cpu=False, auto_log_gpu=False)`` with ``backend_kwargs.trackio``
  over these. trackio keeps its current run in a ``ContextVar``; the mirror's thread has a
  context of its own, so the user's own ``trackio`` run (on their thread) is left alone.
  trackio reserves config keys starting with ``_``: those keys are not mirrored (they stay
  in ``config.json``).
- ``log``: ``run.log(metrics, step=<_step>)``.
- events: ``config`` updates the trackio run's config, sent with the next row (trackio
  stores a run's config with a logged row). ``summary``, ``define_metric`` and ``artifact``
  are not mirrored: trackio 0.43 derives summaries from the history itself, has no
  ``define_metric``, and its artifacts are copies into its own store (ours are already
  versioned next to the runs; copying them again would double the disk use).
- ``finish``: ``run.finish()`` (trackio records no exit code).
"""

from __future__ import annotations

from typing import Any

from expr_tracker.backends.mirror import BackendUnavailable

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

    def init(self, **info: Any) -> None:
        try:
            import trackio
        except ImportError:
            raise BackendUnavailable("trackio", "trackio") from None
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
        self.run = trackio.init(**kw)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.run.log(metrics, step=step)

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        if event == "config":
            run = self.run
            run.config.update(_public(payload.get("changes") or {}))
            if hasattr(run, "_config_logged"):  # trackio 0.43 sends the config with one row
                run._config_logged = False

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
