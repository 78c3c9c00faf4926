"""The embedded local trace store: spans and ``gym.*`` metric points in SQLite.

- :mod:`.config`: the ``local_store`` config section and the default data directory;
- :mod:`.rows`: OTLP requests to rows; :mod:`.db`: schema, inserts, retention;
- :mod:`.writer`: the batching writer thread; :mod:`.exporter`: the store as an
  :class:`~gym_sidecar.export.base.Exporter`;
- :mod:`.queries`: what the inspection commands read.
"""
