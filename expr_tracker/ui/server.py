"""The ``et ui`` web server: a Starlette app serving the page (static files of this package
and plotly's bundled ``plotly.min.js``: no CDN, works offline) and read-only JSON endpoints
(one module per page: ``ui/runs.py``, ``ui/runpage.py``, ``ui/series.py``,
``ui/spans.py``, ``ui/compare.py``, over the runs of ``ui/catalog.py``). Only GET (and
HEAD); nothing is written but the columnar cache (and a streamed trace's temporary spool).
Starlette, uvicorn and plotly are imported when the app is made (the ``[ui]`` extra).

Who may ask is :mod:`expr_tracker.ui.guard`'s (the Host rule, the token, the login cookie);
what a request may cost is bounded here: a trace is streamed, and at most
:data:`HEAVY_LIMIT` traces or compares are made at once (others: 503, ``Retry-After``).
Errors are JSON ``{"error"}``: 400 a bad parameter, 404 no such run or metric (or deleted),
422 a run file that cannot be read (why), 503 busy.

Endpoints (every run is named by its ``run`` id from ``/api/runs``, looked up, never a path):

- ``/api/runs[?columns=A,B&sort=-A,B&where=FILTER&archived=1]``: the runs (status, steps,
  duration, start, tags, group, the chosen config/summary ``values``; as ``et runs``:
  docs/ui.md "Columns, order and filter").
- ``/api/run?run=ID[&pin=A,B][&baseline=ID2]``: a run's metrics (first-logged order) and
  their sections (pinned, the user's, span timings), x-axis options, config (and its view:
  defaults, the baseline's differences), summary, alerts, and its System section
  (``system``: per node, its producer, host and metrics).
- ``/api/media?run=ID``: the run's media keys, their steps and references, histograms'
  counts, the latest table's rows (``ui/media.py``); ``/api/media/file?run=ID&path=
  media/<sha256>.<ext>``: one media file, only from the run's ``media`` folder;
  ``/api/media/table?run=ID&path=...&offset=&limit=&sort=COL&desc=1``: one page of a
  table, sorted over the whole table.
- ``/api/series?run=ID&metric=M&x=step|time|METRIC&width=W[&lo=&hi=][&producer=P]
  [&smooth=ema:W|mean:N]``: one metric, downsampled to ``W`` buckets over the x range
  ``[lo, hi]`` (one producer's only), with its smoothed series computed on the raw one.
- ``/api/overlay?run=A&run=B...&metric=M&width=W[&lo=&hi=][&pixels=1]``: one metric of many runs, x
  the step, cut to ``W`` pixels from the runs' multi-resolution summaries (per pixel the
  true min/max/first/last and NaN/±inf counts; ``ui/overlay.py``).
- ``/api/points?run=ID&after=STEP[&since=PRODUCER:STEP...]&x=...[&skip_stream=S...]``: rows
  with a step above ``STEP`` (or the producer's own step in ``since``; live polling),
  without the producers of the streams ``S``.
- ``/api/spans?run=ID[&start=&stop=]``: mean ms per span path over a step range.
- ``/api/trace?run=ID[&start=&stop=]``: the Chrome Trace JSON (download, for Perfetto).
- ``/api/compare?run=A&run=B...``: config/summary differences and the metrics of the runs.
- ``/api/groups?run=A&run=B...&by=KEYS|auto[&metric=M&agg=mean|median&band=...&width=W]``:
  the runs grouped by config keys, and one metric's line and band per group
  (``ui/groups.py``).
- ``/api/sweep?[run=A...][&metric=M][&group=G]``: the sweep of the runs (varying config
  keys, the metric per run, importance and correlations; ``query/sweep.py``).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from expr_tracker.history.values import json_safe
from expr_tracker.ui import compare, groups, media, overlay, runpage, runs, series, spans
from expr_tracker.ui.catalog import Catalog
from expr_tracker.ui.errors import BadRequest, NotFound, Unreadable, why
from expr_tracker.ui.parts import parts_read

INSTALL_HINT = "pip install 'expr-tracker[ui]'"
#: heavy requests (a Chrome trace, a compare) served at once; more are answered 503
HEAVY_LIMIT = 2
#: the ``Retry-After`` of that 503, seconds
RETRY_AFTER_S = 5
#: seconds between two refreshes of a served source (``et ui s3://...``): a page load
#: within this time of the last refresh reads the copy as it is
REFRESH_TTL = 2.0
#: the methods served; anything else is refused (405) with :data:`READ_ONLY`
READ_METHODS = ("GET", "HEAD")
READ_ONLY = (
    "read-only: the dashboard changes nothing; tag, archive, rename or remove runs with "
    "et runs tag|archive|mv|rm where they are written"
)

_STATIC = ("app.js", "media.js", "style.css")
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
#: headers of every response: no framing, no sniffing, scripts only from this server
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
        "frame-ancestors 'none'"
    ),
}


def import_web() -> tuple[Any, Any]:
    """(starlette, uvicorn) or ImportError naming the extra (also when duckdb or pyarrow,
    which the data goes through, is missing)."""
    try:
        import duckdb  # noqa: F401
        import pyarrow  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn
        from starlette import applications
    except ImportError as exc:
        raise ImportError(
            f"et ui needs starlette and uvicorn ({exc.name} is missing): {INSTALL_HINT}"
        ) from exc
    return applications, uvicorn


def plotly_js() -> bytes:
    """plotly.js as bundled by the plotly Python package (ImportError naming the extra)."""
    try:
        import plotly
    except ImportError as exc:
        raise ImportError(f"et ui needs plotly (its bundled plotly.js): {INSTALL_HINT}") from exc
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if path.is_file():
        return path.read_bytes()
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode("utf-8")


def _static(name: str) -> bytes:
    return resources.files("expr_tracker.ui").joinpath("static", name).read_bytes()


def _cache_trouble(exc: Exception, parts: list[Path]) -> bool:
    """True when ``exc`` (DuckDB's or pyarrow's) came from a cache part that vanished or is
    damaged, now rebuilt: worth answering the request again."""
    import pyarrow as pa

    from expr_tracker.query.api import recover_cache
    from expr_tracker.query.views import import_duckdb

    if not isinstance(exc, (import_duckdb().Error, pa.ArrowException)):
        return False
    return recover_cache(exc, parts=[str(p) for p in parts])


def _dumps(obj: Any) -> bytes:
    return json.dumps(json_safe(obj, "string"), allow_nan=False, separators=(",", ":")).encode(
        "utf-8"
    )


class _Heavy:
    """At most ``limit`` heavy requests (a trace, a compare) at once; another one is
    answered 503 with ``Retry-After`` rather than queued (whoever reaches the port cannot
    stack up memory and CPU)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._sem = threading.BoundedSemaphore(limit)

    def try_acquire(self) -> bool:
        return self._sem.acquire(blocking=False)

    def release(self) -> None:
        self._sem.release()


