"""The agent's export path (private): what happens to a span after it ends.

- ``processor``: ``GymSpanProcessor`` (the switch in front of the SDK's batch processor)
  and ``TrackingExporter`` (export health for ``shutdown_telemetry``).
- ``grpc_exporter``: the SDK's OTLP/gRPC exporter with the lean batch encoder plugged in.
- ``span_encoding`` and ``otlp_wire``: the lean encoder, span to wire-format bytes.
- ``probes``: the probe spans the start-up self-check compares against the stock encoder.

Nothing here is public API: users configure it through ``init_telemetry`` and the
environment (``GYM_TELEMETRY_ENCODER``, ``OTEL_*``). Every lean step checks itself
against the installed OpenTelemetry SDK first and falls back to the stock SDK path.
"""
