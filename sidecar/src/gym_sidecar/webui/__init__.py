"""The read-only web view of the embedded local store (``gym-sidecar ui``).

Server-rendered HTML with inline SVG; no build step, nothing fetched from elsewhere.
One small script of the project's own (``static/ui.js``) refreshes the rollouts list in
place; every page works without it (the list then reloads itself with a ``<meta>``
refresh). Every string from a span is escaped (:mod:`.html`), and a Content-Security-
Policy forbids any script or style not served from ``/static/``.

- :mod:`.html`: escaping, the page layout and the response headers;
- :mod:`.svg`: histograms, the success-over-time chart, the service map;
- :mod:`.waterfall`: one trace's rows, its completeness, the time axis;
- :mod:`.pages`: the rollouts, stats, map and message pages; :mod:`.trace_page`: a
  trace's waterfall;
- :mod:`.app`: the Starlette app (pages, static files, the Jaeger-compatible API of
  :mod:`gym_sidecar.query`); :mod:`.command`: the ``gym-sidecar ui`` subcommand.
"""
