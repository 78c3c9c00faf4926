"""OTLP/gRPC receiver: TraceService, MetricsService and LogsService ``Export``, served
over HTTP/2 on the sidecar's event loop with ``h2``, without grpc core.

Why not grpc.aio (the receiver before): importing grpc costs ~13 MiB of resident memory
(its ``cygrpc`` library alone ~10 MiB), a fifth of the sidecar's, and with the gRPC
exporter on ``h2`` too the sidecar then never loads grpc (docs/sidecar.md, "The gRPC
receiver"). ``h2`` (PyPI, a maintained HTTP/2 state machine: frames, HPACK, flow
control, stream states) carries the streams; :mod:`gym_sidecar.wire.http2.grpc_server` does the
I/O and the connection's bounds, :mod:`gym_sidecar.wire.http2.grpc_call` what gRPC puts
on top, :mod:`gym_sidecar.wire.http2.guard` the bounds checked on frame headers before
``h2`` parses anything; this module the listener and what a call's message becomes
(:func:`export`). Everything grpc core
used to enforce by itself is written out there, so each refusal is counted.

Per call (one HTTP/2 stream), answered with a gRPC status (trailers-only when refused):

- ``:path`` not an ``Export`` method, ``:method`` not POST: UNIMPLEMENTED;
  ``content-type`` not ``application/grpc`` or ``application/grpc+proto``: HTTP 415 with
  INVALID_ARGUMENT;
- metadata over ``limits.http_max_header_bytes``: RESOURCE_EXHAUSTED without RetryInfo;
- ``limits.grpc_max_concurrent_requests`` calls already in progress (across
  connections): RESOURCE_EXHAUSTED with RetryInfo(``limits.overload_retry_after_s``);
- the length prefix over ``limits.grpc_transport_max_bytes``: RESOURCE_EXHAUSTED; an
  uncompressed one over ``limits.grpc_max_message_bytes``: INVALID_ARGUMENT; both before
  the message is buffered;
- ``grpc-encoding`` gzip or deflate is inflated, up to ``limits.grpc_max_message_bytes``
  (more: INVALID_ARGUMENT); the compressed flag with another encoding: UNIMPLEMENTED
  (with ``grpc-accept-encoding``); without one: INTERNAL; broken data: INVALID_ARGUMENT;
- the stream ending without one whole message, or carrying two: INVALID_ARGUMENT;
- the message and the end of the stream not received within
  ``limits.grpc_message_timeout_s`` of the call's headers, or within the client's own
  ``grpc-timeout`` when that is shorter: DEADLINE_EXCEEDED;
- the rest is :func:`export`'s: decoding and its message limits
  (INVALID_ARGUMENT), the pipeline's backpressure (RESOURCE_EXHAUSTED with RetryInfo as a
  status detail and as a bare ``google.rpc.retryinfo-bin`` trailer), OK with the
  response; a stage failing unexpectedly: INTERNAL (logged).

A refusal sent before the client ended its stream is followed by RST_STREAM(NO_ERROR),
so the client stops sending (RFC 9113, 8.1). A client that resets its stream, or whose
connection is lost, gets nothing: a call not yet handed to the pipeline is dropped, one
already handed over finishes and its answer is discarded.

Per connection:

- ``limits.grpc_max_connections`` open already: the new one is closed before anything is
  read;
- the client preface and its SETTINGS, and each header block, must arrive within
  ``limits.http_header_timeout_s``;
- no call in progress for ``limits.grpc_idle_timeout_s``: GOAWAY and closed;
- SETTINGS_MAX_CONCURRENT_STREAMS is ``limits.grpc_max_streams_per_connection``; a stream
  beyond it is refused with REFUSED_STREAM (clients retry it), the connection kept;
- the fixed HTTP/2 bounds of :class:`Http2Bounds`: control-frame floods (SETTINGS, PING,
  rapid reset, WINDOW_UPDATE, PRIORITY, empty DATA), frames larger than advertised, a
  header block too large on the wire or decoding to too much (HPACK bomb), too much
  output the client does not read, an answer the client's flow-control window keeps
  from being sent for ``limits.grpc_message_timeout_s`` (the stream is reset); anything
  else ``h2`` finds malformed: GOAWAY and closed (FRAME_SIZE_ERROR for a frame over
  SETTINGS_MAX_FRAME_SIZE, ENHANCE_YOUR_CALM for the other bounds, after a
  RESOURCE_EXHAUSTED answer on the stream of a header block too large; ``h2``'s own code
  for what it refuses);
- every GOAWAY reaches the client before the close: nothing more is read into ``h2``,
  the write side shuts down after the GOAWAY, and the connection drains what the client
  still sends until it closes, ``limits.close_linger_s`` at most
  (:mod:`gym_sidecar.wire.linger`; ``limit_hits{close_linger_s}`` when that runs out).

Counted: ``limit_hits{limit=<limits. key>}`` when a configured limit bit,
``bad_requests{transport="grpc", reason}`` for each refused call, and
``http2_refusals{reason}`` for the fixed HTTP/2 bounds and protocol errors.

Lifecycle: :meth:`GrpcReceiver.start` binds and serves on the running loop;
:meth:`GrpcReceiver.stop` closes the listener, sends every connection a GOAWAY naming
the last stream it will serve, waits up to ``grace_s`` for the calls in progress (which
finish handing their data to the pipeline and are answered), then closes what is left
(a connection the receiver closed after its GOAWAY drains until its client closes, up
to ``limits.close_linger_s`` and within ``grace_s``).
Both are safe to repeat. Everything runs on the event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

from gym_sidecar.config import LimitsConfig
from gym_sidecar.core.grpc_status import RETRY_INFO_TRAILER, StatusCode
from gym_sidecar.core.signals import SignalSpec
from gym_sidecar.core.stage import Stage, pipeline_trace_scan
from gym_sidecar.core.traces import ScanSpec
from gym_sidecar.hostport import bind_tcp, bound_address
from gym_sidecar.receiver.request import BadRequest, build_response, decode_batch, submit
from gym_sidecar.selfmetrics import SelfMetrics
from gym_sidecar.wire.http2.connection import quiet_frame_reprs
from gym_sidecar.wire.http2.grpc_call import OK_EMPTY, TRANSPORT, Answer, invalid, too_large
from gym_sidecar.wire.http2.grpc_server import Connection, Shared
from gym_sidecar.wire.http2.guard import Http2Bounds

logger = logging.getLogger(__name__)

__all__ = ["RETRY_INFO_TRAILER", "GrpcReceiver", "Http2Bounds"]


class GrpcReceiver:
    """The OTLP/gRPC listener feeding ``head`` (module doc). ``bounds``: the fixed HTTP/2
    bounds (:class:`~gym_sidecar.wire.http2.guard.Http2Bounds`; other values only in tests)."""

    def __init__(
        self,
        listen: str,
        head: Stage,
        limits: LimitsConfig,
        metrics: SelfMetrics,
        bounds: Http2Bounds | None = None,
    ) -> None:
        self.listen = listen
        handle = functools.partial(
            export, head=head, scan=pipeline_trace_scan(head), limits=limits, metrics=metrics
        )
        self.shared = Shared(handle, limits, metrics, bounds or Http2Bounds())
        self.bound_port: int | None = None
        self._server: asyncio.Server | None = None
        quiet_frame_reprs()

    @property
    def address(self) -> str:
        """``HOST:PORT`` with the port actually bound once started (``listen`` before)."""
        return bound_address(self.listen, self.bound_port)

    @property
    def in_flight(self) -> int:
        """Calls holding a slot: headers received, answer not yet decided."""
        return self.shared.in_flight

    @property
    def connections(self) -> int:
        """Open client connections."""
        return len(self.shared.connections)

    async def start(self) -> None:
        if self._server is not None:
            return
        sock = bind_tcp(self.listen)
        shared = self.shared
        try:
            server = await asyncio.get_running_loop().create_server(
                lambda: Connection(shared), sock=sock, backlog=1024
            )
        except OSError:
            sock.close()
            raise
        self._server = server
        self.bound_port = sock.getsockname()[1]
        shared.stopping = False
        logger.info("OTLP/gRPC receiver listening on %s", self.address)

    async def stop(self, grace_s: float) -> None:
        """Stop accepting; the calls in progress get ``grace_s`` seconds to finish."""
        server, self._server = self._server, None
        if server is None:
            return
        shared = self.shared
        shared.stopping = True
        server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        for conn in list(shared.connections):
            conn.go_away()
        if shared.in_flight:
            shared.idle = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(shared.idle.wait(), grace_s)
        for conn in list(shared.connections):
            conn.abort()
        # Connections closed after their GOAWAY drain until their clients close, within
        # the grace left and the linger bound; the rest are aborted.
        linger_s = min(self.shared.limits.close_linger_s, max(deadline - loop.time(), 0.0))
        await shared.lingering.wait(linger_s)
        logger.info("OTLP/gRPC receiver stopped")


async def export(
    spec: SignalSpec,
    request: bytes,
    *,
    peer: str | None,
    head: Stage,
    scan: ScanSpec,
    limits: LimitsConfig,
    metrics: SelfMetrics,
) -> Answer:
    """Decode ``request`` (traces into their wire view, reading what ``scan`` asks for),
    hand it to ``head`` and say how to answer (module doc). Raises only what a pipeline
    stage raises other than Backpressure."""
    if len(request) > limits.grpc_max_message_bytes:
        return too_large(f"message of {len(request)} bytes", limits, metrics)
    try:
        batch = decode_batch(
            spec,
            request,
            json=False,
            max_depth=limits.max_message_depth,
            max_messages=limits.max_request_messages,
            scan=scan,
            peer=peer,
        )
    except BadRequest as exc:
        if exc.limit is not None:
            metrics.limit_hits.labels(exc.limit).inc()
        metrics.bad_requests.labels(TRANSPORT, exc.reason).inc()
        return invalid(str(exc))
    backpressure = await submit(head, batch, TRANSPORT, metrics)
    if backpressure is not None:
        return Answer(
            StatusCode.RESOURCE_EXHAUSTED,
            f"sidecar {spec.signal.value} pipeline is full ({backpressure.reason})",
            retry_after_s=backpressure.retry_after_s,
        )
    if batch.rejected == 0:
        return OK_EMPTY
    return Answer(StatusCode.OK, response=build_response(spec, batch).SerializeToString())
