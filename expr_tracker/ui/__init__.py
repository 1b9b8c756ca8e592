"""``et ui``: a local, read-only web dashboard over run directories.

One module per page computes what it shows: ``runs`` (the runs table), ``runpage`` (a
run's metrics, config, summary, alerts), ``series`` (downsampled charts, live points),
``spans`` (span breakdown, Chrome Trace) and ``compare``, over the runs ``catalog`` finds
and looks up, reading the query package's columnar cache with DuckDB (``parts``);
:mod:`expr_tracker.ui.server` serves them with Starlette and uvicorn and the page from
``static/`` (HTML, one JS file, CSS; plotly.js from the plotly Python package). Nothing is
imported here: the web stack (the ``[ui]`` extra) loads only when ``et ui`` runs.
"""
