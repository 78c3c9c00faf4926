"""The exporter interface: send one serialized OTLP export request, report the outcome.

An :class:`Exporter` sends ``payload`` (a serialized ``Export*ServiceRequest``; several
serialized requests of one signal concatenated are still one valid request, because
protobuf merges repeated fields on concatenation) and returns an :class:`ExportResult`.
It never raises for remote or network errors: the sender decides what to do from the
result's outcome (retry with backoff, or drop and count). Implementations: OTLP/gRPC
(:mod:`gym_sidecar.export.otlp_grpc`), OTLP/HTTP (:mod:`gym_sidecar.export.otlp_http`),
the fan-out (:mod:`gym_sidecar.export.fanout`) and the embedded store
(:mod:`gym_sidecar.store.exporter`); the last two live in different areas and meet only
here, in core.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from gym_sidecar.core.stage import Signal


class Outcome(enum.Enum):
    SUCCESS = "success"
    RETRYABLE = "retryable"
    PERMANENT = "permanent"


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What became of one export request."""

    outcome: Outcome
    retry_after_s: float | None = None
    """RETRYABLE only: the server's hint (RetryInfo / Retry-After), if it gave one."""
    message: str = ""
    """Why it failed, or the backend's partial-success message."""
    rejected_items: int = 0
    """SUCCESS only: items the backend reported as rejected in ``partial_success``."""

    @classmethod
    def success(cls, rejected_items: int = 0, message: str = "") -> ExportResult:
        return cls(Outcome.SUCCESS, rejected_items=rejected_items, message=message)

    @classmethod
    def retryable(cls, message: str, retry_after_s: float | None = None) -> ExportResult:
        return cls(Outcome.RETRYABLE, retry_after_s=retry_after_s, message=message)

    @classmethod
    def permanent(cls, message: str) -> ExportResult:
        return cls(Outcome.PERMANENT, message=message)


class Exporter(abc.ABC):
    """Sends serialized export requests to one destination.

    Lifecycle: created idle, ``export`` may be called concurrently from several tasks on
    one event loop, ``close`` once at the end (safe to call twice).
    """

    name: str = "exporter"

    @abc.abstractmethod
    async def export(self, signal: Signal, payload: bytes, items: int) -> ExportResult:
        """Send ``payload`` (``items`` spans/points/records) and report the outcome.

        Never raises for remote errors, timeouts or refused connections; those become
        RETRYABLE or PERMANENT results. Cancellation propagates.
        """

    async def export_parts(
        self, signal: Signal, parts: Sequence[bytes | memoryview], items: int
    ) -> ExportResult:
        """:meth:`export` of the concatenation of ``parts`` (a leased batch as the queue
        holds it; none of them is modified). This default joins them, one copy of the
        batch; an exporter that can send or compress the pieces as they are overrides
        it. The sender passes the same ``parts`` object again when it retries."""
        if len(parts) == 1 and isinstance(parts[0], bytes):
            return await self.export(signal, parts[0], items)
        return await self.export(signal, b"".join(parts), items)

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections. Calls to ``export`` after this are not allowed."""
