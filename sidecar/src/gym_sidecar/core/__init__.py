"""The sidecar's contracts: what every area agrees on, and nothing else.

- :mod:`.stage`: the pipeline stage contract (:class:`~.stage.Signal`,
  :class:`~.stage.Batch`, :class:`~.stage.Stage`, :class:`~.stage.Backpressure`) and
  :class:`~.stage.ProcessorStage`, the helper every stage is built on (it counts and
  forwards, as the OpenTelemetry Collector's processorhelper does);
- :mod:`.exporter`: the exporter contract (:class:`~.exporter.Exporter`,
  :class:`~.exporter.ExportResult`, :class:`~.exporter.Outcome`);
- :mod:`.otlp`: the one per-signal OTLP table (message classes, gRPC service and method,
  HTTP path, content types, item counting, ``partial_success`` fields);
- :mod:`.downward_api`: the Kubernetes downward-API names (podinfo volume, variables)
  the injection webhook sets and the Kubernetes enrichment reads.

Layering (checked by ``tests/sidecar/test_layers.py``): ``core`` imports only the
standard library, protobuf / opentelemetry-proto and the leaf
:mod:`gym_sidecar.selfmetrics`; every area (receiver, enrich, metrics, gating, export,
store, ...) may import ``core``; ``core`` never imports an area.
"""
