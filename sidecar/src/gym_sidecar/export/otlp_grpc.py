"""OTLP/gRPC exporter: unary ``Export`` calls carrying already-serialized requests.

The channel uses identity serialization (the payload bytes go out as they are) and
parses only the small response for ``partial_success``. Status codes map to outcomes
as :mod:`.grpc_outcome` says (the OTLP specification's table, shared with the h2
client); a RetryInfo delay in the trailing status details is passed on as the hint.
Used only with ``backend.grpc_client: grpcio``: it is the one module of the sidecar that
imports grpc core.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import grpc

from gym_sidecar.core.exporter import Exporter, ExportResult
from gym_sidecar.core.grpc_status import StatusCode, retry_delay_s
from gym_sidecar.core.signals import SPECS, rejected_items
from gym_sidecar.core.stage import Signal
from gym_sidecar.export import grpc_outcome
from gym_sidecar.export.config import BackendConfig

logger = logging.getLogger(__name__)

_METHODS = {signal: spec.grpc_method for signal, spec in SPECS.items()}


def classify(code: grpc.StatusCode, details: str, hint_s: float | None) -> ExportResult:
    """Map a failed call's status to an export outcome (:mod:`.grpc_outcome`)."""
    return grpc_outcome.classify(StatusCode(code.value[0]), details, hint_s)


def grpc_target(url: str) -> tuple[str, bool]:
    """``http(s)://host:port[/...]`` -> (``host:port``, use TLS)."""
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 4317)
    host = parts.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{port}", tls


class OtlpGrpcExporter(Exporter):
    """Exports over one ``grpc.aio`` channel (HTTP/2 multiplexes concurrent calls).

    Must be created and used on the running event loop.
    """

    name = "otlp_grpc"

    def __init__(self, config: BackendConfig) -> None:
        if config.url is None:
            raise ValueError("OtlpGrpcExporter needs backend.url")
        target, tls = grpc_target(config.url)
        self.target = target
        options = [("grpc.max_send_message_length", -1)]
        if tls:
            creds = grpc.ssl_channel_credentials()
            self._channel = grpc.aio.secure_channel(target, creds, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        self._timeout_s = config.timeout_s
        self._compression = (
            grpc.Compression.Gzip
            if config.compression == "gzip"
            else grpc.Compression.NoCompression
        )
        self._metadata = tuple((k.lower(), v) for k, v in config.headers.items())
        self._calls: dict[Signal, Callable[..., Any]] = {
            signal: self._channel.unary_unary(method) for signal, method in _METHODS.items()
        }
        self._closed = False

    async def export(self, signal: Signal, payload: bytes, items: int) -> ExportResult:
        try:
            response: bytes = await self._calls[signal](
                payload,
                timeout=self._timeout_s,
                metadata=self._metadata,
                compression=self._compression,
            )
        except grpc.aio.AioRpcError as err:
            hint = retry_delay_s(err.trailing_metadata())
            return classify(err.code(), err.details() or "", hint)
        rejected, message = rejected_items(signal, response)
        return ExportResult.success(min(rejected, items), message)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._channel.close()
