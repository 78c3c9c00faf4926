"""OTLP/gRPC receiver: TraceService, MetricsService and LogsService ``Export``.

Handlers are registered generically with identity (bytes) (de)serialisers, so the
receiver itself enforces ``limits.grpc_max_message_bytes`` (counted in
``limit_hits{limit="grpc_max_message_bytes"}``) and decodes the message bytes itself
(``receiver.otlp.decode_batch``: a trace request's wire view, metrics and logs with the
upb protobuf).
grpc core handles client-side per-message compression (gzip), bounded by
``limits.grpc_transport_max_bytes``, and the connection-level limits (idle timeout,
connection cap, streams per connection, metadata size), which it enforces without
telling the sidecar: those refusals are not counted.

Answers:
- OK with an Export*ServiceResponse (``partial_success`` when a stage rejected items);
- INVALID_ARGUMENT for undecodable or oversized messages, for messages nested deeper
  than ``limits.max_message_depth`` or holding more than ``limits.max_request_messages``
  protobuf messages, and for a call that ends without one whole
  message or sends more than one (clients must not retry);
- RESOURCE_EXHAUSTED (without RetryInfo: not to be retried) when the call's metadata
  exceeds ``limits.http_max_header_bytes``;
- DEADLINE_EXCEEDED when the message and the end of the client's stream have not
  arrived within ``limits.grpc_message_timeout_s`` (counted in ``limit_hits``);
- RESOURCE_EXHAUSTED with RetryInfo when ``limits.grpc_max_concurrent_requests`` calls
  are already being handled (counted in ``limit_hits``);
- RESOURCE_EXHAUSTED with a ``google.rpc.RetryInfo`` on backpressure, both as a status
  detail and as a bare ``google.rpc.retryinfo-bin`` trailer (the OTel SDK exporters
  retry after the given delay; the Python one reads only the trailer).

Lifecycle: :meth:`GrpcReceiver.start` binds and serves on the running loop;
:meth:`GrpcReceiver.stop` stops accepting and waits up to ``grace_s`` for in-flight
calls (which finish handing their data to the pipeline). Both are safe to repeat.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status  # type: ignore[import-untyped]

from gym_sidecar.config import LimitsConfig
from gym_sidecar.core.otlp import SPECS, SignalSpec
from gym_sidecar.core.stage import Stage, pipeline_trace_scan
from gym_sidecar.hostport import bound_address
from gym_sidecar.receiver.otlp import BadRequest, build_response, decode_batch, submit
from gym_sidecar.selfmetrics import SelfMetrics

logger = logging.getLogger(__name__)

TRANSPORT = "grpc"


def _identity(data: bytes) -> bytes:
    return data


def refuse(
    context: grpc.aio.ServicerContext[Any, Any],
    details: str,
    code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT,
    trailing_metadata: Any = None,
) -> bytes:
    """Answer with an error status by setting it instead of calling ``context.abort``.

    ``abort`` raises, and the exception's traceback keeps the handler frames, with the
    request bytes (and the parsed message), alive in a reference cycle until the cyclic
    GC runs: refused messages then pile up (20 MiB refusals grew RSS to ~800 MiB in
    tests/badinput's stress). Returning frees them at once.
    """
    context.set_code(code)
    context.set_details(details)
    if trailing_metadata:
        context.set_trailing_metadata(trailing_metadata)
    return b""


RETRY_INFO_TRAILER = "google.rpc.retryinfo-bin"
"""The bare RetryInfo trailer: the only place the OTel Python gRPC exporter reads a delay."""


class RetryStatus(NamedTuple):
    """What ``context.abort`` needs: code, message and trailing metadata."""

    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, bytes], ...]


def retry_info_status(message: str, retry_after_s: float) -> RetryStatus:
    """A RESOURCE_EXHAUSTED status carrying RetryInfo(retry_delay=retry_after_s).

    The RetryInfo goes out twice: as a detail of the ``grpc-status-details-bin`` status
    (the gRPC richer-error model, read by the Go/Java SDKs and the Collector) and as a
    bare ``google.rpc.retryinfo-bin`` trailer (read by the Python SDK's exporter, which
    otherwise falls back to its own 1 s, 2 s, 4 s ... backoff).
    """
    seconds = int(retry_after_s)
    delay = duration_pb2.Duration(seconds=seconds, nanos=int((retry_after_s - seconds) * 1e9))
    info = error_details_pb2.RetryInfo(retry_delay=delay)
    status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=message)
    status.details.add().Pack(info)
    rich = rpc_status.to_status(status)
    trailers = (*rich.trailing_metadata, (RETRY_INFO_TRAILER, info.SerializeToString()))
    return RetryStatus(rich.code, rich.details, trailers)


class GrpcReceiver:
    """A grpc.aio server feeding ``head``. See the module docstring for the contract."""

    def __init__(
        self, listen: str, head: Stage, limits: LimitsConfig, metrics: SelfMetrics
    ) -> None:
        self.listen = listen
        self.head = head
        self.limits = limits
        self.metrics = metrics
        self.trace_scan = pipeline_trace_scan(head)
        self.bound_port: int | None = None
        self._server: Any = None
        self._in_flight = 0

    @property
    def address(self) -> str:
        """``HOST:PORT`` with the port actually bound once started (``listen`` before)."""
        return bound_address(self.listen, self.bound_port)

    async def start(self) -> None:
        limits = self.limits
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limits.grpc_transport_max_bytes),
                ("grpc.max_send_message_length", 4 * 1024 * 1024),
                # Without this a second sidecar could silently share the port.
                ("grpc.so_reuseport", 0),
                ("grpc.max_metadata_size", limits.http_max_header_bytes),
                ("grpc.absolute_max_metadata_size", limits.http_max_header_bytes),
                ("grpc.max_connection_idle_ms", int(limits.grpc_idle_timeout_s * 1000)),
                ("grpc.max_allowed_incoming_connections", limits.grpc_max_connections),
                ("grpc.max_concurrent_streams", limits.grpc_max_streams_per_connection),
            ]
        )
        handlers = []
        for spec in SPECS.values():
            handlers.append(
                grpc.method_handlers_generic_handler(
                    spec.grpc_service,
                    {
                        # Registered as client-streaming, although Export is unary on the
                        # wire (the handler type is invisible to clients): grpc.aio's unary
                        # path returns without any status when no whole message arrives
                        # (headers only, a length prefix longer than the body), leaving the
                        # call open until the client gives up. Reading the stream here
                        # answers those, a second message, and a slow sender.
                        "Export": grpc.stream_unary_rpc_method_handler(
                            self._handler(spec),
                            request_deserializer=_identity,
                            response_serializer=_identity,
                        )
                    },
                )
            )
        server.add_generic_rpc_handlers(tuple(handlers))
        try:
            port = server.add_insecure_port(self.listen)
        except RuntimeError:  # grpc reports every bind failure this way
            port = 0
        if port == 0:
            raise OSError(f"cannot listen on {self.listen} (gRPC receiver)")
        await server.start()
        self._server = server
        self.bound_port = port
        logger.info("OTLP/gRPC receiver listening on %s", self.address)

    async def stop(self, grace_s: float) -> None:
        """Stop accepting; in-flight calls get ``grace_s`` seconds to finish."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace_s)
            logger.info("OTLP/gRPC receiver stopped")

    def _handler(self, spec: SignalSpec) -> Any:
        max_bytes = self.limits.grpc_max_message_bytes
        metrics = self.metrics
        signal = spec.signal.value

        timeout_s = self.limits.grpc_message_timeout_s
        max_metadata = self.limits.http_max_header_bytes

        async def export(
            requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
        ) -> bytes:
            if self._in_flight >= self.limits.grpc_max_concurrent_requests:
                metrics.limit_hits.labels("grpc_max_concurrent_requests").inc()
                status = retry_info_status(
                    "sidecar is handling too many calls at once; retry later",
                    self.limits.overload_retry_after_s,
                )
                return refuse(context, status.details, status.code, status.trailing_metadata)
            self._in_flight += 1
            try:
                # grpc core advertises the metadata limit (SETTINGS_MAX_HEADER_LIST_SIZE)
                # but lets far larger metadata through (1 MB was accepted with 4 KiB
                # configured): check it here, where it can be counted.
                metadata = context.invocation_metadata() or ()
                size = sum(len(k) + len(v) for k, v in metadata)
                if size > max_metadata:
                    metrics.limit_hits.labels("http_max_header_bytes").inc()
                    metrics.bad_requests.labels(TRANSPORT, "metadata_too_large").inc()
                    return refuse(
                        context,
                        f"request metadata of {size} bytes exceeds {max_metadata} bytes",
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                    )
                try:
                    request = await asyncio.wait_for(read_one(context), timeout_s)
                except TimeoutError:
                    metrics.limit_hits.labels("grpc_message_timeout_s").inc()
                    metrics.bad_requests.labels(TRANSPORT, "timeout").inc()
                    return refuse(
                        context,
                        f"request message not received within {timeout_s}s",
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                    )
                except BadRequest as exc:
                    metrics.bad_requests.labels(TRANSPORT, exc.reason).inc()
                    return refuse(context, str(exc))
                return await handle(request, context)
            finally:
                self._in_flight -= 1

        async def read_one(context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            """The call's one message, once the client has ended its stream."""
            first = await context.read()
            if first is grpc.aio.EOF:
                raise BadRequest("no complete request message received", "no_message")
            if await context.read() is not grpc.aio.EOF:
                raise BadRequest("Export takes exactly one request message", "many_messages")
            return first  # type: ignore[no-any-return]

        async def handle(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            if len(request) > max_bytes:
                metrics.limit_hits.labels("grpc_max_message_bytes").inc()
                metrics.bad_requests.labels(TRANSPORT, "too_large").inc()
                return refuse(
                    context,
                    f"message of {len(request)} bytes exceeds the limit of {max_bytes} bytes",
                )
            try:
                batch = decode_batch(
                    spec,
                    request,
                    json=False,
                    max_depth=self.limits.max_message_depth,
                    max_messages=self.limits.max_request_messages,
                    scan=self.trace_scan,
                    peer=_peer_address(context.peer()),
                )
            except BadRequest as exc:
                if exc.limit is not None:
                    metrics.limit_hits.labels(exc.limit).inc()
                metrics.bad_requests.labels(TRANSPORT, exc.reason).inc()
                return refuse(context, str(exc))
            backpressure = await submit(self.head, batch, TRANSPORT, metrics)
            if backpressure is not None:
                status = retry_info_status(
                    f"sidecar {signal} pipeline is full ({backpressure.reason})",
                    backpressure.retry_after_s,
                )
                return refuse(context, status.details, status.code, status.trailing_metadata)
            return build_response(spec, batch).SerializeToString()

        return export


def _peer_address(peer: str) -> str | None:
    """``ipv4:1.2.3.4:5`` / ``ipv6:[::1]:5`` -> ``1.2.3.4:5`` / ``[::1]:5``."""
    kind, sep, address = peer.partition(":")
    if not sep or kind not in ("ipv4", "ipv6"):
        return None
    return address
