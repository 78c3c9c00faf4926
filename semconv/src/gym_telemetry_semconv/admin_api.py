"""The sidecar's admin listener: its default port and the paths it serves.

The sidecar mounts these routes; the agent's span-group poller, the Kubernetes
injector's probes and the tests call them. Each path is written here once.
"""

from __future__ import annotations

from typing import Final

DEFAULT_ADMIN_PORT: Final = 13133
"""Port of the admin listener (``127.0.0.1`` by default on the sidecar)."""

SPAN_GROUPS_PATH: Final = "/v1/span-groups"
"""``GET`` (``?service=NAME``) the effective span groups; ``PUT`` replaces them."""
HEALTHZ_PATH: Final = "/healthz"
READYZ_PATH: Final = "/readyz"
METRICS_PATH: Final = "/metrics"
"""Prometheus exposition of the sidecar's own and derived metrics."""
