"""The agent's export switch (private): what happens to a span after it ends.

- ``processor``: ``GymSpanProcessor`` (the switch in front of the SDK's batch processor)
  and ``TrackingExporter`` (export health for ``shutdown_telemetry``), and the rate limit
  on the SDK's export loggers.

The lean encoder and exporter it plugs in, and every access to the SDK's internals
(the batch queue included), are in ``gym_telemetry._lean``. Nothing here is public API:
users configure it through ``init_telemetry`` and the environment
(``gym_telemetry.environment_variables``).
"""
