"""A Jaeger-compatible HTTP query API over the embedded local store (docs/local-store.md).

- :mod:`.model`: stored spans to the JSON that Jaeger's query service answers (the shape
  Jaeger's UI and Grafana's Jaeger data source read);
- :mod:`.search`: the ``/api/traces`` search parameters, parsed and matched;
- :mod:`.api`: the routes (``/api/services``, ``/api/services/{service}/operations``,
  ``/api/operations``, ``/api/traces``, ``/api/traces/{traceID}``).

Reads go through :mod:`gym_sidecar.store.queries`; nothing here writes.
"""
