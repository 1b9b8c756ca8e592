"""``et.watch(model)``: histograms of a torch model's gradients and parameters every
``log_freq`` steps (docs/media.md "Watching a model"), as ``wandb.watch``.

How it stays free between those steps: one forward pre-hook on the watched module reads
the run's open step. Only on a step that is a multiple of ``log_freq`` (once per step,
whatever the number of forward calls) does it log the parameters' histograms and arm
one-shot gradient hooks on the parameters, each removed as soon as it fired; so a step
that is not logged costs one Python call per forward and nothing in backward.

Everything is logged with ``commit=False`` into the step open when the forward ran, so it
is written with the next committing ``et.log``. Keys are wandb's: ``parameters/<name>``
and ``gradients/<name>`` (histograms), with ``parameters/<name>.norm`` and
``gradients/<name>.norm`` (L2 norms) beside them.
"""

from __future__ import annotations

import threading
from typing import Any

from expr_tracker import _current
from expr_tracker.media.types import MAX_BINS, Histogram

__all__ = ["LOG_CHOICES", "unwatch", "watch"]

#: what ``watch(log=)`` takes
LOG_CHOICES = ("gradients", "parameters", "all")
#: above this (max - min) * bins, float32 arithmetic in ``torch.histc`` may overflow
_FLOAT32_SAFE = 1e37

_watchers: dict[int, _Watcher] = {}
_watchers_lock = threading.Lock()


class _Watcher:
    """The hooks and state of one watched module."""

    def __init__(
        self, model: Any, run: Any, log: str, log_freq: int, num_bins: int, prefix: str
    ) -> None:
        self.model = model
        self.run = run
        self.grads = log in ("gradients", "all")
        self.params = log in ("parameters", "all")
        self.log_freq = log_freq
        self.num_bins = num_bins
        self.prefix = prefix
        self.last_step: int | None = None
        self.grad_handles: list[Any] = []
        self.handle = model.register_forward_pre_hook(self._pre_forward)
        self.logged_steps: list[int] = []

    def _named(self) -> list[tuple[str, Any]]:
        return [(self.prefix + n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def _pre_forward(self, module: Any, args: Any) -> None:
        run = self.run
        if run.finished or not module.training:  # evaluation passes are not training steps
            return
        step = run.history.open_step
        if step % self.log_freq or step == self.last_step:
            return
        self.last_step = step
        self.logged_steps.append(step)
        named = self._named()
        if self.params:
            self._log_tensors("parameters", [(n, p.detach()) for n, p in named])
        if self.grads:
            self._remove_grad_hooks()
            for name, p in named:
                self.grad_handles.append(
                    p.register_hook(self._grad_hook(name, len(self.grad_handles)))
                )

    def _grad_hook(self, name: str, index: int) -> Any:
        def hook(grad: Any) -> None:
            h = self.grad_handles[index] if index < len(self.grad_handles) else None
            if h is not None:
                h.remove()
                self.grad_handles[index] = None
            self._log_tensors("gradients", [(name, grad.detach())])

        return hook

    def _log_tensors(self, kind: str, tensors: list[tuple[str, Any]]) -> None:
        import torch

        out: dict[str, Any] = {}
        for name, t in tensors:
            flat = t.float().flatten()
            if flat.numel() == 0:
                continue
            finite = flat[torch.isfinite(flat)]
            if finite.numel():
                lo, hi = float(finite.min()), float(finite.max())
                if lo == hi:
                    lo, hi = lo - 0.5, hi + 0.5
                if (hi - lo) * self.num_bins > _FLOAT32_SAFE:
                    # histc computes (x - min) * bins / (max - min) in the tensor's dtype:
                    # in float32 that overflows near its limits and every value lands in
                    # bin 0, so such (rare: diverging) tensors are binned in float64
                    cpu = finite.device.type == "mps"  # MPS has no float64
                    finite = finite.to("cpu" if cpu else finite.device, torch.float64)
                counts = torch.histc(finite, bins=self.num_bins, min=lo, max=hi)
                edges = torch.linspace(lo, hi, self.num_bins + 1)
                out[f"{kind}/{name}"] = Histogram(
                    np_histogram=(counts.cpu().to(torch.int64).numpy(), edges.numpy())
                )
            out[f"{kind}/{name}.norm"] = float(torch.linalg.vector_norm(flat))
        if out:
            self.run.log(out, commit=False)

    def _remove_grad_hooks(self) -> None:
        for h in self.grad_handles:
            if h is not None:
                h.remove()
        self.grad_handles = []

    def remove(self) -> None:
        self.handle.remove()
        self._remove_grad_hooks()


def watch(
    models: Any,
    criterion: Any = None,
    log: str | None = "gradients",
    log_freq: int = 1000,
    idx: int | None = None,
    log_graph: bool = False,
    *,
    num_bins: int = 64,
) -> None:
    """Log histograms (and L2 norms) of a torch model's gradients and/or parameters every
    ``log_freq`` steps of the current run (the module docstring; docs/media.md).

    Args:
        models: a ``torch.nn.Module`` or a list of them (each key prefixed ``<i>.`` when
            there are several).
        criterion, idx, log_graph: accepted for wandb compatibility; no graph is drawn.
        log: ``"gradients"`` (default, as wandb), ``"parameters"``, ``"all"``, or None
            (nothing: as wandb's ``log=None``).
        log_freq: steps between two logged steps (a step is logged when it is a multiple
            of ``log_freq``).
        num_bins: bins per histogram, 1..512.

    Raises:
        NoActiveRunError: no run is active.
        ValueError: ``log``, ``log_freq`` or ``num_bins`` not valid, or a model that is
            not a ``torch.nn.Module``.
    """
    if log is None:
        return
    if log not in LOG_CHOICES:
        raise ValueError(
            f"watch(log={log!r}) is not valid: one of {', '.join(LOG_CHOICES)} or None"
        )
    if type(log_freq) is not int or log_freq < 1:
        raise ValueError(f"watch(log_freq={log_freq!r}) is not valid: an int >= 1")
    if type(num_bins) is not int or not 1 <= num_bins <= MAX_BINS:
        raise ValueError(f"watch(num_bins={num_bins!r}) is not valid: an int in 1..{MAX_BINS}")
    run = _current.run
    if run is None or run.finished:
        from expr_tracker.errors import NoActiveRunError

        raise NoActiveRunError("watch() needs an active run: call et.init() first")
    many = isinstance(models, (list, tuple))
    items = list(models) if many else [models]
    for m in items:
        if not (hasattr(m, "register_forward_pre_hook") and hasattr(m, "named_parameters")):
            raise ValueError(f"watch(models): a {type(m).__name__} is not a torch.nn.Module")
    with _watchers_lock:
        for i, m in enumerate(items):
            old = _watchers.pop(id(m), None)
            if old is not None:
                old.remove()
            _watchers[id(m)] = _Watcher(m, run, log, log_freq, num_bins, f"{i}." if many else "")


def unwatch(models: Any = None) -> None:
    """Remove the hooks ``watch`` added: on ``models`` (a module or a list), or on every
    watched module when None. A module not watched is ignored."""
    with _watchers_lock:
        if models is None:
            keys = list(_watchers)
        else:
            items = list(models) if isinstance(models, (list, tuple)) else [models]
            keys = [id(m) for m in items if id(m) in _watchers]
        for k in keys:
            _watchers.pop(k).remove()
