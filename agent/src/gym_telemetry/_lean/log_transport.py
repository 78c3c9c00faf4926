"""Sending OTLP log requests (already serialized) where the span exporter sends its spans.

The live events (``gym_telemetry._live``) go to the endpoint the agent's spans go to, with
the same channel, credentials, headers and compression, so every ``OTEL_EXPORTER_OTLP_*``
setting that applies to the spans applies to them. ``sender_for(exporter)`` returns a
``send(data, timeout_s) -> bool`` for the agent's span exporter, or None when it is of a
kind this module does not know (no live events then):

- the SDK's OTLP/gRPC span exporter (the lean one included): a unary call
  ``/opentelemetry.proto.collector.logs.v1.LogsService/Export`` with the bytes as they are
  on the exporter's current channel (``_channel``: it re-creates it after an
  ``UNAVAILABLE``), its headers (``_headers``) and at most its timeout (``_timeout``). One
  attempt: a failure returns False (the caller counts it; the next interval sends the
  state again).
- the SDK's OTLP/HTTP span exporter: the SDK's OTLP/HTTP *log* exporter (the same
  package), to the spans' URL with ``/v1/traces`` replaced by ``/v1/logs`` (a traces URL
  without that suffix: the log exporter's own resolution,
  ``OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/logs``),
  sending the bytes through its client's ``export`` (``_client``; SDK >= 1.4x) or its
  ``_export`` step (earlier), which retries within its own timeout.

``send`` never raises. Called from the live reporter's thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

_log = logging.getLogger(__name__)

LOGS_EXPORT_METHOD: Final = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
TRACES_PATH: Final = "/v1/traces"
LOGS_PATH: Final = "/v1/logs"
#: Longest a gRPC send may take when the exporter names no timeout.
DEFAULT_TIMEOUT_S: Final = 10.0

Sender = Callable[[bytes, float], bool]


def _identity(data: bytes) -> bytes:
    return data


class GrpcLogSender:
    """Sends serialized log requests on a gRPC span exporter's channel (module doc)."""

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter
        self._channel: Any = None
        self._call: Any = None

    def _current_call(self) -> Any:
        channel = self.exporter._channel
        if channel is None:
            return None
        if channel is not self._channel:
            self._call = channel.unary_unary(
                LOGS_EXPORT_METHOD,
                request_serializer=_identity,
                response_deserializer=_identity,
            )
            self._channel = channel
        return self._call

    def __call__(self, data: bytes, timeout_s: float) -> bool:
        try:
            call = self._current_call()
            if call is None:
                return False
            limit = getattr(self.exporter, "_timeout", None)
            if isinstance(limit, int | float) and limit > 0:
                timeout_s = min(timeout_s, float(limit))
            headers = getattr(self.exporter, "_headers", None) or None
            call(data, metadata=headers, timeout=max(0.05, timeout_s))
            return True
        except Exception:  # RpcError, a closed channel: the caller counts it
            _log.debug("gym_telemetry: live events not delivered", exc_info=True)
            return False


def _logs_url(traces_url: Any) -> str | None:
    if isinstance(traces_url, str) and traces_url.endswith(TRACES_PATH):
        return traces_url[: -len(TRACES_PATH)] + LOGS_PATH
    return None


def http_sender(exporter: Any) -> Sender | None:
    """A sender through the SDK's OTLP/HTTP log exporter (module doc), or None."""
    try:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    except ImportError:
        return None
    logs = OTLPLogExporter(endpoint=_logs_url(getattr(exporter, "_endpoint", None)))
    client = getattr(logs, "_client", None)
    client_export = getattr(client, "export", None)
    if callable(client_export):

        def send_client(data: bytes, timeout_s: float) -> bool:
            try:
                return bool(getattr(client_export(data), "success", False))
            except Exception:  # transport errors: the caller counts it
                _log.debug("gym_telemetry: live events not delivered", exc_info=True)
                return False

        return send_client
    step = getattr(logs, "_export", None)
    if callable(step):

        def send_step(data: bytes, timeout_s: float) -> bool:
            try:
                return bool(getattr(step(data), "ok", False))
            except Exception:  # transport errors: the caller counts it
                _log.debug("gym_telemetry: live events not delivered", exc_info=True)
                return False

        return send_step
    return None


def sender_for(exporter: Any) -> Sender | None:
    """How to send log requests where ``exporter`` sends spans (module doc), or None."""
    try:
        if getattr(exporter, "_channel", None) is not None:
            return GrpcLogSender(exporter)
        module = type(exporter).__module__
        if module.startswith("opentelemetry.exporter.otlp.proto.http"):
            return http_sender(exporter)
    except Exception:  # an exporter of another shape: no live events
        _log.debug("gym_telemetry: no live-event sender for %r", exporter, exc_info=True)
    return None


__all__ = ["GrpcLogSender", "Sender", "http_sender", "sender_for"]
