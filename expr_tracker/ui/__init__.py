"""``et ui``: a local, read-only web dashboard over run directories.

:mod:`expr_tracker.ui.data` computes what the pages show (runs, downsampled series, span
breakdowns, comparisons) through the query package's columnar cache and DuckDB;
:mod:`expr_tracker.ui.server` serves it with Starlette and uvicorn and the page from
``static/`` (HTML, one JS file, CSS; plotly.js from the plotly Python package). Nothing is
imported here: the web stack (the ``[ui]`` extra) loads only when ``et ui`` runs.
"""
