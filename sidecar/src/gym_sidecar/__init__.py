"""gym_sidecar: the OTLP sidecar of gym-telemetry."""

__version__ = "0.1.0"
