"""The query cache of a file kept current by the process writing it (docs/query.md "Kept by
the run").

The first ``et query`` after a run decodes every line of its JSONL into the columnar cache
(:mod:`expr_tracker.query.cache`): ~0.24 s of CPU for 100,000 lines of 5 metrics (17 MB)
here, 24 s for a folder of 100 such runs. A run that writes a file past :data:`STEP_BYTES`
has that cache extended every :data:`STEP_BYTES` it writes, and once more at finish over
the rest, so a finished run's cache covers its whole file and the first query reads none
of it. A file that never reaches :data:`STEP_BYTES` is left to the first query (about a
tenth of a second).

The extensions run in a helper process, one per training process, started when the first
file passes :data:`STEP_BYTES` (``python -m expr_tracker.query.warmer``, the interpreter
and the ``expr_tracker`` of the process that starts it): the training process never
imports ``pyarrow`` or ``polars`` for it, never shares its GIL with the decoding, and its
memory does not grow by what decoding a block takes. The helper reads one request a line
(``{"id": N, "path": ..., "kind": ...}``) on its standard input (one end of a socket pair: a
request sent to a helper that just died is a ``BrokenPipeError``, never a SIGPIPE that would
end a training script that restored SIGPIPE's default action), runs
:func:`expr_tracker.query.cache.warm` (the reader's own refresh, under the cache's lock,
writing only beside the file, never warning, never falling back) and answers one line on
its standard output (``{"id": N, "covered": bytes or null, "error": text or null}``); it
ends when its standard input closes (the training process finished or died), after the
extension in progress, or after :data:`IDLE_S` without a request (a notebook's process
that runs again starts a new one), and it is in a session of its own, so a Ctrl-C in the terminal
stops the training process, not a cache being written.

:class:`CacheWarmer` is one file's: the writer calls :meth:`CacheWarmer.written` after each
batch it writes (an integer comparison), which sends a request once :data:`STEP_BYTES`
more were written since the last one; :meth:`finish`, at the end of the run's finish (after
``run.json``), sends the last request and waits for the helper's answers (at most ``wait``
seconds). A file that cannot be kept (no helper process, no ``pyarrow``, a full disk, a run
directory that is not this user's) is given up quietly for the rest of the run (debug log;
``stats()["gave_up"]``), and the first query builds its cache as it always did.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

__all__ = ["FINISH_WAIT_S", "IDLE_S", "STEP_BYTES", "CacheWarmer", "helper_main"]

log = logging.getLogger("expr_tracker")

#: bytes written between two extensions of a file's cache, and the size below which a run
#: leaves its file's cache to the first query
STEP_BYTES = 8 << 20
#: seconds :meth:`CacheWarmer.finish` waits for the helper's answers before it gives up
#: (the helper still finishes the extension in progress)
FINISH_WAIT_S = 30.0


class CacheWarmer:
    """The query cache of ``path`` (a ``kind`` file: ``"metrics"`` or ``"spans"``), kept for
    the writer of ``path``. ``step``: bytes between extensions (None: the module's
    :data:`STEP_BYTES` now).

    ``stats()``: ``warms`` (extensions done), ``covered`` (bytes of the file the cache
    covered after the last one), ``gave_up`` (why the file was given up, or None),
    ``helper_pid`` (the helper process that took the last request, or None).

    Raises ``ValueError`` for another ``kind`` or a ``step`` that is not a positive int.
    """

    def __init__(self, path: str | os.PathLike[str], kind: str, step: int | None = None) -> None:
        if kind not in ("metrics", "spans"):
            raise ValueError(f"kind={kind!r} is not valid: use 'metrics' or 'spans'")
        if step is None:
            step = STEP_BYTES
        if type(step) is not int or step < 1:
            raise ValueError(f"step={step!r} is not valid: a positive number of bytes")
        self.path = Path(path).absolute()
        self.kind = kind
        self.step = step
        #: the file size at which :meth:`written` sends the next request
        self.next_at = step
        self.warms = 0
        self.covered = 0
        self.gave_up: str | None = None
        #: the process id of the helper that took the last request (None before one)
        self.helper_pid: int | None = None
        self._pending = 0  # requests sent and not answered (under _Helper.lock)
        self._queued = False  # a request waits for the helper to start (_Helper.send)
        self._finished = False
        #: when :meth:`finish` stops waiting (None before its first call)
        self._deadline: float | None = None

    def written(self, size: int) -> None:
        """The file is ``size`` bytes long now (the writer, after a batch); sends a request
        when ``size`` reached :attr:`next_at`. Never raises an ``Exception``."""
        if size < self.next_at:
            return
        self.next_at = size + self.step
        if not self._finished:
            self._request()

    def finish(self, wait: float | None = None, cut: Callable[[], bool] | None = None) -> None:
        """At the run's finish, the file closed: extend the cache over the rest (when the
        file reached :attr:`step` bytes) and wait for the helper's answers, at most ``wait``
        seconds (None: the module's :data:`FINISH_WAIT_S` now) counted from the first call.

        The wait ends early, the cache left to the first query, when ``cut()`` turns True
        (a SIGTERM or a Ctrl-C while the run finishes:
        :func:`expr_tracker.process_exit.finish_wait_cut`) or when an exception (a Ctrl-C)
        propagates through it: called again (the exit hook resuming the interrupted
        finish), it neither sends nor waits. Idempotent."""
        if self._deadline is None:
            self._finished = True
            self._deadline = time.monotonic() + (FINISH_WAIT_S if wait is None else wait)
            if self.gave_up is None:
                try:
                    size = os.stat(self.path).st_size
                except OSError:
                    size = 0
                if size >= self.step and size != self.covered:
                    self._request()
        try:
            # polled: nothing here can be left half-done by a Ctrl-C
            while self._pending > 0 or self._queued:
                if time.monotonic() >= self._deadline or (cut is not None and cut()):
                    log.debug(
                        "expr_tracker: the query cache of %s is still being extended", self.path
                    )
                    return
                time.sleep(0.005)
        except BaseException:
            self._deadline = -math.inf  # interrupted: a resumed finish waits no more
            raise

    def stats(self) -> dict[str, Any]:
        return {
            "warms": self.warms,
            "covered": self.covered,
            "gave_up": self.gave_up,
            "helper_pid": self.helper_pid,
        }

    def _request(self) -> None:
        if self.gave_up is not None:
            return
        try:
            _helper().send(self)
        except Exception as exc:  # noqa: BLE001 - never the writer's problem
            self._give_up(f"the helper process cannot be reached ({type(exc).__name__}: {exc})")

    def _answered(self, covered: int | None, error: str | None) -> None:
        if error is not None or covered is None:
            self._give_up(error or "its cache folder cannot be used or written")
        else:
            self.warms += 1
            self.covered = max(self.covered, covered)

    def _give_up(self, why: str) -> None:
        if self.gave_up is None:
            self.gave_up = why
            log.debug("expr_tracker: not keeping the query cache of %s: %s", self.path, why)


class _Helper:
    """The helper process of this process and the thread reading its answers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        #: this end of the helper's standard input (a socket: a request written to a helper
        #: that has just died raises ``BrokenPipeError``, never SIGPIPE, whatever SIGPIPE's
        #: action in this process: a script that restored the default is not killed)
        #: (kept as a bare descriptor, wrapped for each send: a socket object left open at
        #: the interpreter's exit, while the helper still serves, would be a ResourceWarning)
        self._requests: int | None = None
        self._no_sigpipe = 0  # send() flags (MSG_NOSIGNAL where there is one), set by _start
        self._ids = itertools.count(1)
        #: request id -> (the helper it went to, its file's warmer)
        self._waiting: dict[int, tuple[subprocess.Popen[bytes], CacheWarmer]] = {}
        #: requests waiting for the helper being started (their warmers, in order)
        self._queued: list[CacheWarmer] = []
        self._starting = False  # a thread is starting a helper (_start_and_send)
        #: the thread reading the running helper's answers (None: one started at shutdown)
        self._reader: threading.Thread | None = None

    def send(self, w: CacheWarmer) -> None:
        """One request for ``w``'s file. Never waits for a helper to start: with none
        running, the request waits in a queue (``w._queued``, which :meth:`CacheWarmer.finish`
        waits on too) and a thread of its own starts the helper, then sends what the queue
        holds (:meth:`_start_and_send`). The caller is the writer's flusher thread, which
        would otherwise wait out ``Popen`` (tens of GIL hand-overs with a training loop
        running: ~0.15 s here) while the rows it should write pile up.

        Safe against an exception at any point on the caller's thread (a Ctrl-C during a
        flush on the main thread): ``w`` counts a request as pending only once its line is
        written, and as queued only once it is in the queue.

        At interpreter shutdown, where no thread can be started (Python 3.12 and later
        refuse one in an ``atexit`` hook: a run finished by the exit hook whose helper had
        gone idle), the helper is started here and the request sent unanswered
        (:meth:`_send_at_shutdown`): the helper serves it after this process is gone.

        Raises:
            RuntimeError: no helper can be started.
        """
        with self.lock:
            proc = self._proc
            if self._starting or proc is None or proc.poll() is not None or self._requests is None:
                if not self._starting:
                    # started before anything is queued: a refusal leaves nothing behind
                    # (the thread waits for this lock before it reads the queue)
                    try:
                        threading.Thread(
                            target=self._start_and_send,
                            name="expr_tracker-query-cache-start",
                            daemon=True,
                        ).start()
                    except RuntimeError:  # "can't create new thread at interpreter shutdown"
                        self._send_at_shutdown(w)
                        return
                    self._starting = True
                self._queued.append(w)
                w._queued = True
                return
            self._send_locked(proc, w)

    def _send_at_shutdown(self, w: CacheWarmer) -> None:
        """``send`` where no thread can be started (``lock`` held): start a helper on this
        thread, with no thread reading its answers (its end of them is closed: the helper
        goes on unanswered, :func:`helper_main`), and send ``w``'s request. It is not
        counted pending: :meth:`CacheWarmer.finish` has nothing to wait for, and the helper
        extends the cache after this process is gone, as for a run that failed."""
        self._proc = proc = self._start()  # its answers' reader is refused too
        self._send_locked(proc, w)

    def _send_line(self, proc: subprocess.Popen[bytes], w: CacheWarmer) -> int:
        """Write ``w``'s request to the running helper ``proc`` (``lock`` held); its id."""
        rid = next(self._ids)
        line = json.dumps({"id": rid, "path": str(w.path), "kind": w.kind}) + "\n"
        assert self._requests is not None
        import socket  # imported by _start already: a lookup

        sock = socket.socket(fileno=self._requests)
        try:
            sock.sendall(line.encode(), self._no_sigpipe)
        finally:
            sock.detach()  # the descriptor stays ours, open
        w.helper_pid = proc.pid
        return rid

    def _send_locked(self, proc: subprocess.Popen[bytes], w: CacheWarmer) -> None:
        """Write ``w``'s request to the running helper ``proc`` (``lock`` held), its answer
        awaited; unanswered, and not waited for, when nobody reads the answers (a helper
        started at shutdown: :meth:`_send_at_shutdown`)."""
        rid = self._send_line(proc, w)
        if self._reader is not None:
            self._waiting[rid] = (proc, w)
            w._pending += 1

    def _start_and_send(self) -> None:
        """The thread :meth:`send` starts: start a helper, then send every queued request to
        it, or give their files up when it cannot be started or reached."""
        proc: subprocess.Popen[bytes] | None = None
        why = ""
        try:
            proc = self._start()
        except Exception as exc:  # noqa: BLE001 - the files are given up, the run goes on
            why = f"the helper process cannot be started ({type(exc).__name__}: {exc})"
        with self.lock:
            if proc is not None:
                self._proc = proc
            queued, self._queued = self._queued, []
            self._starting = False
            for w in queued:
                if proc is None:
                    w._give_up(why)
                else:
                    try:
                        self._send_locked(proc, w)
                    except Exception as exc:  # noqa: BLE001 - as _request's
                        w._give_up(
                            f"the helper process cannot be reached ({type(exc).__name__}: {exc})"
                        )
                w._queued = False  # after the send: pending by then, or given up

    def _start(self) -> subprocess.Popen[bytes]:
        """A new helper and the thread reading its answers (none at interpreter shutdown,
        where no thread may start: this end of its answers is closed then); sets this end
        of its input. Runs on the starting
        thread without ``lock`` (:meth:`send` reads none of what this sets while
        ``_starting`` holds), or under it at shutdown (:meth:`_send_at_shutdown`)."""
        import subprocess  # here: a run that never needs a helper never imports it

        if not _PYTHON_NAME.match(os.path.basename(sys.executable or "")):
            # an embedded interpreter (uWSGI, Blender ...): its executable is not Python,
            # and running it with our arguments could start anything
            raise RuntimeError(f"sys.executable {sys.executable!r} is not a Python interpreter")

        # the ``expr_tracker`` of this process first, in place of ``-c``'s current folder
        # (a file there named like a module imported below must not be run)
        package_root = str(Path(__file__).resolve().parents[2])
        code = (
            f"import sys; sys.path[:1] = [{package_root!r}] if sys.path[:1] == [''] else "
            f"[{package_root!r}, *sys.path[:1]]; "
            "from expr_tracker.query.warmer import helper_main; helper_main()"
        )
        if self._requests is not None:
            _close(self._requests)  # the end of a helper that is gone
            self._requests = None
        import socket

        # a write to a closed socket raises EPIPE without SIGPIPE: MSG_NOSIGNAL on Linux,
        # the SO_NOSIGPIPE option on macOS
        self._no_sigpipe = getattr(socket, "MSG_NOSIGNAL", 0)
        # no fork of this process (a data-loader worker forked by the main thread) while
        # the descriptors below are open here: a child would keep Popen's exec-status pipe
        # open, and Popen would wait for that child's end (an epoch, the whole run), and
        # keep the helper's input (it would not see this process end) and answers open
        with _NO_FORK:
            ours, theirs = socket.socketpair()
            answers, their_answers = os.pipe()  # bare descriptors: see _requests
            try:
                if self._no_sigpipe == 0 and hasattr(socket, "SO_NOSIGPIPE"):  # macOS
                    ours.setsockopt(socket.SOL_SOCKET, socket.SO_NOSIGPIPE, 1)
                proc = subprocess.Popen(
                    [sys.executable, "-c", code],
                    stdin=theirs.fileno(),
                    stdout=their_answers,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                    close_fds=True,
                )
            except BaseException:
                ours.close()
                _close(answers)
                raise
            finally:
                theirs.close()
                _close(their_answers)
            self._requests = ours.detach()
        reader = threading.Thread(
            target=self._read,
            args=(proc, _lines(answers)),
            name="expr_tracker-query-cache",
            daemon=True,
        )
        try:
            reader.start()
        except RuntimeError:  # "can't create new thread at interpreter shutdown" (3.12+)
            pass
        else:
            self._reader = reader
            return proc
        _close(answers)  # the helper's answers go nowhere; it serves on (helper_main)
        self._reader = None
        return proc

    def _read(self, proc: subprocess.Popen[bytes], lines: Iterable[bytes]) -> None:
        """The answers of ``proc`` (``lines``: its output, a line each), until it exits;
        then every request it took and did not answer is given up."""
        for raw in lines:
            try:
                answer = json.loads(raw)
                rid = answer["id"]
            except (ValueError, KeyError, TypeError):
                continue
            with self.lock:
                entry = self._waiting.get(rid)
                if entry is None or entry[0] is not proc:
                    continue
                del self._waiting[rid]
                w = entry[1]
                w._answered(answer.get("covered"), answer.get("error"))
                w._pending -= 1
        proc.wait()
        with self.lock:
            # only the requests this helper took: a new helper may have others already
            mine = [rid for rid, (p, _w) in self._waiting.items() if p is proc]
            for rid in mine:
                w = self._waiting.pop(rid)[1]
                # idle, it exits with 0 (a request sent as it did is sent again by the
                # next one): only a helper that died gives its files up
                if proc.returncode != 0:
                    w._give_up(f"the helper process exited ({proc.returncode})")
                w._pending -= 1


def _lines(fd: int) -> Iterator[bytes]:
    """The lines read from the descriptor ``fd`` until its end; closes it then."""
    buf = b""
    try:
        while True:
            data = os.read(fd, 1 << 16)
            if not data:
                return
            buf += data
            *done, buf = buf.split(b"\n")
            yield from done
    finally:
        _close(fd)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


#: the file names of a Python interpreter (``python``, ``python3.11``, ``pypy3``, ``.exe``)
_PYTHON_NAME = re.compile(r"^(?:python|pypy)[0-9.]*[a-z]?(?:\.exe)?$", re.IGNORECASE)


_HELPER: _Helper | None = None
_HELPER_LOCK = threading.Lock()
#: held by :meth:`_Helper._start` while a helper's descriptors are open in this process and
#: by ``os.fork`` (before it forks, released after it): a fork waits for a helper's start
#: (reentrant: a fork from the starting thread itself never waits for itself)
_NO_FORK = threading.RLock()


def _helper() -> _Helper:
    global _HELPER
    h = _HELPER
    if h is None:
        with _HELPER_LOCK:
            if _HELPER is None:
                _HELPER = _Helper()
            h = _HELPER
    return h


#: per forking thread: whether its fork holds :data:`_NO_FORK`, and a Ctrl-C that came while
#: it waited for it (``os.fork`` swallows an exception of its hooks: given back after it)
_FORKING = threading.local()


def _before_fork() -> None:
    _FORKING.held = _FORKING.interrupted = False
    try:
        _NO_FORK.acquire()
    except KeyboardInterrupt:
        _FORKING.interrupted = True  # forks as before; the Ctrl-C comes back after it
        return
    _FORKING.held = True


def _after_fork_in_parent() -> None:
    if getattr(_FORKING, "held", False):
        _FORKING.held = False
        _NO_FORK.release()
    if getattr(_FORKING, "interrupted", False):
        # raised here (or by a signal handler run here) it would be swallowed again: a
        # thread of its own gives it back once ``os.fork`` has returned
        _FORKING.interrupted = False
        threading.Thread(target=_interrupt_main_soon, name="expr_tracker-fork-ctrl-c").start()


def _interrupt_main_soon() -> None:
    import _thread

    time.sleep(0.01)  # the fork's other hooks and its return: microseconds
    _thread.interrupt_main()


def _after_fork_in_child() -> None:
    # the parent's helper answers the parent: a forked child (a data-loader worker) starts
    # its own when it needs one, and closes its copy of the parent's end of the helper's
    # input, so that a child that outlives its parent does not keep that helper waiting
    global _HELPER, _HELPER_LOCK, _NO_FORK
    h = _HELPER
    if h is not None and h._requests is not None:
        _close(h._requests)
    _HELPER = None
    _HELPER_LOCK = threading.Lock()
    _NO_FORK = threading.RLock()  # the parent's, held by the fork: not this child's


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


#: seconds the helper process waits for a request before it exits (a process that runs
#: again starts a new one)
IDLE_S = 60.0


def helper_main(requests: int = 0, answers: int = 1, idle: float | None = None) -> None:
    """The helper process's loop: one request a line read from the descriptor ``requests``
    (standard input), one answer a line written to ``answers`` (standard output), until
    ``requests`` ends or no request came for ``idle`` seconds (default :data:`IDLE_S`).
    Anything a request makes go wrong is its answer's ``error``; the loop goes on. Once
    ``answers`` cannot be written (its reader, the training process, is gone), the requests
    still come to an end unanswered: a failed run's finish sends its last one and leaves."""
    import select

    from expr_tracker.query.cache import warm

    idle = IDLE_S if idle is None else idle
    buf = b""
    while True:
        while b"\n" not in buf:
            ready, _, _ = select.select([requests], [], [], idle)
            if not ready:
                return  # idle
            data = os.read(requests, 1 << 16)
            if not data:
                return  # the training process closed it: finished or gone
            buf += data
        raw, buf = buf.split(b"\n", 1)
        answer: dict[str, Any] = {"id": None, "covered": None, "error": None}
        try:
            req = json.loads(raw)
            answer["id"] = req["id"]
            answer["covered"] = warm(req["path"], req["kind"])
        except Exception as exc:  # noqa: BLE001 - the next request is served all the same
            answer["error"] = f"{type(exc).__name__}: {exc}"
        if answers < 0:
            continue  # nobody reads the answers any more: the extensions go on
        out = (json.dumps(answer) + "\n").encode()
        try:
            while out:
                out = out[os.write(answers, out) :]
        except OSError:
            # the training process is gone (EPIPE; SIGPIPE is ignored in Python): the
            # requests it sent before it went are still served, the last one of its
            # finish among them, which extends the cache over the whole file
            answers = -1
