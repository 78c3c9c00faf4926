"""The sidecar launcher the tests use: the demo package's
(:mod:`gym_telemetry_demo.sidecar`, shared with the demo and the benchmarks), re-exported
under the name the tests import."""

from __future__ import annotations

from gym_telemetry_demo.sidecar import DEFAULT_STARTUP_TIMEOUT_S, SidecarProcess

__all__ = ["DEFAULT_STARTUP_TIMEOUT_S", "SidecarProcess"]
