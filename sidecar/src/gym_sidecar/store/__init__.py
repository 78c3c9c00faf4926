"""The embedded local trace store: trace requests, rollout/verify spans and ``gym.*``
metric points in one SQLite file (docs/local-store.md).

- :mod:`.config`: the ``local_store`` config section and the default data directory;
- :mod:`.rows`: OTLP requests to index rows; :mod:`.db`: schema, inserts, retention;
- :mod:`.writer`: the batching writer thread; :mod:`.exporter`: the store as an
  :class:`~gym_sidecar.core.exporter.Exporter`;
- :mod:`.queries` and :mod:`.stats`: what the inspection commands read.
"""
