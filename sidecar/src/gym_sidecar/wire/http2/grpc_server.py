"""One client connection of the OTLP/gRPC receiver: ``h2`` fed from an asyncio protocol,
the calls on it, and the connection's bounds (the contract is
:mod:`gym_sidecar.receiver.grpc`'s doc).

Flow of a call: HEADERS (:meth:`Connection._open`: the headers checked by
:func:`.grpc_call.check_headers`, the concurrency limit, the message timer armed), DATA
(:meth:`Connection._data`: the length prefix checked before anything is buffered, the
chunks kept as ``h2`` hands them over, views of the reads they came in
(:mod:`.frame_buffer`) while what they keep alive stays within :data:`PIN_FACTOR` x the
call's bytes plus one read, copies past that; the flow-control windows reopened at
once), END_STREAM (:meth:`Connection._message_done`: the one message joined (the one
copy between the socket and the pipeline), or inflated, and handed to
:attr:`Shared.handle` in a task), the answer (HEADERS, DATA, trailers; or one HEADERS
frame, trailers-only, for a refusal). A call holds one of the receiver's in-flight slots from
its HEADERS until its answer is decided (or the client gives up on it); every path
gives it back exactly once (:meth:`Connection._release`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from gym_telemetry_semconv.ratelimit import rate_limit
from hyperframe.frame import GoAwayFrame, HeadersFrame

from gym_sidecar.config import LimitsConfig
from gym_sidecar.core.grpc_status import StatusCode, status_trailers
from gym_sidecar.core.signals import SignalSpec
from gym_sidecar.selfmetrics import SelfMetrics
from gym_sidecar.wire.http2 import grpc_call
from gym_sidecar.wire.http2.connection import H2Connection
from gym_sidecar.wire.http2.grpc_call import TRANSPORT, Answer
from gym_sidecar.wire.http2.grpc_framing import (
    CONTENT_TYPE,
    EMPTY_MESSAGE,
    PREFIX_BYTES,
    prefix,
    read_prefix,
)
from gym_sidecar.wire.http2.guard import Abuse, FrameGuard, Http2Bounds
from gym_sidecar.wire.linger import LINGER_LIMIT, Lingering

logger = logging.getLogger(__name__)
_failure_log = rate_limit(logging.getLogger(__name__ + ".failures"), 10.0)

_CONTENT_TYPE = (b"content-type", CONTENT_TYPE)
_ACCEPT_ENCODING = (b"grpc-accept-encoding", grpc_call.ACCEPT_ENCODING)
_RESPONSE_HEADERS = [(b":status", b"200"), _CONTENT_TYPE, _ACCEPT_ENCODING]
_OK_TRAILERS = [(b"grpc-status", b"0")]
_NO_ERROR = h2.errors.ErrorCodes.NO_ERROR

PIN_FACTOR = 2
"""A call keeps a DATA body as a view of the read it came in (``.frame_buffer``) only while
the reads its views keep alive sum to at most this many times the bytes it received,
plus :data:`PIN_SLACK_BYTES`; past that it copies the body. Without the bound a client
could make one buffered byte keep a whole read (up to 256 KiB) alive, read after read."""
PIN_SLACK_BYTES = 256 * 1024
"""One read of asyncio's (its ``max_size``)."""


class Handler(Protocol):
    """What a call's one whole message becomes: ``(spec, message, peer=...)`` to the
    answer (the receiver's ``export``). Raises only what the pipeline raises."""

    def __call__(self, spec: SignalSpec, message: bytes, *, peer: str | None) -> Awaitable[Answer]:
        """The answer to the call whose request message is ``message``."""
        ...


