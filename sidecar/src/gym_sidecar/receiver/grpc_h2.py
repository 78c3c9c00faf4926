"""OTLP/gRPC receiver: TraceService, MetricsService and LogsService ``Export``, served
over HTTP/2 with ``h2`` on the sidecar's event loop, without grpc core.

Why not grpc.aio (the receiver until this change): importing grpc costs ~13 MiB of
resident memory (its ``cygrpc`` library alone 9.8 MiB), a fifth of the sidecar's; with
the gRPC exporter on ``h2`` too, the default sidecar no longer loads grpc at all
(docs/benchmarks.md, "Round 4: the sidecar without grpc core"). ``h2`` (PyPI, the HTTP/2
state machine the exporter already uses: frames, HPACK, flow control, stream states)
carries the streams; this module adds what gRPC puts on top and what grpc core used to
enforce by itself, written out here so each of it is counted:

Per call (one HTTP/2 stream), answered with a gRPC status in the trailers:
- ``:path`` another method: UNIMPLEMENTED; ``:method`` not POST: UNIMPLEMENTED;
  ``content-type`` not ``application/grpc*``: HTTP 415 with INVALID_ARGUMENT (as
  grpc-go answers);
- ``limits.grpc_max_concurrent_requests`` calls already in progress (across
  connections): RESOURCE_EXHAUSTED with RetryInfo(``overload_retry_after_s``);
- metadata (the non-pseudo headers, name + value bytes) over
  ``limits.http_max_header_bytes``: RESOURCE_EXHAUSTED without RetryInfo;
- the message's length prefix over ``limits.grpc_transport_max_bytes`` (or, inflated,
  the message over it): RESOURCE_EXHAUSTED, before it is buffered (inflation stops at the
  limit); an uncompressed prefix over ``limits.grpc_max_message_bytes``:
  INVALID_ARGUMENT, also before buffering;
- ``grpc-encoding`` gzip or deflate is inflated; a compressed message with another
  encoding: UNIMPLEMENTED (with ``grpc-accept-encoding``); with none: INTERNAL; broken
  gzip: INVALID_ARGUMENT;
- the stream ending without one whole message, or carrying two: INVALID_ARGUMENT;
- the message and the end of the stream not received ``limits.grpc_message_timeout_s``
  after the call's headers: DEADLINE_EXCEEDED;
- the rest is :mod:`.grpc_call`'s (decoding, message limits, the pipeline, backpressure
  as RESOURCE_EXHAUSTED with RetryInfo as a status detail and a bare trailer).

Per connection:
- ``limits.grpc_max_connections`` open already: the new one is closed before anything
  is read;
- the client preface and its first SETTINGS, and each header block, must arrive within
  ``limits.http_header_timeout_s``: else the connection is closed;
- no call in progress for ``limits.grpc_idle_timeout_s``: GOAWAY and closed;
- SETTINGS_MAX_CONCURRENT_STREAMS is ``limits.grpc_max_streams_per_connection``; a stream
  beyond it is refused with REFUSED_STREAM (clients retry it);
- the HTTP/2 abuse bounds of :mod:`.h2_guard` (control-frame floods, rapid reset,
  oversized header blocks); an HPACK block that decodes to more than 4 x
  ``limits.http_max_header_bytes`` (HPACK bomb); more than :data:`MAX_WRITE_BUFFER` bytes
  waiting to be written because the client does not read; a response that its stream's
  flow-control window keeps from being sent for ``limits.grpc_message_timeout_s``
  (zero-window stall): the stream is reset; anything ``h2`` finds malformed: GOAWAY and
  closed.

Counting: every refusal above is counted, under ``limit_hits{limit=<limits. key>}`` when
a configured limit bit, ``bad_requests{transport="grpc", reason}`` for refused calls, and
``http2_refusals{reason}`` for the fixed HTTP/2 bounds and protocol errors.

Lifecycle: :meth:`GrpcReceiver.start` binds and serves on the running loop;
:meth:`GrpcReceiver.stop` closes the listener, sends every connection a GOAWAY, waits up
to ``grace_s`` for the calls in progress (which finish handing their data to the
pipeline), then closes what is left. Both are safe to repeat. Everything runs on the
event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import zlib
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import GoAwayFrame

from gym_sidecar.config import LimitsConfig
from gym_sidecar.core.grpc_status import StatusCode, status_trailers
from gym_sidecar.core.otlp import SPECS, SignalSpec
from gym_sidecar.core.stage import Stage, pipeline_trace_scan
from gym_sidecar.hostport import bind_tcp, bound_address
from gym_sidecar.receiver import grpc_call
from gym_sidecar.receiver.grpc_call import TRANSPORT, Answer
from gym_sidecar.receiver.h2_guard import Abuse, FrameGuard, quiet_data_frame_repr
from gym_sidecar.selfmetrics import SelfMetrics

logger = logging.getLogger(__name__)

WINDOW_BYTES = 4 * 1024 * 1024
"""Initial stream and connection flow-control windows (what grpc core advertises): a
whole batch of spans arrives without waiting for WINDOW_UPDATEs. Not a memory bound:
what a call may buffer is bounded by the message limits."""
MAX_FRAME_BYTES = 1024 * 1024
"""SETTINGS_MAX_FRAME_SIZE: grpc core clients then send ~128 KiB DATA frames instead of
16 KiB ones (fewer frames, fewer events per message); it also bounds the one partial
frame ``h2`` buffers per connection."""
MAX_WRITE_BUFFER = 1024 * 1024
"""Bytes waiting to be written to a client beyond which the connection is closed (the
client does not read: its answers, PING and SETTINGS acknowledgements would pile up)."""
MAX_CLOSED_STREAMS = 1024
"""Closed streams ``h2`` remembers per connection (its default, 65,536, holds ~4 MiB on a
long-lived connection: an int and a dict slot per call it has ever carried)."""
HPACK_BOUND_FACTOR = 4
"""A header block may decode to this many times ``limits.http_max_header_bytes`` (then
the call is answered RESOURCE_EXHAUSTED); past it, decoding stops (HPACK bomb)."""

_METHODS: dict[bytes, SignalSpec] = {spec.grpc_method.encode(): spec for spec in SPECS.values()}
_ENCODINGS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
_ACCEPT_ENCODING = (b"grpc-accept-encoding", b"identity,gzip,deflate")
_CONTENT_TYPE = (b"content-type", b"application/grpc")
_RESPONSE_HEADERS = [(b":status", b"200"), _CONTENT_TYPE, _ACCEPT_ENCODING]
_OK_TRAILERS = [(b"grpc-status", b"0")]
_EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"


class _ServerConnection(h2.connection.H2Connection):
    MAX_CLOSED_STREAMS = MAX_CLOSED_STREAMS


def _peer(transport: asyncio.BaseTransport) -> str | None:
    """``1.2.3.4:5`` or ``[::1]:5`` (the form enrichment expects), None when unknown."""
    name = transport.get_extra_info("peername")
    if not isinstance(name, tuple) or len(name) < 2:
        return None
    host, port = name[0], name[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class GrpcReceiver:
    """The OTLP/gRPC listener feeding ``head``. See the module docstring for the contract."""

    def __init__(
        self, listen: str, head: Stage, limits: LimitsConfig, metrics: SelfMetrics
    ) -> None:
        self.listen = listen
        self.head = head
        self.trace_scan = pipeline_trace_scan(head)
        self.limits = limits
        self.metrics = metrics
        self.bound_port: int | None = None
        self.in_flight = 0
        """Calls accepted and not finished (across connections)."""
        self.stopping = False
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Future[None]] = set()
        """Calls being handled by the pipeline (referenced so they are not collected)."""
        self._server: asyncio.Server | None = None
        self._idle: asyncio.Event | None = None
        quiet_data_frame_repr()

    @property
    def address(self) -> str:
        """``HOST:PORT`` with the port actually bound once started (``listen`` before)."""
        return bound_address(self.listen, self.bound_port)

    async def start(self) -> None:
        if self._server is not None:
            return
        sock = bind_tcp(self.listen)
        try:
            server = await asyncio.get_running_loop().create_server(
                lambda: _Connection(self), sock=sock, backlog=1024
            )
        except OSError:
            sock.close()
            raise
        self._server = server
        self.bound_port = sock.getsockname()[1]
        self.stopping = False
        logger.info("OTLP/gRPC receiver listening on %s", self.address)

    async def stop(self, grace_s: float) -> None:
        """Stop accepting; in-flight calls get ``grace_s`` seconds to finish."""
        server, self._server = self._server, None
        if server is None:
            return
        self.stopping = True
        server.close()
        for conn in list(self.connections):
            conn.go_away()
        if self.in_flight:
            self._idle = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace_s)
        for conn in list(self.connections):
            conn.abort()
        logger.info("OTLP/gRPC receiver stopped")

    def call_finished(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()


class _Call:
    """One ``Export`` call: one stream, its message as it arrives, and its answer."""

    __slots__ = (
        "answered",
        "buffer",
        "client_done",
        "compressed",
        "encoding",
        "length",
        "pending",
        "released",
        "running",
        "spec",
        "stream_id",
        "timer",
    )

    def __init__(self, stream_id: int, spec: SignalSpec, encoding: bytes | None) -> None:
        self.stream_id = stream_id
        self.spec = spec
        self.encoding = encoding
        self.buffer = bytearray()
        self.length = -1  # the message length from its prefix, once 5 bytes arrived
        self.compressed = False
        self.client_done = False  # the client ended its side of the stream
        self.answered = False
        self.running = False  # handed to the pipeline
        self.released = False  # its in-flight slot given back
        self.timer: asyncio.TimerHandle | None = None
        self.pending: bytes | None = None  # response DATA waiting for window


class _Connection(asyncio.Protocol):
    """One client connection: ``h2`` plus the bounds of the module doc."""

    def __init__(self, receiver: GrpcReceiver) -> None:
        self.receiver = receiver
        self.limits = receiver.limits
        self.metrics = receiver.metrics
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer: str | None = None
        self.calls: dict[int, _Call] = {}
        self.h2 = self._new_h2()
        self.guard = FrameGuard(
            HPACK_BOUND_FACTOR * self.limits.http_max_header_bytes,
            MAX_FRAME_BYTES,
            self.loop.time(),
        )
        self.going_away = False
        self._settings_seen = False
        self._preface_timer: asyncio.TimerHandle | None = None
        self._block_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None

    def _new_h2(self) -> h2.connection.H2Connection:
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        conn = _ServerConnection(config=config)
        limits = self.limits
        advertised = {
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: limits.grpc_max_streams_per_connection,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW_BYTES,
            h2.settings.SettingCodes.MAX_FRAME_SIZE: MAX_FRAME_BYTES,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: limits.http_max_header_bytes,
        }
        conn.local_settings = h2.settings.Settings(client=False, initial_values=advertised)
        conn.max_inbound_frame_size = MAX_FRAME_BYTES
        conn.decoder.max_header_list_size = HPACK_BOUND_FACTOR * limits.http_max_header_bytes
        conn.initiate_connection()
        conn.increment_flow_control_window(WINDOW_BYTES - 65535)
        # h2 would end the whole connection (GOAWAY) on a stream past the advertised
        # limit; the receiver refuses that one stream instead, as grpc core did.
        conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                **advertised,
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 2**31 - 1,
            },
        )
        return conn

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        receiver = self.receiver
        if receiver.stopping or len(receiver.connections) >= self.limits.grpc_max_connections:
            if not receiver.stopping:
                self.metrics.limit_hits.labels("grpc_max_connections").inc()
            transport.abort()
            return
        self.transport = transport
        receiver.connections.add(self)
        self.peer = _peer(transport)
        self._preface_timer = self.loop.call_later(
            self.limits.http_header_timeout_s, self._header_timeout
        )
        self._became_idle()
        self._flush()

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        try:
            self.guard.feed(data, self.loop.time())
        except Abuse as exc:
            self._refuse_connection(exc.reason, str(exc), h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
            return
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            reason = (
                "header_list_too_large"
                if isinstance(exc, h2.exceptions.DenialOfServiceError)
                else "protocol_error"
            )
            self.metrics.http2_refusals.labels(reason).inc()
            logger.debug("gRPC connection from %s: HTTP/2 error %r", self.peer, exc)
            self._flush()  # h2 has queued its GOAWAY
            self._close()
            return
        for event in events:
            self._dispatch(event)
        if self.transport is None:
            return
        if self.guard.in_header_block:
            if self._block_timer is None:
                self._block_timer = self.loop.call_later(
                    self.limits.http_header_timeout_s, self._header_timeout
                )
        elif self._block_timer is not None:
            self._block_timer.cancel()
            self._block_timer = None
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.receiver.connections.discard(self)
        for timer in (self._preface_timer, self._block_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        for call in list(self.calls.values()):
            self._drop(call)

    # -- connection-level ---------------------------------------------------------------
    def _flush(self) -> None:
        transport = self.transport
        if transport is None:
            return
        data = self.h2.data_to_send()
        if data:
            transport.write(data)
            if transport.get_write_buffer_size() > MAX_WRITE_BUFFER:
                self.metrics.http2_refusals.labels("not_reading").inc()
                self.abort()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def abort(self) -> None:
        """Close at once, dropping what is unsent (the receiver is done with it)."""
        if self.transport is not None:
            self.transport.abort()
            self.transport = None

    def _refuse_connection(self, reason: str, message: str, code: h2.errors.ErrorCodes) -> None:
        self.metrics.http2_refusals.labels(reason).inc()
        logger.debug("gRPC connection from %s closed: %s", self.peer, message)
        self._write_goaway(code)
        self._close()

    def _write_goaway(self, code: h2.errors.ErrorCodes = h2.errors.ErrorCodes.NO_ERROR) -> None:
        """A GOAWAY written past ``h2``: its own ``close_connection`` would forbid the
        answers still owed to the calls in progress."""
        if self.transport is None:
            return
        frame = GoAwayFrame(0, last_stream_id=self.h2.highest_inbound_stream_id, error_code=code)
        self._flush()
        self.transport.write(frame.serialize())

    def go_away(self) -> None:
        """Shutdown: no new calls (GOAWAY); close once the calls in progress are answered."""
        self.going_away = True
        self._write_goaway()
        if not self.calls:
            self._close()

    def _header_timeout(self) -> None:
        if self.transport is None:
            return
        self.metrics.limit_hits.labels("http_header_timeout_s").inc()
        logger.debug("gRPC connection from %s: preface or headers too slow", self.peer)
        self._write_goaway(h2.errors.ErrorCodes.PROTOCOL_ERROR)
        self._close()

    def _became_idle(self) -> None:
        self._idle_since = self.loop.time()
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_at(
                self._idle_since + self.limits.grpc_idle_timeout_s, self._idle_check
            )

    def _idle_check(self) -> None:
        self._idle_timer = None
        if self.transport is None or self._idle_since is None:
            return
        due = self._idle_since + self.limits.grpc_idle_timeout_s
        if self.loop.time() < due:
            self._idle_timer = self.loop.call_at(due, self._idle_check)
            return
        self.metrics.limit_hits.labels("grpc_idle_timeout_s").inc()
        self._write_goaway()
        self._close()

    # -- events -------------------------------------------------------------------------
    def _dispatch(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            if event.flow_controlled_length:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            call = self.calls.get(event.stream_id)
            if call is not None and not call.answered and event.data:
                self._data(call, event.data)
        elif isinstance(event, h2.events.RequestReceived):
            self._open(event.stream_id, event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            call = self.calls.get(event.stream_id)
            if call is not None:
                call.client_done = True
                if not call.answered:
                    self._message_done(call)
        elif isinstance(event, h2.events.StreamReset):
            call = self.calls.get(event.stream_id)
            if call is not None:
                self._drop(call)
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            if not self._settings_seen and isinstance(event, h2.events.RemoteSettingsChanged):
                self._settings_seen = True
                if self._preface_timer is not None:
                    self._preface_timer.cancel()
                    self._preface_timer = None
            for call in [c for c in self.calls.values() if c.pending is not None]:
                self._send_pending(call)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.going_away = True
            if not self.calls:
                self._close()

    def _open(self, stream_id: int, headers: Any) -> None:
        receiver, limits, metrics = self.receiver, self.limits, self.metrics
        if self.going_away or receiver.stopping:
            self._reset(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        if len(self.calls) >= limits.grpc_max_streams_per_connection:
            metrics.limit_hits.labels("grpc_max_streams_per_connection").inc()
            self._reset(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        method = path = content_type = encoding = None
        metadata = 0
        for name, value in headers:
            if name[:1] == b":":
                if name == b":path":
                    path = value
                elif name == b":method":
                    method = value
                continue
            metadata += len(name) + len(value)
            if name == b"content-type":
                content_type = value
            elif name == b"grpc-encoding":
                encoding = value
        spec = _METHODS.get(path or b"")
        if spec is None or method != b"POST":
            what = "unimplemented" if spec is None else "method"
            metrics.bad_requests.labels(TRANSPORT, what).inc()
            text = f"no method {path!r}" if spec is None else "gRPC calls are POST requests"
            self._answer_headers(stream_id, Answer(StatusCode.UNIMPLEMENTED, text))
            return
        if content_type is None or not content_type.startswith(b"application/grpc"):
            metrics.bad_requests.labels(TRANSPORT, "content_type").inc()
            answer = Answer(StatusCode.INVALID_ARGUMENT, f"content-type {content_type!r}")
            self._answer_headers(stream_id, answer, http_status=b"415")
            return
        if receiver.in_flight >= limits.grpc_max_concurrent_requests:
            metrics.limit_hits.labels("grpc_max_concurrent_requests").inc()
            answer = Answer(
                StatusCode.RESOURCE_EXHAUSTED,
                "sidecar is handling too many calls at once; retry later",
                retry_after_s=limits.overload_retry_after_s,
            )
            self._answer_headers(stream_id, answer)
            return
        if metadata > limits.http_max_header_bytes:
            metrics.limit_hits.labels("http_max_header_bytes").inc()
            metrics.bad_requests.labels(TRANSPORT, "metadata_too_large").inc()
            message = (
                f"request metadata of {metadata} bytes exceeds {limits.http_max_header_bytes} bytes"
            )
            self._answer_headers(stream_id, Answer(StatusCode.RESOURCE_EXHAUSTED, message))
            return
        call = _Call(stream_id, spec, encoding)
        self.calls[stream_id] = call
        receiver.in_flight += 1
        self._idle_since = None
        call.timer = self.loop.call_later(limits.grpc_message_timeout_s, self._timeout, call)

    def _data(self, call: _Call, data: bytes) -> None:
        buffer = call.buffer
        buffer += data
        if call.length < 0:
            if len(buffer) < 5:
                return
            refusal = self._check_prefix(call, buffer[0], int.from_bytes(buffer[1:5], "big"))
            if refusal is not None:
                self._answer(call, refusal)
                return
        if len(buffer) > 5 + call.length:
            self.metrics.bad_requests.labels(TRANSPORT, "many_messages").inc()
            self._answer(call, grpc_call.invalid("Export takes exactly one request message"))

    def _check_prefix(self, call: _Call, flag: int, length: int) -> Answer | None:
        limits, metrics = self.limits, self.metrics
        call.length = length
        call.compressed = flag == 1
        if flag > 1:
            return Answer(StatusCode.INTERNAL, f"invalid message flag {flag}")
        if flag and call.encoding not in _ENCODINGS:
            if call.encoding in (None, b"identity"):
                return Answer(StatusCode.INTERNAL, "compressed message without grpc-encoding")
            metrics.bad_requests.labels(TRANSPORT, "encoding").inc()
            return Answer(StatusCode.UNIMPLEMENTED, f"grpc-encoding {call.encoding!r}")
        if length > limits.grpc_transport_max_bytes:
            metrics.limit_hits.labels("grpc_transport_max_bytes").inc()
            metrics.bad_requests.labels(TRANSPORT, "too_large").inc()
            return Answer(
                StatusCode.RESOURCE_EXHAUSTED,
                f"message of {length} bytes exceeds the transport limit of "
                f"{limits.grpc_transport_max_bytes} bytes",
            )
        if not flag and length > limits.grpc_max_message_bytes:
            metrics.limit_hits.labels("grpc_max_message_bytes").inc()
            metrics.bad_requests.labels(TRANSPORT, "too_large").inc()
            return grpc_call.invalid(
                f"message of {length} bytes exceeds the limit of "
                f"{limits.grpc_max_message_bytes} bytes"
            )
        return None

    def _message_done(self, call: _Call) -> None:
        """The client ended its stream: hand the one whole message to the pipeline."""
        if call.length < 0 or len(call.buffer) < 5 + call.length:
            self.metrics.bad_requests.labels(TRANSPORT, "no_message").inc()
            self._answer(call, grpc_call.invalid("no complete request message received"))
            return
        message = bytes(memoryview(call.buffer)[5:])
        call.buffer = bytearray()
        if call.compressed:
            inflated = self._inflate(call, message)
            if isinstance(inflated, Answer):
                self._answer(call, inflated)
                return
            message = inflated
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        call.running = True
        task = asyncio.ensure_future(self._run(call, message))
        self.receiver.tasks.add(task)
        task.add_done_callback(self.receiver.tasks.discard)

    def _inflate(self, call: _Call, data: bytes) -> bytes | Answer:
        limit = self.limits.grpc_transport_max_bytes
        inflater = zlib.decompressobj(_ENCODINGS[call.encoding or b""])
        try:
            out = inflater.decompress(data, limit + 1)
        except zlib.error as exc:
            self.metrics.bad_requests.labels(TRANSPORT, "bad_gzip").inc()
            return grpc_call.invalid(f"message is not valid {call.encoding!r}: {exc}")
        if len(out) > limit or inflater.unconsumed_tail:
            self.metrics.limit_hits.labels("grpc_transport_max_bytes").inc()
            self.metrics.bad_requests.labels(TRANSPORT, "too_large").inc()
            return Answer(
                StatusCode.RESOURCE_EXHAUSTED,
                f"message inflates beyond the transport limit of {limit} bytes",
            )
        if not inflater.eof:
            self.metrics.bad_requests.labels(TRANSPORT, "bad_gzip").inc()
            return grpc_call.invalid(f"message is truncated {call.encoding!r}")
        return out

    async def _run(self, call: _Call, message: bytes) -> None:
        try:
            answer = await grpc_call.export(
                call.spec,
                message,
                peer=self.peer,
                head=self.receiver.head,
                scan=self.receiver.trace_scan,
                limits=self.limits,
                metrics=self.metrics,
            )
        finally:
            call.running = False
        self.guard.call_answered()
        if self.calls.get(call.stream_id) is call:
            self._answer(call, answer)
            self._flush()
        else:
            self._release(call)

    def _timeout(self, call: _Call) -> None:
        call.timer = None
        if call.pending is not None:  # the answer could not be sent for want of window
            self.metrics.http2_refusals.labels("response_stalled").inc()
            call.pending = None
            self._reset(call.stream_id, h2.errors.ErrorCodes.CANCEL)
            self._forget(call)
            self._flush()
            return
        if call.answered or call.running:
            return
        timeout_s = self.limits.grpc_message_timeout_s
        self.metrics.limit_hits.labels("grpc_message_timeout_s").inc()
        self.metrics.bad_requests.labels(TRANSPORT, "timeout").inc()
        self._answer(
            call,
            Answer(
                StatusCode.DEADLINE_EXCEEDED, f"request message not received within {timeout_s}s"
            ),
        )
        self._flush()

    # -- answers --------------------------------------------------------------------------
    def _answer(self, call: _Call, answer: Answer) -> None:
        call.answered = True
        call.buffer = bytearray()
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        self._release(call)  # the call's work is done, even if its answer waits for window
        if self.transport is None:
            self._forget(call)
            return
        if answer.code is StatusCode.OK:
            response = answer.response
            data = (
                _EMPTY_MESSAGE if not response else struct.pack(">BI", 0, len(response)) + response
            )
            try:
                self.h2.send_headers(call.stream_id, _RESPONSE_HEADERS)
            except h2.exceptions.StreamClosedError:
                self._forget(call)
                return
            call.pending = data
            self._send_pending(call)
            return
        self._answer_headers(call.stream_id, answer)
        if not call.client_done:
            # Answered before the client finished sending: ask it to stop (RFC 9113 8.1).
            self._reset(call.stream_id, h2.errors.ErrorCodes.NO_ERROR)
        self._forget(call)

    def _send_pending(self, call: _Call) -> None:
        data = call.pending
        if data is None or self.transport is None:
            return
        if self.h2.local_flow_control_window(call.stream_id) < len(data):
            if call.timer is None:  # bounded: see _timeout
                call.timer = self.loop.call_later(
                    self.limits.grpc_message_timeout_s, self._timeout, call
                )
            return
        call.pending = None
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        self.h2.send_data(call.stream_id, data)
        self.h2.send_headers(call.stream_id, _OK_TRAILERS, end_stream=True)
        self._forget(call)

    def _answer_headers(self, stream_id: int, answer: Answer, http_status: bytes = b"200") -> None:
        """A trailers-only answer: the status in the one HEADERS frame, ending the stream."""
        if self.transport is None:
            return
        headers = [(b":status", http_status), _CONTENT_TYPE]
        if answer.code is StatusCode.UNIMPLEMENTED:
            headers.append(_ACCEPT_ENCODING)
        headers.extend(
            (k.encode(), v.encode())
            for k, v in status_trailers(answer.code, answer.message, answer.retry_after_s)
        )
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            self.h2.send_headers(stream_id, headers, end_stream=True)

    def _reset(self, stream_id: int, code: h2.errors.ErrorCodes) -> None:
        with contextlib.suppress(h2.exceptions.StreamClosedError, KeyError):
            self.h2.reset_stream(stream_id, code)

    def _drop(self, call: _Call) -> None:
        """The client reset the stream or went away: no answer; a running call finishes
        handing its data to the pipeline and its answer is discarded."""
        call.answered = True
        call.buffer = bytearray()
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        self._forget(call)

    def _forget(self, call: _Call) -> None:
        if self.calls.pop(call.stream_id, None) is None:
            return
        if not call.running:
            self._release(call)
        if not self.calls:
            if self.going_away:
                self._flush()
                self._close()
            else:
                self._became_idle()

    def _release(self, call: _Call) -> None:
        if not call.released:
            call.released = True
            self.receiver.call_finished()
