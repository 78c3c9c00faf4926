"""gym_telemetry: in-process OpenTelemetry instrumentation for NeMo Gym servers."""
