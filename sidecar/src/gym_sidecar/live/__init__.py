"""Rollouts live (issue 41): which rollouts are running now, which are stalled, which were
lost, from the agents' live events (``gym_telemetry_semconv.live``).

- :mod:`.config`: the ``rollouts`` config section;
- :mod:`.events`: live-event log records and resources read into plain values;
- :mod:`.tracker`: the rollouts in flight per server instance, and their transitions;
- :mod:`.stage`: the pipeline stage that consumes the live events (and notes every
  request as a sign of its sender's life);
- :mod:`.view`: the live view's JSON shape; :mod:`.api`: ``GET /v1/rollouts/live`` on the
  admin listener; :mod:`.client`: reading it from another process;
- :mod:`.command`, :mod:`.render`: ``gym-sidecar live`` in the terminal.
"""
