"""One HTTP listener's connection limits and how they are counted.

The limits uvicorn never had, kept from the listener that subclassed it: a connection
cap answered 503, an idle timeout, a header timeout answered 408 and a header-size cap
answered 431 (:mod:`gym_sidecar.wire.http1.protocol` enforces them); and the lingering
close after each of those answers (``close_linger_s``, :mod:`gym_sidecar.wire.linger`).
Each refusal is counted in ``limit_hits{limit=<limits. key>}``; an unparsable request (400) in
``bad_requests{transport, reason="malformed"}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gym_sidecar.config import LimitsConfig
from gym_sidecar.selfmetrics import SelfMetrics
from gym_sidecar.wire.linger import LINGER_LIMIT, Lingering

HEADER_BYTES = "http_max_header_bytes"
HEADER_TIMEOUT = "http_header_timeout_s"
IDLE_TIMEOUT = "http_idle_timeout_s"


@dataclass
class ConnectionLimits:
    """One listener's connection limits, the ``limits.`` keys they are counted under,
    and its open-connection count (loop-confined, no locking)."""

    metrics: SelfMetrics
    max_connections: int
    max_header_bytes: int
    header_timeout_s: float
    idle_timeout_s: float
    max_connections_key: str
    """``limit_hits`` label when ``max_connections`` bites (one key per listener)."""
    transport: str = "http"
    """``bad_requests`` label of the listener's malformed requests (``http``, ``admin``)."""
    close_linger_s: float = 2.0
    """How long a connection closed after a refusal drains before it is dropped."""
    open_connections: int = field(default=0, init=False)
    lingering: Lingering = field(init=False)
    """The listener's connections closing after their last response."""

    def __post_init__(self) -> None:
        self.lingering = Lingering(self.close_linger_s, self._linger_expired)

    def _linger_expired(self) -> None:
        self.hit(LINGER_LIMIT)

    @classmethod
    def from_config(
        cls,
        limits: LimitsConfig,
        metrics: SelfMetrics,
        max_connections_key: str,
        transport: str = "http",
    ) -> ConnectionLimits:
        """The shared header/idle limits plus the listener's own ``max_connections_key``
        (``http_max_connections`` or ``admin_max_connections``)."""
        return cls(
            metrics=metrics,
            max_connections=int(getattr(limits, max_connections_key)),
            max_header_bytes=limits.http_max_header_bytes,
            header_timeout_s=limits.http_header_timeout_s,
            idle_timeout_s=limits.http_idle_timeout_s,
            max_connections_key=max_connections_key,
            transport=transport,
            close_linger_s=limits.close_linger_s,
        )

    def hit(self, limit: str) -> None:
        self.metrics.limit_hits.labels(limit).inc()

    def malformed(self) -> None:
        self.metrics.bad_requests.labels(self.transport, "malformed").inc()