def create_app(
    root: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    token: str | None = None,
    host: str | None = None,
    port: int | None = None,
    heavy_limit: int = HEAVY_LIMIT,
    source: str | None = None,
    refresh: Callable[[], Sequence[str]] | None = None,
):
    """The Starlette app serving the runs under ``root``.

    Every request must name one of the server's own hosts in its ``Host`` header (the
    loopback names and ``host``, the address bound; others get 403); with ``token`` every
    request but the static files must carry it (cookie, ``Authorization: token X`` or
    ``?token=X``; others get 401), see :mod:`expr_tracker.ui.guard`. ``token`` None: no
    token (``et ui --no-token``; ``et ui`` itself always passes one unless told so).
    ``port``: names the login cookie (one per port). ``heavy_limit``: traces and compares
    served at once (more: 503).

    ``source``: what ``root`` stands for, when it is a copy (``s3://bucket/prefix`` for
    ``et ui s3://...``): ``/api/runs`` names it, and a refused write says so.
    ``refresh``: called (at most every :data:`REFRESH_TTL` seconds, one at a time, in a
    worker thread) before ``/api/runs``, ``/api/run`` and ``/api/points`` (a live page's
    polling) answer, to bring ``root`` up to date
    with ``source`` (docs/team.md "The dashboard over a bucket"); it returns problems to
    report (``/api/runs`` ``refresh_problems``), and an exception it raises is reported the
    same way (``refresh_error``) while the copy is served as it is.

    Only GET and HEAD are served: any other method is answered 405 with a JSON ``error``
    saying the dashboard is read-only (:data:`READ_ONLY`).

    Raises:
        ImportError: starlette, uvicorn or plotly missing (names the extra).
        FileNotFoundError: ``root`` is not a folder.
        ValueError: a token that cannot travel in a URL or cookie (see
            :func:`expr_tracker.ui.guard.check_token`).
    """
    import_web()
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.middleware import Middleware
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    from expr_tracker.ui.guard import Guard, allowed_hosts, check_token, cookie_name

    if token is not None:
        check_token(token)
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"DIR {str(root)!r} is not a folder (a folder of runs or a run)")
    catalog = Catalog(root, cache_dir)
    heavy = _Heavy(heavy_limit)
    refresher = _Refresher(refresh, catalog) if refresh is not None else None
    assets = {name: _static(name) for name in _STATIC}
    assets["plotly.min.js"] = plotly_js()
    index = _static("index.html")

    def respond(body: bytes, media: str, status: int = 200, headers: dict | None = None):
        h = dict(SECURITY_HEADERS)
        h["Cache-Control"] = "no-store"
        h.update(headers or {})
        return Response(body, status_code=status, media_type=media, headers=h)

    def as_json(obj: Any, status: int = 200) -> Any:
        return respond(_dumps(obj), "application/json", status)

    def q_int(request: Any, name: str, default: int | None = None) -> int | None:
        v = request.query_params.get(name)
        if v is None or v == "":
            return default
        try:
            return int(v)
        except ValueError:
            raise BadRequest(f"{name}={v!r} is not an integer") from None

    def q_str(request: Any, name: str) -> str:
        v = request.query_params.get(name)
        if not v:
            raise BadRequest(f"missing query parameter {name!r}")
        return v

    def q_smooth(request: Any) -> Any:
        from expr_tracker.history.smoothing import parse_smoothing

        try:
            return parse_smoothing(request.query_params.get("smooth"))
        except ValueError as exc:
            raise BadRequest(str(exc)) from None

    def busy() -> Any:
        return respond(
            _dumps({"error": f"busy: {heavy.limit} traces or compares are being made; retry"}),
            "application/json",
            503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    def failure(exc: BaseException) -> Any:
        """The answer to an error of a request (None: not one of ours)."""
        if isinstance(exc, NotFound):
            return as_json({"error": str(exc)}, 404)
        if isinstance(exc, FileNotFoundError):  # a run deleted while it was read
            return as_json({"error": f"gone: {exc}"}, 404)
        if isinstance(exc, BadRequest):
            return as_json({"error": str(exc)}, 400)
        if isinstance(exc, Unreadable):
            return as_json({"error": f"unreadable: {exc}"}, 422)
        if isinstance(exc, (OSError, RecursionError)):
            return as_json({"error": f"unreadable: {why(exc)}"}, 422)
        return None

    def endpoint(fn: Any, is_heavy: bool = False) -> Any:
        def handler(request: Any) -> Any:
            if is_heavy and not heavy.try_acquire():
                return busy()
            try:
                for attempt in (1, 2, 3):
                    with parts_read() as parts:
                        try:
                            return as_json(fn(request))
                        except Exception as exc:
                            # a cache part deleted or damaged under the request: its cache
                            # is rebuilt (query.api.recover_cache) and the request answered
                            # again
                            if attempt < 3 and _cache_trouble(exc, parts):
                                continue
                            answer = failure(exc)
                            if answer is None:
                                raise
                            return answer
                raise AssertionError("unreachable")  # pragma: no cover
            finally:
                if is_heavy:
                    heavy.release()

        return handler

    def page(request: Any) -> Any:
        return respond(index, "text/html; charset=utf-8")

    def static(request: Any) -> Any:
        name = request.path_params["name"]
        body = assets.get(name)
        if body is None:
            return respond(b"not found", "text/plain", 404)
        return respond(body, _TYPES[Path(name).suffix], headers={"Cache-Control": "max-age=3600"})

    def api_runs(request: Any) -> Any:
        q = request.query_params
        state = refresher() if refresher is not None else {}
        return {
            "root": str(root),
            **({"source": source} if source is not None else {}),
            **state,
            **runs.runs_page(
                catalog,
                columns=q.get("columns"),
                sort=q.get("sort"),
                where=q.get("where"),
                archived=q.get("archived") in ("1", "true"),
            ),
        }

    def api_run(request: Any) -> Any:
        qp = request.query_params
        pin = [m for v in qp.getlist("pin") for m in v.split(",") if m]
        if refresher is not None:
            refresher()
        return runpage.run_detail(
            catalog, q_str(request, "run"), pin=pin, baseline=qp.get("baseline") or None
        )

    def api_media(request: Any) -> Any:
        return media.media_section(catalog, q_str(request, "run"))

    def api_media_table(request: Any) -> Any:
        qp = request.query_params
        limit = q_int(request, "limit", 25)
        return media.media_table(
            catalog,
            q_str(request, "run"),
            q_str(request, "path"),
            offset=q_int(request, "offset", 0) or 0,
            limit=25 if limit is None else limit,
            sort=qp.get("sort") or None,
            desc=qp.get("desc") in ("1", "true"),
        )

    def media_file(request: Any) -> Any:
        """One media file of a run (ui/media.py): its own Content-Type, nosniff, and a
        sandbox so even a file a browser would run cannot run here."""
        try:
            body, ctype = media.media_file(catalog, q_str(request, "run"), q_str(request, "path"))
        except Exception as exc:
            answer = failure(exc)
            if answer is None:
                raise
            return answer
        return respond(
            body,
            ctype,
            headers={
                "Cache-Control": "private, max-age=86400, immutable",  # named by its hash
                "Content-Security-Policy": "default-src 'none'; sandbox",
            },
        )

    def api_series(request: Any) -> Any:
        qp = request.query_params
        return series.series(
            catalog,
            q_str(request, "run"),
            q_str(request, "metric"),
            x=qp.get("x") or "step",
            width=q_int(request, "width", 1000),  # type: ignore[arg-type]
            lo=series.parse_float("lo", qp.get("lo")),
            hi=series.parse_float("hi", qp.get("hi")),
            producer=qp.get("producer") or None,
            smooth=q_smooth(request),
        )

    def api_overlay(request: Any) -> Any:
        qp = request.query_params
        return overlay.overlay(
            catalog,
            qp.getlist("run"),
            q_str(request, "metric"),
            width=q_int(request, "width", 1000),  # type: ignore[arg-type]
            lo=series.parse_float("lo", qp.get("lo")),
            hi=series.parse_float("hi", qp.get("hi")),
            pixels=qp.get("pixels") == "1",
        )

    def api_points(request: Any) -> Any:
        since: dict[str, int] = {}
        for v in request.query_params.getlist("since"):
            label, sep, step = v.rpartition(":")
            try:
                since[label] = int(step)
            except ValueError:
                raise BadRequest(f"since={v!r} is not PRODUCER:STEP") from None
            if not sep or not label:
                raise BadRequest(f"since={v!r} is not PRODUCER:STEP")
        if refresher is not None:  # a live run's page polls: follow the bucket's syncs
            refresher()
        return series.new_points(
            catalog,
            q_str(request, "run"),
            q_int(request, "after", -1),  # type: ignore[arg-type]
            request.query_params.get("x") or "step",
            since,
            skip_streams=tuple(request.query_params.getlist("skip_stream")),
        )

    def api_spans(request: Any) -> Any:
        return spans.span_breakdown(
            catalog, q_str(request, "run"), q_int(request, "start"), q_int(request, "stop")
        )

    async def api_trace(request: Any) -> Any:
        # streamed (et trace's SQLite spool): memory does not grow with the spans; one of
        # the heavy requests, its slot held until the last byte is sent or the client left
        if not heavy.try_acquire():
            return busy()
        try:
            run = q_str(request, "run")
            start, stop = q_int(request, "start"), q_int(request, "stop")
            chunks = await run_in_threadpool(spans.trace_chunks, catalog, run, start, stop)
        except Exception as exc:
            heavy.release()
            answer = failure(exc)
            if answer is None and isinstance(exc, ValueError):  # a malformed range
                answer = as_json({"error": str(exc)}, 400)
            if answer is None:
                raise
            return answer
        h = dict(SECURITY_HEADERS)
        h["Cache-Control"] = "no-store"
        h["Content-Disposition"] = 'attachment; filename="trace.json"'
        return _Stream(chunks, heavy.release, media_type="application/json", headers=h)

    class _Stream(StreamingResponse):
        """A streamed body whose iterator is closed (its spool removed) and whose heavy
        slot is released when the response ends, however it ends."""

        def __init__(self, it: Any, done: Any, **kw: Any) -> None:
            self._it, self._done = it, done
            super().__init__(_pull(it), **kw)

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            try:
                await super().__call__(scope, receive, send)
            finally:
                try:
                    self._it.close()
                finally:
                    self._done()

    async def _pull(it: Any) -> Any:
        while True:
            chunk = await run_in_threadpool(next, it, None)
            if chunk is None:
                return
            yield chunk

    def api_compare(request: Any) -> Any:
        return compare.compare(catalog, request.query_params.getlist("run"))

    def api_groups(request: Any) -> Any:
        from expr_tracker.query.stats import AGGREGATES, BANDS

        agg = request.query_params.get("agg") or "mean"
        band = request.query_params.get("band") or "std"
        if agg not in AGGREGATES:
            raise BadRequest(f"agg={agg!r} is not valid: one of {', '.join(AGGREGATES)}")
        if band not in BANDS:
            raise BadRequest(f"band={band!r} is not valid: one of {', '.join(BANDS)}")
        return groups.groups(
            catalog,
            request.query_params.getlist("run"),
            request.query_params.get("by") or "auto",
            metric=request.query_params.get("metric") or None,
            agg=agg,
            band=band,
            width=q_int(request, "width", 1000),
        )

    def api_sweep(request: Any) -> Any:
        return groups.sweep_page(
            catalog,
            request.query_params.getlist("run"),
            request.query_params.get("metric"),
            request.query_params.get("group"),
        )

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/static/{name}", static, methods=["GET"]),
        Route("/api/runs", endpoint(api_runs), methods=["GET"]),
        Route("/api/run", endpoint(api_run), methods=["GET"]),
        Route("/api/media", endpoint(api_media), methods=["GET"]),
        Route("/api/media/file", media_file, methods=["GET"]),
        Route("/api/media/table", endpoint(api_media_table, is_heavy=True), methods=["GET"]),
        Route("/api/series", endpoint(api_series), methods=["GET"]),
        Route("/api/overlay", endpoint(api_overlay), methods=["GET"]),
        Route("/api/points", endpoint(api_points), methods=["GET"]),
        Route("/api/spans", endpoint(api_spans), methods=["GET"]),
        Route("/api/trace", api_trace, methods=["GET"]),
        Route("/api/compare", endpoint(api_compare, is_heavy=True), methods=["GET"]),
        Route("/api/groups", endpoint(api_groups, is_heavy=True), methods=["GET"]),
        Route("/api/sweep", endpoint(api_sweep, is_heavy=True), methods=["GET"]),
    ]
    guard = Middleware(
        Guard,
        hosts=allowed_hosts(host),
        token=token,
        cookie=cookie_name(port),
        headers=SECURITY_HEADERS,
    )
    refuse = READ_ONLY + (f" (for a bucket: there, then et sync to {source})" if source else "")
    read_only = Middleware(_ReadOnly, message=refuse, headers=SECURITY_HEADERS)
    app = Starlette(routes=routes, middleware=[guard, read_only])
    app.state.catalog = catalog
    return app


