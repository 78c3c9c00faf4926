"""A Jaeger-compatible HTTP query API over the embedded local store (docs/local-store.md).

- :mod:`.api`: the routes of both lines, the classic ``/api/...`` and API v3;
- :mod:`.model`: stored spans to the classic JSON that Jaeger's query service answers;
- :mod:`.search`: which stored traces match a search, and the classic search parameters;
- :mod:`.v3`, :mod:`.v3_params`, :mod:`.otlp_json`: API v3 (OTLP/JSON traces, trace
  summaries) and its parameters;
- :mod:`.dependencies`: the service graph (``/api/dependencies`` and the web view's map);
- :mod:`.spm`: the Monitor tab's RED metrics from stored spans;
- :mod:`.common`: what the lines share (connections, trace ids, operations, bounds).

Reads go through :mod:`gym_sidecar.store.queries`; nothing here writes.
"""
