"""How a failed OTLP/gRPC export call becomes an export outcome, for both gRPC clients.

Status codes map as the OTLP specification says: UNAVAILABLE, ABORTED, CANCELLED,
DEADLINE_EXCEEDED, OUT_OF_RANGE and DATA_LOSS are retryable; RESOURCE_EXHAUSTED is
retryable only when the server sent a ``google.rpc.RetryInfo`` (its delay is the hint);
everything else (INVALID_ARGUMENT, ...) is permanent. Kept apart from the grpcio
exporter so that the h2 client (the default) does not import grpc.
"""

from __future__ import annotations

from gym_sidecar.core.exporter import ExportResult
from gym_sidecar.core.grpc_status import StatusCode

_RETRYABLE = frozenset(
    {
        StatusCode.UNAVAILABLE,
        StatusCode.ABORTED,
        StatusCode.CANCELLED,
        StatusCode.DEADLINE_EXCEEDED,
        StatusCode.OUT_OF_RANGE,
        StatusCode.DATA_LOSS,
    }
)


def classify(code: StatusCode, details: str, hint_s: float | None) -> ExportResult:
    """Map a failed call's status to an export outcome (module doc)."""
    message = f"{code.name}: {details}"
    if code in _RETRYABLE:
        return ExportResult.retryable(message, hint_s)
    if code is StatusCode.RESOURCE_EXHAUSTED and hint_s is not None:
        return ExportResult.retryable(message, hint_s)
    return ExportResult.permanent(message)
