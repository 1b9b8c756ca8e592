"""``et.config`` and ``et.summary``: objects that follow the current run.

``from expr_tracker import config`` captured before ``et.init`` works afterwards (as with
wandb): every use looks the current run up in :mod:`expr_tracker._current`. With no run
(before ``et.init``, after ``et.finish``), reading or changing them raises
:class:`~expr_tracker.errors.NoActiveRunError` saying to call ``et.init`` — wandb raises
too for a config read before ``init``; only ``repr()`` and ``bool()`` never raise.
``et.summary`` is also callable: ``et.summary()`` returns the run's ``Summary`` (the
function it replaces).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from expr_tracker import _current
from expr_tracker._current import FORK_MESSAGE
from expr_tracker.errors import ForkedRunError, NoActiveRunError

__all__ = ["ConfigProxy", "SummaryProxy", "config", "summary"]


def _run(what: str, write: bool = False) -> Any:
    run = _current.run
    if run is None or run.finished:
        raise NoActiveRunError(
            f"et.{what} needs an active run: call et.init(project=..., name=...) first "
            f"(et.{what} then follows the current run)"
        )
    if write and run.forked:  # reads are fine: the values the parent held at the fork
        raise ForkedRunError(FORK_MESSAGE)
    return run


class _Proxy:
    """Forwards to an attribute (``_attr``) of the current run."""

    __slots__ = ()
    _attr = ""

    def _target(self, write: bool = False) -> Any:
        return getattr(_run(self._attr, write), self._attr)

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        return getattr(self._target(), key)

    def __setattr__(self, key: str, value: Any) -> None:
        setattr(self._target(write=True), key, value)

    def __getitem__(self, key: str) -> Any:
        return self._target()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._target(write=True)[key] = value

    def __delitem__(self, key: str) -> None:
        del self._target(write=True)[key]

    def __contains__(self, key: object) -> bool:
        return key in self._target()

    def __iter__(self) -> Iterator[str]:
        return iter(self._target())

    def __len__(self) -> int:
        return len(self._target())

    def __bool__(self) -> bool:
        run = _current.run
        return run is not None and not run.finished and bool(len(getattr(run, self._attr)))

    def __eq__(self, other: object) -> bool:
        return self._target() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        run = _current.run
        if run is None or run.finished:
            return f"<et.{self._attr}: no active run>"
        return repr(getattr(run, self._attr))


class ConfigProxy(_Proxy):
    """``et.config``: the current run's :class:`~expr_tracker.runconfig.RunConfig`
    (``et.config.lr``, ``et.config["lr"]``, ``et.config.update({...})``)."""

    __slots__ = ()
    _attr = "config"

    def __reduce__(self) -> Any:
        # pickle / copy: a detached snapshot of the current run's config (a spawned
        # DataLoader worker has no run to follow)
        return self._target().__reduce__()


class SummaryProxy(_Proxy):
    """``et.summary``: the current run's :class:`~expr_tracker.runsummary.Summary`
    (``et.summary["best"] = 0.9``, ``et.summary.update({...})``); ``et.summary()``
    returns that ``Summary``."""

    __slots__ = ()
    _attr = "summary"

    def __call__(self) -> Any:
        return self._target()


# a mapping to every consumer (config=et.config, config.update(et.config)), as the
# RunConfig it forwards to
Mapping.register(ConfigProxy)

config = ConfigProxy()
summary = SummaryProxy()