class _Refresher:
    """Brings the served folder up to date with its source (``refresh``), at most every
    :data:`REFRESH_TTL` seconds and one at a time (a request arriving meanwhile waits for the
    refresh under way, then reads what it brought); the catalog looks at the folder again
    after each. Returns what ``/api/runs`` reports of the last refresh."""

    def __init__(self, refresh: Callable[[], Sequence[str]], catalog: Catalog) -> None:
        import time

        self._refresh, self._catalog, self._clock = refresh, catalog, time.monotonic
        self._lock = threading.Lock()
        self._at = -1e18
        self._state: dict[str, Any] = {}

    def __call__(self) -> dict[str, Any]:
        with self._lock:
            if self._clock() - self._at >= REFRESH_TTL:
                try:
                    problems = list(self._refresh())
                    self._state = {"refresh_problems": problems} if problems else {}
                except Exception as exc:  # noqa: BLE001 - the copy is served as it is
                    self._state = {
                        "refresh_error": why(exc) if isinstance(exc, OSError) else str(exc)
                    }
                self._at = self._clock()
                self._catalog.invalidate()
            return dict(self._state)


class _ReadOnly:
    """ASGI middleware: requests of a method other than GET or HEAD are answered 405 (JSON
    ``error``: the dashboard is read-only, and where runs are changed), whatever the path."""

    def __init__(self, app: Any, *, message: str, headers: dict[str, str]) -> None:
        self.app = app
        self.body = _dumps({"error": message})
        self.headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.body)).encode()),
            (b"allow", b"GET, HEAD"),
            (b"cache-control", b"no-store"),
            *((k.lower().encode(), v.encode()) for k, v in headers.items()),
        ]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method", "GET") not in READ_METHODS:
            await send({"type": "http.response.start", "status": 405, "headers": self.headers})
            await send({"type": "http.response.body", "body": self.body})
            return
        await self.app(scope, receive, send)


def serve(
    root: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 8050,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    token: str | None = None,
    log_level: str = "warning",
    source: str | None = None,
    refresh: Callable[[], Sequence[str]] | None = None,
) -> None:
    """Serve the dashboard until interrupted (uvicorn); ``token``, ``source`` and
    ``refresh`` as :func:`create_app`."""
    _, uvicorn = import_web()
    app = create_app(
        root,
        cache_dir=cache_dir,
        token=token,
        host=host,
        port=port,
        source=source,
        refresh=refresh,
    )
    # no colour codes: et ui's stderr escapes control characters (warnings name run files)
    uvicorn.run(
        app, host=host, port=port, log_level=log_level, server_header=False, use_colors=False
    )
