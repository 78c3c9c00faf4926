"""Free loopback ports and waiting for a server to listen: the product's own helpers
(:mod:`gym_telemetry_demo.ports`), re-exported under the name the tests and benches import."""

from __future__ import annotations

from gym_telemetry_demo.ports import free_port, wait_listening

__all__ = ["free_port", "wait_listening"]
