"""How the process ends while runs are open: the hooks that finish them, and the signals.

One module owns the process-wide exit state: ``sys.excepthook`` (records the exception and
holds SIGINT off from there on), the ``sys.exit`` wrapper (a non-zero status marks the runs
open then ``failed``), the SIGTERM handler (the runs are finished, the process exits with
128 + signum), the ``atexit`` hook and, in a ``multiprocessing`` child, its finalizer (both
finish the runs still open, retrying an interrupted stage), and the signal that ends the
wait for mirrors at finish (docs/mirrors.md "When something goes wrong"; docs/logging.md
for what a Ctrl-C or SIGTERM does to a run).

``api`` calls :func:`install` when it starts a run and :func:`add_independent_run` for an
``et.Run``; ``runs`` calls :func:`after_finish` when a ``Run.finish()`` completes; the
mirror's wait at finish (``backends.mirror.close_mirrors``) asks :func:`mirror_wait_cut`
and reports back, and a mirror whose backend registered ``atexit`` hooks of its own calls
:func:`exit_hook_first`. It imports only the leaf ``_current`` (the current run), so
``runs`` and ``backends`` call it directly: nothing here is registered in the leaf.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from typing import Any

from expr_tracker import _current

__all__ = [
    "add_independent_run",
    "after_finish",
    "exit_hook_first",
    "finish_wait_cut",
    "install",
    "mirror_wait_cut",
    "mirror_wait_interrupted",
    "mirrors_given_up",
    "signal_received",
    "skip_mirror_wait",
]

_logger = logging.getLogger("expr_tracker")

_hooks_installed = False
_prev_excepthook = None
_prev_exit: Any = None  # the sys.exit that _exit replaced
# a sys.exit() on the main thread with a non-zero status while runs were open: (status, the
# exception being handled then or None, the ids of those runs); see _exit
_exit_request: tuple[int, BaseException | None, frozenset[int]] | None = None

#: runs made by et.Run(...) / reinit="create_new", finished at process exit if still open
#: (the current run is ``_current.run``)
_independent_runs: list[Any] = []

#: attempts of the at-exit finish: an interrupted stage is redone by the next one
_EXIT_ATTEMPTS = 100
_sigint_prev: Any = None  # the SIGINT handler _hold_sigint replaced (None: not held)
_sigints_at_exit = 0  # SIGINTs that arrived while the exit hook finished the run
_exiting = False  # the exit hook is finishing the runs
_signal_received: int | None = None  # the SIGTERM the process ends by

#: the signal a handler asked to end the wait for mirrors with (0: none)
_cut = 0
#: the signal that did end a wait for mirrors (0: none): the exit hook ends the process by it
_cut_ended = 0
#: a wait for mirrors at finish on the main thread was interrupted (Ctrl-C)
_wait_interrupted = False
#: the exit hook runs after such an interrupted wait: mirrors are not waited for again
_give_up = False


def install() -> None:
    """Called (under ``api._lock``) by every start of a run: the hooks are installed once,
    and in a ``multiprocessing`` child its finalizer finishes the runs too."""
    _install_hooks()
    _finish_at_process_exit()


def add_independent_run(run: Any) -> None:
    """An independent run (``et.Run``, ``reinit="create_new"``): finished at exit if still
    open; runs finished since the last call are forgotten."""
    _independent_runs[:] = [r for r in _independent_runs if not r.finished]
    _independent_runs.append(run)


def signal_received() -> int | None:
    """The SIGTERM the process ends by (None: none came): ``et.finish()`` exits with
    128 + signum once the run is finished."""
    return _signal_received


# ---------------------------------------------------------------------- the hooks


def _excepthook(etype: type[BaseException], value: BaseException, tb: Any) -> None:
    run = _current.run
    if run is not None and not run.forked and run.exception is None:
        run.exception = (etype, value, tb)
    if run is not None and not run.forked and not run.finished and not _interactive():
        # the process is about to exit and the exit hook to finish the run: a second
        # Ctrl-C from here on must not cut that short (see _at_exit)
        _hold_sigint()
    hook = _prev_excepthook or sys.__excepthook__
    hook(etype, value, tb)


def _exit(status: Any = None) -> None:
    """``sys.exit``, recording a non-zero status for the exit hook. A program that handles
    an exception by calling ``sys.exit(1)`` never reaches ``sys.excepthook``: Hydra's
    ``@hydra.main`` prints the task's exception and exits so, and so does the process
    ``torch.multiprocessing`` spawns (a ``ddp_spawn`` worker) when its function raises. The
    runs still open then are finished at exit as ``failed``, with that exception, not as
    ``finished`` (wandb hooks ``sys.exit`` for the same reason)."""
    global _exit_request
    code = 0 if status is None else status if isinstance(status, int) else 1
    if code and threading.current_thread() is threading.main_thread() and not _interactive():
        runs = [
            r
            for r in (_current.run, *_independent_runs)
            if r is not None and not r.finished and not r.forked
        ]
        if runs:
            _exit_request = (code, sys.exc_info()[1], frozenset(id(r) for r in runs))
    (_prev_exit or _original_exit)(status)


_original_exit = sys.exit


def _interactive() -> bool:
    return bool(sys.flags.interactive) or hasattr(sys, "ps1")


def _sigint_at_exit(signum: int, frame: Any) -> None:
    global _sigints_at_exit
    _sigints_at_exit += 1  # the process is exiting: the run is finished first
    _cut_mirror_wait(signum)  # ... but its mirrors are not waited for


def _end_by_signal(signum: int) -> None:
    """End the process by ``signum`` (its default action), as the signal would have had it
    not been deferred: once a signal ended the wait for mirrors at exit and the runs are
    finished, no later exit hook (a hung backend's own teardown) may hold the process."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    try:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    except (ValueError, OSError):  # pragma: no cover - no signals here
        pass


def _hold_sigint() -> None:
    """Make SIGINT a no-op (counted) until :func:`_release_sigint`: on the main thread only,
    and only while the exit hook finishes the run (the program is exiting anyway)."""
    global _sigint_prev
    if _sigint_prev is not None or threading.current_thread() is not threading.main_thread():
        return
    try:
        prev = signal.getsignal(signal.SIGINT)
        if prev is None:  # installed from C: we could not put it back
            return
        _sigint_prev = prev
        signal.signal(signal.SIGINT, _sigint_at_exit)
    except (ValueError, OSError, TypeError):  # pragma: no cover - no signals here
        pass


def _release_sigint() -> None:
    global _sigint_prev
    prev = _sigint_prev
    if prev is None:
        return
    try:
        signal.signal(signal.SIGINT, prev)
    except (ValueError, OSError, TypeError):  # pragma: no cover
        pass
    _sigint_prev = None


def _at_exit() -> None:
    """Finish the run at interpreter exit. Nobody is left to call it again, so it must
    complete: SIGINT is held off meanwhile, and a stage interrupted anyway (a
    ``KeyboardInterrupt`` or ``SystemExit`` raised inside it) is redone by the next
    attempt (``Run.finish`` resumes at the interrupted stage)."""
    global _exiting, _give_up
    _exiting = True
    if _wait_interrupted:  # a Ctrl-C that cut a wait for mirrors short ends the program:
        _give_up = True  # the resumed finish waits for them no more
    cut_before = _cut_ended
    try:
        _hold_sigint()
        for _attempt in range(_EXIT_ATTEMPTS):
            try:
                _finish_at_exit()
                return
            except Exception:  # noqa: BLE001 - nothing may fail at interpreter exit
                _logger.exception("expr_tracker: finishing the run at exit failed")
                return
            except BaseException:  # noqa: BLE001 - interrupted: resume the stage
                continue
        _logger.error("expr_tracker: finishing the run at exit was interrupted too often")
    finally:
        _release_sigint()
        if _cut_ended != cut_before:  # a signal ended the wait for a mirror:
            _end_by_signal(_cut_ended)  # now it ends the process


def after_finish() -> None:
    """A ``Run.finish()`` completed: a SIGTERM that arrived while it ran (deferred so the
    data reached the disk) ends the process now, as ``et.finish()`` does; not in the exit
    hook (the process is exiting) nor on another thread (SystemExit would end that thread
    only)."""
    if (
        _signal_received is not None
        and not _exiting
        and threading.current_thread() is threading.main_thread()
    ):
        raise SystemExit(128 + _signal_received)


def _finish_at_exit() -> None:
    for run in [_current.run, *_independent_runs]:
        if run is None or run.forked or run.finished:
            continue
        if run.exception is None and getattr(sys, "last_type", None) is not None:
            run.exception = (sys.last_type, sys.last_value, sys.last_traceback)
        exit_code = None
        if _signal_received is not None:
            run.info_record["signal"] = signal.Signals(_signal_received).name
            exit_code = 128 + _signal_received
        elif _exit_request is not None and id(run) in _exit_request[2]:
            exit_code, value = _exit_request[0], _exit_request[1]
            if run.exception is None and value is not None:
                run.exception = (type(value), value, value.__traceback__)
        run.finish(exit_code=exit_code)


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM (how SLURM and Kubernetes stop a job): finish the run, exit 128 + signum.

    The handler only raises ``SystemExit``; the run is finished by the exit hook once the
    stack has unwound (so no lock held by the interrupted code is ever re-entered), and the
    process exits with 143 as if killed by the signal.
    """
    global _signal_received
    run = _current.run
    if run is not None and not run.forked and run.finishing:
        # finishing now (et.finish() or the exit hook): let it complete, so the data
        # and run.json reach the disk; the process then exits with 128 + signum
        if _signal_received is None:
            _signal_received = signum
        _cut_mirror_wait(signum)
        return
    # the current run (also one finished by run.finish(), current until the next et.init)
    # and the independent ones (et.Run): the exit hook finishes those still open
    if not any(r is not None and not r.forked for r in (run, *_independent_runs)):
        signal.signal(signum, signal.SIG_DFL)  # no run: as if nobody handled it
        os.kill(os.getpid(), signum)
        return
    _signal_received = signum
    raise SystemExit(128 + signum)


def _finish_at_process_exit() -> None:
    """In a ``multiprocessing`` child (a DataLoader worker), finish the run when the process
    exits: such children leave through ``os._exit``, which skips ``atexit``, but
    ``multiprocessing`` runs its finalizers first."""
    mp = sys.modules.get("multiprocessing")
    if mp is None or mp.parent_process() is None:
        return
    from multiprocessing import util

    util.Finalize(None, _at_exit, exitpriority=10)


def exit_hook_first() -> None:
    """Register the exit hook again, so it runs before the ``atexit`` hooks registered since
    it was (they run last-in first-out): a backend's ``init`` registers such hooks on the
    mirror's thread (wandb: the teardown of its service), and the runs must be finished, their
    mirrors drained, before those run. A second call of ``_at_exit`` finds the runs finished."""
    if _hooks_installed:
        atexit.register(_at_exit)


def _install_hooks() -> None:
    global _hooks_installed, _prev_excepthook
    if _hooks_installed:
        return
    _hooks_installed = True
    _prev_excepthook = sys.excepthook
    sys.excepthook = _excepthook
    _hook_exit()
    atexit.register(_at_exit)
    # SIGTERM: only where nobody else handles it (a framework's own handler wins)
    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):  # pragma: no cover - no signals here
            pass


def _hook_exit() -> None:
    global _prev_exit
    if sys.exit is not _exit:
        _prev_exit = sys.exit
        sys.exit = _exit


# ---------------------------------------------------------------------- the wait for mirrors
# The last stage of a finish waits for the mirrors (after everything is on disk), so a signal
# ends it: SIGTERM while a run finishes, or Ctrl-C at exit, sets _cut (one assignment, safe in
# a handler); the wait (backends.mirror.close_mirrors) polls it, gives every mirror up and
# reports back; the exit hook then ends the process by that signal.


def _cut_mirror_wait(signum: int) -> None:
    global _cut
    _cut = signum


def mirror_wait_cut() -> bool:
    """A signal asked to end the wait for mirrors in progress (or still to come in this
    finish): the wait returns within its poll interval."""
    return _cut != 0


def skip_mirror_wait() -> bool:
    """The mirrors are not waited for: a signal came while the run finished, or the exit
    hook resumes a finish whose wait for them a Ctrl-C interrupted."""
    return _give_up or _cut != 0


def finish_wait_cut() -> bool:
    """A signal came while a run finished (a SIGTERM, or a Ctrl-C at exit): a wait at
    finish that only spares a later reader work (the query cache's last extension,
    :mod:`expr_tracker.query.warmer`) ends now rather than hold the process up."""
    return _signal_received is not None or _cut != 0 or _cut_ended != 0 or _give_up


def mirror_wait_interrupted() -> None:
    """The wait for mirrors was interrupted (an exception propagates through it): on the
    main thread, a Ctrl-C that ends the program; the exit hook waits for them no more."""
    global _wait_interrupted
    if threading.current_thread() is threading.main_thread():
        _wait_interrupted = True


def mirrors_given_up() -> None:
    """The wait gave every mirror not done up (:func:`skip_mirror_wait`): the signal that
    cut it, if one did, is the one the exit hook ends the process by."""
    global _cut, _cut_ended
    if _cut:
        _cut_ended, _cut = _cut, 0