@dataclass(eq=False)
class Shared:
    """What the connections of one receiver share. Event loop only."""

    handle: Handler
    """Runs a call's message through the receiver (module doc)."""
    limits: LimitsConfig
    metrics: SelfMetrics
    bounds: Http2Bounds
    in_flight: int = 0
    """Calls holding a slot (headers received, answer not yet decided)."""
    stopping: bool = False
    connections: set[Connection] = field(default_factory=set)
    tasks: set[asyncio.Future[None]] = field(default_factory=set)
    """Calls in the pipeline (referenced so that they are not collected)."""
    idle: asyncio.Event | None = None
    """Set when ``in_flight`` drops to 0, once someone waits for that (stop)."""
    lingering: Lingering = field(init=False)
    """Connections closed by the receiver, draining until the client closes
    (:mod:`gym_sidecar.wire.linger`, ``limits.close_linger_s``)."""

    def __post_init__(self) -> None:
        hits = self.metrics.limit_hits.labels(LINGER_LIMIT)
        self.lingering = Lingering(self.limits.close_linger_s, hits.inc)

    def call_finished(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and self.idle is not None:
            self.idle.set()


class _Call:
    """One ``Export`` call: one stream, its message as it arrives, and its answer."""

    __slots__ = (
        "answered",
        "chunks",
        "client_deadline",
        "client_done",
        "compressed",
        "encoding",
        "length",
        "pending",
        "pinned",
        "pinned_read",
        "received",
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
        # the DATA as received (views of reads, or bytes), the 5-byte prefix included
        self.chunks: list[bytes | memoryview] = []
        self.received = 0
        self.pinned = 0  # bytes of the reads the views in chunks keep alive (at most)
        self.pinned_read: object = None  # the read the last view came in
        self.length = -1  # the message length from its prefix, once 5 bytes arrived
        self.compressed = False
        self.client_done = False  # the client ended its side of the stream
        self.client_deadline = False  # the timer is the client's grpc-timeout
        self.answered = False
        self.running = False  # handed to the pipeline
        self.released = False  # its in-flight slot given back
        self.timer: asyncio.TimerHandle | None = None
        self.pending: bytes | None = None  # response DATA waiting for window


def retained(call: _Call, data: bytes | memoryview) -> bytes | memoryview:
    """What ``call`` keeps of a DATA body: the body itself, or a copy of a view when
    keeping the view would make the reads its views keep alive exceed the bound
    (:data:`PIN_FACTOR`, :data:`PIN_SLACK_BYTES`). Consecutive views of one read count
    it once."""
    if type(data) is not memoryview:
        return data
    read = data.obj
    if read is call.pinned_read:
        return data
    pinned = call.pinned + memoryview(read).nbytes
    if pinned > PIN_FACTOR * (call.received + len(data)) + PIN_SLACK_BYTES:
        return bytes(data)  # too little of that read is this call's: copy the body
    call.pinned, call.pinned_read = pinned, read
    return data


def _peer(transport: asyncio.BaseTransport) -> str | None:
    """``1.2.3.4:5`` or ``[::1]:5`` (the form enrichment expects), None when unknown."""
    name = transport.get_extra_info("peername")
    if not isinstance(name, tuple) or len(name) < 2:
        return None
    host, port = name[0], name[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class Connection(asyncio.Protocol):
    """One client connection (module doc)."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.limits = shared.limits
        self.metrics = shared.metrics
        self.bounds = shared.bounds
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer: str | None = None
        self.calls: dict[int, _Call] = {}
        self.h2 = self._new_h2()
        self.guard = FrameGuard(
            self.bounds.hpack_factor * self.limits.http_max_header_bytes,
            self.bounds.max_frame_bytes,
            self.loop.time(),
            self.bounds.control,
        )
        self.going_away = False
        self._closing: asyncio.Transport | None = None  # lingering (see _close)
        self._settings_seen = False
        self._stalled: set[_Call] = set()
        self._preface_timer: asyncio.TimerHandle | None = None
        self._block_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None
        self._handlers: dict[type[h2.events.Event], Callable[[Any], None]] = {
            h2.events.DataReceived: self._on_data,
            h2.events.RequestReceived: self._on_request,
            h2.events.StreamEnded: self._on_stream_ended,
            h2.events.StreamReset: self._on_stream_reset,
            h2.events.WindowUpdated: self._on_window,
            h2.events.RemoteSettingsChanged: self._on_settings,
            h2.events.ConnectionTerminated: self._on_goaway,
        }

    def _new_h2(self) -> H2Connection:
        conn = H2Connection.for_grpc(client_side=False)
        limits, bounds = self.limits, self.bounds
        codes = h2.settings.SettingCodes
        advertised = {
            codes.MAX_CONCURRENT_STREAMS: limits.grpc_max_streams_per_connection,
            codes.INITIAL_WINDOW_SIZE: bounds.window_bytes,
            codes.MAX_FRAME_SIZE: bounds.max_frame_bytes,
            codes.MAX_HEADER_LIST_SIZE: limits.http_max_header_bytes,
        }
        conn.local_settings = h2.settings.Settings(client=False, initial_values=advertised)
        conn.max_inbound_frame_size = bounds.max_frame_bytes
        conn.decoder.max_header_list_size = bounds.hpack_factor * limits.http_max_header_bytes
        conn.initiate_connection()
        conn.increment_flow_control_window(bounds.window_bytes - 65535)
        # h2 would end the whole connection (GOAWAY) on a stream past the advertised
        # limit; the receiver refuses that one stream instead, as grpc core did. Values
        # set this way take effect without waiting for the client's acknowledgement, so
        # the client's SETTINGS ACK changes nothing either (the decoder bound above stays).
        conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={**advertised, codes.MAX_CONCURRENT_STREAMS: 2**31 - 1},
        )
        return conn

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        shared = self.shared
        if shared.stopping or len(shared.connections) >= self.limits.grpc_max_connections:
            if not shared.stopping:
                self.metrics.limit_hits.labels("grpc_max_connections").inc()
            transport.abort()
            return
        self.transport = transport
        shared.connections.add(self)
        self.peer = _peer(transport)
        self._preface_timer = self.loop.call_later(
            self.limits.http_header_timeout_s, self._header_timeout
        )
        self._became_idle()
        self._flush()

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            self.shared.lingering.drained(self._closing, len(data))
            return
        try:
            self.guard.feed(data, self.loop.time())
        except Abuse as exc:
            self._refuse_connection(exc)
            return
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._protocol_error(exc)
            return
        handlers = self._handlers
        for event in events:
            handler = handlers.get(type(event))
            if handler is not None:
                handler(event)
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
        self.shared.lingering.closed(self._closing)
        self.shared.connections.discard(self)
        for timer in (self._preface_timer, self._block_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        for call in list(self.calls.values()):
            self._drop(call)

    # -- events ---------------------------------------------------------------------------
    def _on_data(self, event: h2.events.DataReceived) -> None:
        # The windows reopen as soon as the data is taken: what a call buffers is
        # bounded by the message limits, and data for no call (refused, reset, unknown
        # stream) must not shrink the connection's window for the others.
        if event.flow_controlled_length:
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        call = self.calls.get(event.stream_id)
        if call is not None and not call.answered and event.data:
            self._data(call, event.data)

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        self._open(event.stream_id, event.headers, event.stream_ended is not None)

    def _on_stream_ended(self, event: h2.events.StreamEnded) -> None:
        call = self.calls.get(event.stream_id)
        if call is not None:
            call.client_done = True
            if not call.answered:
                self._message_done(call)

    def _on_stream_reset(self, event: h2.events.StreamReset) -> None:
        call = self.calls.get(event.stream_id)
        if call is not None:
            self._drop(call)

    def _on_window(self, event: h2.events.WindowUpdated) -> None:
        for call in list(self._stalled):
            self._send_pending(call)

    def _on_settings(self, event: h2.events.RemoteSettingsChanged) -> None:
        if not self._settings_seen:
            self._settings_seen = True
            if self._preface_timer is not None:
                self._preface_timer.cancel()
                self._preface_timer = None
        for call in list(self._stalled):
            self._send_pending(call)

    def _on_goaway(self, event: h2.events.ConnectionTerminated) -> None:
        # The client opens no more calls; those in progress are answered (.connection's
        # H2Connection keeps the connection open for them), then it closes.
        self.going_away = True
        if not self.calls:
            self._close()

    # -- a call ---------------------------------------------------------------------------
    def _open(self, stream_id: int, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        shared, limits, metrics = self.shared, self.limits, self.metrics
        if self.going_away or shared.stopping:
            self._reset(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        if len(self.calls) >= limits.grpc_max_streams_per_connection:
            metrics.limit_hits.labels("grpc_max_streams_per_connection").inc()
            self._reset(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        checked = grpc_call.check_headers(headers, limits, metrics)
        if isinstance(checked, Answer):
            self._trailers_only(stream_id, checked, ended)
            return
        if shared.in_flight >= limits.grpc_max_concurrent_requests:
            metrics.limit_hits.labels("grpc_max_concurrent_requests").inc()
            answer = Answer(
                StatusCode.RESOURCE_EXHAUSTED,
                "sidecar is handling too many calls at once; retry later",
                retry_after_s=limits.overload_retry_after_s,
            )
            self._trailers_only(stream_id, answer, ended)
            return
        call = _Call(stream_id, checked.spec, checked.encoding)
        self.calls[stream_id] = call
        shared.in_flight += 1
        self._idle_since = None
        timeout_s = limits.grpc_message_timeout_s
        if checked.timeout_s is not None and checked.timeout_s < timeout_s:
            timeout_s = checked.timeout_s
            call.client_deadline = True
        call.timer = self.loop.call_later(timeout_s, self._timeout, call)

    def _data(self, call: _Call, data: bytes | memoryview) -> None:
        data = retained(call, data)
        call.chunks.append(data)
        call.received += len(data)
        if call.length < 0:
            if call.received < PREFIX_BYTES:
                return
            first = call.chunks[0]
            if len(first) < PREFIX_BYTES:
                first = b"".join(call.chunks)
                call.chunks = [first]
            flag, call.length = read_prefix(first)
            call.compressed = flag == 1
            refusal = grpc_call.check_prefix(
                flag, call.length, call.encoding, self.limits, self.metrics
            )
            if refusal is not None:
                self._answer(call, refusal)
                return
        if call.received > PREFIX_BYTES + call.length:
            self.metrics.bad_requests.labels(TRANSPORT, "many_messages").inc()
            self._answer(call, grpc_call.invalid("Export takes exactly one request message"))

    def _message_done(self, call: _Call) -> None:
        """The client ended its stream: hand the one whole message to the pipeline."""
        if call.length < 0 or call.received < PREFIX_BYTES + call.length:
            self.metrics.bad_requests.labels(TRANSPORT, "no_message").inc()
            self._answer(call, grpc_call.invalid("no complete request message received"))
            return
        chunks, call.chunks = call.chunks, []
        if call.compressed:
            inflated = grpc_call.inflate(chunks, call.encoding or b"", self.limits, self.metrics)
            if isinstance(inflated, Answer):
                self._answer(call, inflated)
                return
            message = inflated
        else:  # the one copy from the socket to the pipeline (views of the reads joined)
            message = b"".join([memoryview(chunks[0])[PREFIX_BYTES:], *chunks[1:]])
            del chunks
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        call.running = True
        task = asyncio.ensure_future(self._run(call, message))
        self.shared.tasks.add(task)
        task.add_done_callback(self.shared.tasks.discard)

    async def _run(self, call: _Call, message: bytes) -> None:
        shared = self.shared
        try:
            answer = await shared.handle(call.spec, message, peer=self.peer)
        except Exception:  # boundary: a failing stage must not leave the call unanswered
            _failure_log.exception("gRPC %s call failed in the pipeline", call.spec.signal.value)
            answer = Answer(StatusCode.INTERNAL, "the sidecar failed to handle the request")
        except BaseException:  # cancelled (the loop is closing): give the slot back
            call.running = False
            self._drop(call)
            self._release(call)
            raise
        call.running = False
        self.guard.call_answered()
        if self.calls.get(call.stream_id) is call:
            self._answer(call, answer)
            self._flush()
        else:  # the client reset the stream or the connection was lost meanwhile
            self._release(call)

    def _timeout(self, call: _Call) -> None:
        call.timer = None
        if call.pending is not None:  # the answer could not be sent for want of window
            self.metrics.http2_refusals.labels("response_stalled").inc()
            self._reset(call.stream_id, h2.errors.ErrorCodes.CANCEL)
            self._drop(call)
            self._flush()
            return
        if call.answered or call.running:
            return
        if call.client_deadline:
            self.metrics.bad_requests.labels(TRANSPORT, "client_deadline").inc()
            message = "the call's grpc-timeout passed before its request message arrived"
        else:
            timeout_s = self.limits.grpc_message_timeout_s
            self.metrics.limit_hits.labels("grpc_message_timeout_s").inc()
            self.metrics.bad_requests.labels(TRANSPORT, "timeout").inc()
            message = f"request message not received within {timeout_s}s"
        self._answer(call, Answer(StatusCode.DEADLINE_EXCEEDED, message))
        self._flush()

    # -- answers --------------------------------------------------------------------------
    def _answer(self, call: _Call, answer: Answer) -> None:
        call.answered = True
        call.chunks = []
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        self._release(call)  # its work is done, even if the answer waits for window
        if self.transport is None:
            self._forget(call)
            return
        if answer.code is not StatusCode.OK:
            self._trailers_only(call.stream_id, answer, call.client_done)
            self._forget(call)
            return
        response = answer.response
        data = EMPTY_MESSAGE if not response else prefix(False, len(response)) + response
        try:
            self.h2.send_headers(call.stream_id, _RESPONSE_HEADERS)
        except h2.exceptions.ProtocolError:  # reset by the client meanwhile
            self._forget(call)
            return
        call.pending = data
        self._send_pending(call)

    def _send_pending(self, call: _Call) -> None:
        data = call.pending
        if data is None or self.transport is None:
            return
        conn = self.h2
        try:
            if conn.local_flow_control_window(call.stream_id) < len(data):
                self._stalled.add(call)
                if call.timer is None:  # bounded: see _timeout
                    call.timer = self.loop.call_later(
                        self.limits.grpc_message_timeout_s, self._timeout, call
                    )
                return
            call.pending = None
            self._stalled.discard(call)
            if call.timer is not None:
                call.timer.cancel()
                call.timer = None
            conn.send_data_unsplit(call.stream_id, data, end_stream=False)
            conn.send_headers(call.stream_id, _OK_TRAILERS, end_stream=True)
        except h2.exceptions.ProtocolError:  # reset by the client meanwhile
            pass
        self._forget(call)

    def _trailers_only(self, stream_id: int, answer: Answer, client_done: bool) -> None:
        """The status in one HEADERS frame that ends the stream; then, when the client
        has not finished sending, RST_STREAM(NO_ERROR) to stop it (RFC 9113, 8.1)."""
        if self.transport is None:
            return
        headers = [(b":status", answer.http_status), _CONTENT_TYPE]
        if answer.code is StatusCode.UNIMPLEMENTED:
            headers.append(_ACCEPT_ENCODING)
        headers.extend(
            (k.encode(), v.encode())
            for k, v in status_trailers(answer.code, answer.message, answer.retry_after_s)
        )
        try:
            self.h2.send_headers(stream_id, headers, end_stream=True)
        except h2.exceptions.ProtocolError:  # reset by the client meanwhile
            return
        if not client_done:
            self._reset(stream_id, _NO_ERROR)

    def _reset(self, stream_id: int, code: h2.errors.ErrorCodes) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):  # already closed
            self.h2.reset_stream(stream_id, code)

    def _drop(self, call: _Call) -> None:
        """The client reset the stream or went away (or its window stalled the answer):
        no answer; a call in the pipeline finishes and its answer is discarded."""
        call.answered = True
        call.chunks = []
        call.pending = None
        self._stalled.discard(call)
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
            self.shared.call_finished()

    # -- the connection -------------------------------------------------------------------
    def _flush(self) -> None:
        transport = self.transport
        if transport is None:
            return
        pieces = self.h2.take()
        if pieces:
            for piece in pieces:
                transport.write(piece)
            if transport.get_write_buffer_size() > self.bounds.max_write_buffer:
                self.metrics.http2_refusals.labels("not_reading").inc()
                logger.debug("gRPC connection from %s closed: it does not read", self.peer)
                self.abort()

    def _close(self) -> None:
        """Close after what was written (the last GOAWAY) reaches the client: nothing
        more is read into ``h2`` (``data_received`` discards once ``transport`` is None),
        the write side shuts down, and the connection lingers until the client closes
        (:class:`~gym_sidecar.wire.linger.Lingering`)."""
        transport, self.transport = self.transport, None
        if transport is not None:
            self._closing = transport
            self.shared.lingering.close(transport)

    def abort(self) -> None:
        """Close at once, dropping what is unsent (the receiver is done with it)."""
        if self.transport is not None:
            self.transport.abort()
            self.transport = None

    def _protocol_error(self, exc: h2.exceptions.ProtocolError) -> None:
        reason = (
            "header_list_too_large"
            if isinstance(exc, h2.exceptions.DenialOfServiceError)
            else "protocol_error"
        )
        self.metrics.http2_refusals.labels(reason).inc()
        logger.debug("gRPC connection from %s: HTTP/2 error %s", self.peer, exc)
        self._flush()  # h2 has queued its GOAWAY
        self._close()

    def _refuse_connection(self, abuse: Abuse) -> None:
        """A bound of the guard broken: GOAWAY with the abuse's code, then close. A
        header block too large is first answered on its stream (RESOURCE_EXHAUSTED, one
        HEADERS frame written past ``h2``, which has not seen the whole block), so the
        client learns why its call failed."""
        self.metrics.http2_refusals.labels(abuse.reason).inc()
        logger.debug("gRPC connection from %s closed: %s", self.peer, abuse)
        last = self.h2.highest_inbound_stream_id or 0
        if abuse.stream_id and abuse.stream_id not in self.calls and self.transport is not None:
            message = "request metadata too large: the header block exceeds its bound"
            headers = [(b":status", b"200"), _CONTENT_TYPE]
            headers.extend(
                (k.encode(), v.encode())
                for k, v in status_trailers(StatusCode.RESOURCE_EXHAUSTED, message, None)
            )
            block = self.h2.encoder.encode(headers)
            frame = HeadersFrame(abuse.stream_id, block, flags=("END_HEADERS", "END_STREAM"))
            self.h2.write_raw(frame.serialize())
            last = max(last, abuse.stream_id)
        self._write_goaway(h2.errors.ErrorCodes(abuse.error_code), last)
        self._close()

    def _write_goaway(self, code: h2.errors.ErrorCodes = _NO_ERROR, last: int = -1) -> None:
        """A GOAWAY naming the last stream served (``last``, else the highest the client
        opened), written past ``h2``: its own ``close_connection`` would forbid the
        answers still owed to the calls on it."""
        if self.transport is None:
            return
        if last < 0:
            last = self.h2.highest_inbound_stream_id or 0
        frame = GoAwayFrame(0, last_stream_id=last, error_code=code)
        self.h2.write_raw(frame.serialize())
        self._flush()

    def go_away(self) -> None:
        """Shutdown: GOAWAY (streams after the last one are refused with REFUSED_STREAM,
        which clients retry elsewhere); closed once the calls in progress are answered."""
        self.going_away = True
        self._write_goaway()
        if not self.calls:
            self._close()

    def _header_timeout(self) -> None:
        if self.transport is None:
            return
        self.metrics.limit_hits.labels("http_header_timeout_s").inc()
        logger.debug("gRPC connection from %s: preface or header block too slow", self.peer)
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
