"""OTLP/gRPC exporter that speaks gRPC's wire format over HTTP/2 itself, with ``h2``.

Why not ``grpc.aio`` (the :mod:`.otlp_grpc` exporter, still selectable with
``backend.grpc_client: grpcio``): grpc core compresses a message itself, with zlib at its
default level, on the event-loop thread, and grpc Python cannot send a message the
caller compressed already. Profiled in the sidecar under load, that compression was
~43% of its samples, and it kept gRPC/gzip export at 0.65-0.86x rotel's spans per
CPU-second (docs/benchmarks.md). This exporter compresses with zlib-ng at
``backend.compression_level`` in a worker thread (the GIL is released while it
deflates) and sends the result as a gRPC message with the compressed flag set and
``grpc-encoding: gzip``, exactly what grpc core would put on the wire. Without
compression it is the default too: then importing grpc at all (~13 MiB resident) is
what it saves (docs/benchmarks.md, "Round 4").

The message body goes to the socket as the very ``bytes`` object the queue handed over:
``h2`` keeps the stream state and the flow-control windows, but its DATA path copies a
body six times (``tobytes``, two joins, its output buffer, ``data_to_send``) in frames
of the peer's SETTINGS_MAX_FRAME_SIZE. :class:`_ClientConnection` (a subclass, over
``h2``'s ``_prepare_for_sending``; the version range is pinned in the sidecar's
dependencies and exercised by the tests) lets ``h2`` account for as much as the windows
allow in one DATA frame and cuts it into frames of the peer's size itself: a 9-byte
header and a memoryview of the body per frame.

The protocol (gRPC over HTTP/2, unary calls only): one HTTP/2 connection (``h2``, a
maintained pure-Python HTTP/2 state machine; this module does the I/O and the gRPC
framing) multiplexes the concurrent calls; each call is one stream: HEADERS
(``:method POST``, ``:path`` the method, ``content-type: application/grpc``,
``te: trailers``, ``grpc-timeout``, the configured headers as metadata), then DATA
frames carrying the length-prefixed message, respecting HTTP/2 flow control. The answer
is HEADERS (``:status``), DATA (one length-prefixed response message, possibly gzip'd)
and trailers (``grpc-status``, ``grpc-message``, ``grpc-status-details-bin``, other
``-bin`` metadata base64-encoded), or trailers only.

Outcomes are those of :mod:`.otlp_grpc` (the same :func:`~.grpc_outcome.classify`,
:func:`~gym_sidecar.core.grpc_status.retry_delay_s` and ``rejected_items``): a refused
connection, a connection lost mid-call, GOAWAY before the call was processed and a
timeout are retryable (UNAVAILABLE / DEADLINE_EXCEEDED, as grpc core reports them); an
HTTP status other than 200 maps to a gRPC code as the gRPC spec's HTTP-to-gRPC table
says; a reset stream maps as grpc core maps it (REFUSED_STREAM is UNAVAILABLE, CANCEL
is CANCELLED, everything else INTERNAL); an HTTP/2 protocol error on the connection is
UNAVAILABLE. A GOAWAY lets the calls the server still serves finish
(:class:`gym_sidecar.wire.http2.connection.H2Connection`). A broken connection is
replaced at the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
import zlib
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
from hyperframe.frame import DataFrame, Frame

from gym_sidecar.core.exporter import Exporter, ExportResult
from gym_sidecar.core.grpc_status import StatusCode, decode_bin, retry_delay_s
from gym_sidecar.core.signals import SPECS, rejected_items
from gym_sidecar.core.stage import Signal
from gym_sidecar.export.config import BackendConfig
from gym_sidecar.export.grpc_outcome import classify
from gym_sidecar.export.otlp_http import gzip_body, gzip_library
from gym_sidecar.wire.http2.connection import H2Connection, quiet_frame_reprs

logger = logging.getLogger(__name__)

_HTTP_TO_GRPC = {
    400: StatusCode.INTERNAL,
    401: StatusCode.UNAUTHENTICATED,
    403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.UNIMPLEMENTED,
    429: StatusCode.UNAVAILABLE,
    502: StatusCode.UNAVAILABLE,
    503: StatusCode.UNAVAILABLE,
    504: StatusCode.UNAVAILABLE,
}
"""The gRPC spec's mapping of a non-200 HTTP status (no grpc-status) to a code."""

_RESET_TO_GRPC = {
    h2.errors.ErrorCodes.REFUSED_STREAM: StatusCode.UNAVAILABLE,
    h2.errors.ErrorCodes.CANCEL: StatusCode.CANCELLED,
    h2.errors.ErrorCodes.ENHANCE_YOUR_CALM: StatusCode.RESOURCE_EXHAUSTED,
    h2.errors.ErrorCodes.INADEQUATE_SECURITY: StatusCode.PERMISSION_DENIED,
}
"""RST_STREAM codes grpc core maps to something other than INTERNAL."""

_INLINE_GZIP_BYTES = 64 * 1024
"""Smaller payloads are compressed on the loop: a thread hop costs more than they do."""
_READ_BYTES = 256 * 1024
_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
_LAST_STREAM_ID = 2**31 - 1
_ANY_FRAME_SIZE = 2**31 - 1
_DIRECT_BYTES = 4096
"""DATA frames at least this long go to the socket as header + memoryview of the body."""
_END_STREAM = 0x1


class _ClientConnection(H2Connection):
    """``h2``'s connection with a copy-free DATA path (module doc).

    :meth:`send_data_unsplit` lets ``h2`` account for one DATA frame of any size (it
    checks sizes against :attr:`max_outbound_frame_size`, which reads as unlimited only
    during that call); :meth:`_prepare_for_sending`, where every frame ``h2`` emits
    passes, cuts such a frame into frames of the peer's SETTINGS_MAX_FRAME_SIZE without
    copying its body. :meth:`take` returns what to write, in order.
    """

    def __init__(self, config: h2.config.H2Configuration) -> None:
        self.frame_limit = 16384
        self._unsplit = False
        self._out: list[bytes | memoryview] = []
        self._small = bytearray()
        super().__init__(config=config)

    @property
    def max_outbound_frame_size(self) -> int:
        return _ANY_FRAME_SIZE if self._unsplit else self.frame_limit

    @max_outbound_frame_size.setter
    def max_outbound_frame_size(self, value: int) -> None:
        self.frame_limit = value  # h2 sets it from the peer's SETTINGS

    def send_data_unsplit(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        self._unsplit = True
        try:
            self.send_data(stream_id, data, end_stream=end_stream)
        finally:
            self._unsplit = False

    def _prepare_for_sending(self, frames: list[Frame]) -> None:
        for frame in frames:
            if (
                isinstance(frame, DataFrame)
                and len(frame.data) >= _DIRECT_BYTES
                and "PADDED" not in frame.flags
            ):
                self._direct(frame)
            else:
                self._small += frame.serialize()

    def _direct(self, frame: DataFrame) -> None:
        body = memoryview(frame.data)
        size, limit = len(body), self.frame_limit
        end = _END_STREAM if "END_STREAM" in frame.flags else 0
        for start in range(0, size, limit):
            chunk = body[start : start + limit]
            flags = end if start + limit >= size else 0
            self._small += struct.pack(
                ">BHBBL", len(chunk) >> 16, len(chunk) & 0xFFFF, 0, flags, frame.stream_id
            )
            self._out.append(bytes(self._small))
            self._small.clear()
            self._out.append(chunk)

    def take(self) -> list[bytes | memoryview]:
        """Everything to write, in order (``h2``'s own buffer holds only the preface)."""
        out = self._out
        if self._data_to_send:
            out.insert(0, bytes(self._data_to_send))
            self._data_to_send.clear()
        if self._small:
            out.append(bytes(self._small))
            self._small.clear()
        self._out = []
        return out


class _CallFailed(Exception):
    """A call ended without a gRPC status from the server (connection, reset, GOAWAY)."""

    def __init__(self, code: StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Call:
    """One unary call (one HTTP/2 stream) waiting for its answer."""

    done: asyncio.Future[None]
    headers: list[tuple[str, str]] = field(default_factory=list)
    trailers: list[tuple[str, str]] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    error: _CallFailed | None = None

    def finish(self, error: _CallFailed | None = None) -> None:
        if not self.done.done():
            self.error = error
            self.done.set_result(None)


def _text(value: bytes | str) -> str:
    return value if isinstance(value, str) else value.decode("latin-1")


class _Connection:
    """One HTTP/2 connection: a reader task dispatches frames to the calls on it."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        self.peer = peer
        self._reader = reader
        self._writer = writer
        config = h2.config.H2Configuration(
            client_side=True,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self.h2 = _ClientConnection(config=config)
        self.h2.initiate_connection()
        self.calls: dict[int, _Call] = {}
        self.closed: _CallFailed | None = None
        self.going_away = False
        self._window = asyncio.Event()
        self.flush()
        self._task = asyncio.create_task(self._read(), name=f"grpc-h2-reader-{peer}")

    @classmethod
    async def open(cls, host: str, port: int, tls: ssl.SSLContext | None, peer: str) -> _Connection:
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=host if tls else None, limit=_READ_BYTES
        )
        if tls is not None:
            ssl_obj = writer.get_extra_info("ssl_object")
            alpn = ssl_obj.selected_alpn_protocol() if ssl_obj is not None else None
            if alpn != "h2":
                writer.close()
                raise ConnectionError(f"{peer} did not negotiate HTTP/2 over TLS (ALPN {alpn})")
        return cls(reader, writer, peer)

    @property
    def usable(self) -> bool:
        """False once broken, going away, or out of stream ids: open a new one."""
        if self.closed is not None or self.going_away:
            return False
        highest = self.h2.highest_outbound_stream_id
        return highest is None or highest < _LAST_STREAM_ID - 2

    def flush(self) -> None:
        pieces = self.h2.take()
        if pieces and not self._writer.is_closing():
            for piece in pieces:
                self._writer.write(piece)

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except (ConnectionError, OSError) as err:
            self._fail_all(_CallFailed(StatusCode.UNAVAILABLE, f"{self.peer}: {err}"))

    def start(self, headers: list[tuple[str, str]]) -> tuple[int, _Call]:
        """Open a stream with ``headers``; raises _CallFailed when the connection cannot."""
        if self.closed is not None:
            raise self.closed
        try:
            stream_id = self.h2.get_next_available_stream_id()
            self.h2.send_headers(stream_id, headers)
        except (h2.exceptions.NoAvailableStreamIDError, h2.exceptions.TooManyStreamsError) as err:
            self.going_away = True
            raise _CallFailed(StatusCode.UNAVAILABLE, f"{self.peer}: {err!r}") from None
        call = _Call(asyncio.get_running_loop().create_future())
        self.calls[stream_id] = call
        self.flush()
        return stream_id, call

    async def send_body(self, stream_id: int, call: _Call, parts: tuple[bytes, ...]) -> None:
        """Send ``parts`` (the message prefix, then the body) on ``stream_id`` as flow
        control allows, in as few DATA frames as the peer's frame size allows, then end
        the stream. A part the windows take whole goes out uncopied."""
        conn = self.h2
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            pos, size = 0, len(part)
            while pos < size:
                if call.done.done():
                    return  # answered (or failed) before we finished: nothing more to send
                if self.closed is not None:
                    raise self.closed
                window = conn.local_flow_control_window(stream_id)
                if window <= 0:
                    self._window.clear()
                    waiter = asyncio.ensure_future(self._window.wait())
                    await asyncio.wait((waiter, call.done), return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    continue
                end = min(size, pos + window)
                chunk = part if pos == 0 and end == size else part[pos:end]
                try:
                    conn.send_data_unsplit(stream_id, chunk, end_stream=last and end == size)
                except h2.exceptions.StreamClosedError:
                    return  # the server ended or reset the stream; its answer tells why
                pos = end
                self.flush()
                await self.drain()
        if not parts or not parts[-1]:
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                conn.end_stream(stream_id)
                self.flush()

    def cancel(self, stream_id: int) -> None:
        """Reset a stream we stopped waiting for (timeout, cancellation)."""
        self.calls.pop(stream_id, None)
        if self.closed is None:
            with contextlib.suppress(h2.exceptions.ProtocolError, KeyError):
                self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                self.flush()

    def forget(self, stream_id: int) -> None:
        self.calls.pop(stream_id, None)

    async def close(self) -> None:
        if self.closed is None:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.close_connection()
                self.flush()
        self._fail_all(_CallFailed(StatusCode.UNAVAILABLE, "exporter closed"))
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    def _fail_all(self, error: _CallFailed) -> None:
        if self.closed is None:
            self.closed = error
        for call in self.calls.values():
            call.finish(error)
        self.calls.clear()
        self._window.set()

    async def _read(self) -> None:
        try:
            while True:
                data = await self._reader.read(_READ_BYTES)
                if not data:
                    self._fail_all(
                        _CallFailed(StatusCode.UNAVAILABLE, f"{self.peer} closed connection")
                    )
                    return
                try:
                    events = self.h2.receive_data(data)
                except h2.exceptions.ProtocolError as err:
                    # Retryable, like a connection lost mid-call: the server may not have
                    # processed the calls; retrying risks a duplicate, dropping a loss.
                    self._fail_all(
                        _CallFailed(StatusCode.UNAVAILABLE, f"{self.peer}: HTTP/2 error {err!r}")
                    )
                    return
                for event in events:
                    self._dispatch(event)
                self.flush()
        except (ConnectionError, OSError) as err:
            self._fail_all(_CallFailed(StatusCode.UNAVAILABLE, f"{self.peer}: {err}"))

    def _dispatch(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            if event.flow_controlled_length:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            call = self.calls.get(event.stream_id)
            if call is not None and event.data:
                if len(call.data) + len(event.data) > _MAX_RESPONSE_BYTES:
                    self.cancel(event.stream_id)
                    call.finish(_CallFailed(StatusCode.RESOURCE_EXHAUSTED, "response too large"))
                else:
                    call.data += event.data
        elif isinstance(event, h2.events.ResponseReceived):
            call = self.calls.get(event.stream_id)
            if call is not None:
                call.headers = [(_text(k), _text(v)) for k, v in event.headers]
        elif isinstance(event, h2.events.TrailersReceived):
            call = self.calls.get(event.stream_id)
            if call is not None:
                call.trailers = [(_text(k), _text(v)) for k, v in event.headers]
        elif isinstance(event, h2.events.StreamEnded):
            call = self.calls.pop(event.stream_id, None)
            if call is not None:
                call.finish()
            self._window.set()
        elif isinstance(event, h2.events.StreamReset):
            call = self.calls.pop(event.stream_id, None)
            if call is not None:
                code = _RESET_TO_GRPC.get(event.error_code, StatusCode.INTERNAL)  # type: ignore[call-overload]
                call.finish(_CallFailed(code, f"stream reset by {self.peer}: {event.error_code!r}"))
            self._window.set()
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self._window.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            # GOAWAY: calls above last_stream_id were not processed and may be retried;
            # the rest may still finish. No new calls on this connection.
            self.going_away = True
            last = event.last_stream_id if event.last_stream_id is not None else 0
            for stream_id in [s for s in self.calls if s > last]:
                self.calls.pop(stream_id).finish(
                    _CallFailed(StatusCode.UNAVAILABLE, f"{self.peer} sent GOAWAY")
                )
            if event.error_code != h2.errors.ErrorCodes.NO_ERROR:
                self._fail_all(
                    _CallFailed(
                        StatusCode.UNAVAILABLE,
                        f"{self.peer} closed the connection: {event.error_code!r}",
                    )
                )


def _message(data: bytearray, encoding: str | None) -> bytes:
    """The one response message of a unary call (empty when there is none)."""
    if len(data) < 5:
        return b""
    flag, length = struct.unpack_from(">BI", data)
    body = bytes(data[5 : 5 + length])
    if not flag:
        return body
    if encoding == "gzip":
        return zlib.decompress(body, 31)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise ValueError(f"response compressed with unsupported encoding {encoding!r}")


def _outcome(signal: Signal, call: _Call, items: int) -> ExportResult:
    """Read a finished call's status, trailers and response into an export outcome."""
    headers = dict(call.headers)
    fields = dict(call.headers + call.trailers)  # trailers-only answers carry it in headers
    http_status = headers.get(":status", "")
    status = fields.get("grpc-status")
    if status is None:
        if http_status != "200":
            code = _HTTP_TO_GRPC.get(int(http_status or 0), StatusCode.UNKNOWN)
            return classify(code, f"HTTP status {http_status or 'missing'}", None)
        return classify(StatusCode.UNKNOWN, "the answer has no grpc-status", None)
    code = StatusCode.parse(status)
    if code is not StatusCode.OK:
        binary = [
            (k, v)
            for k, raw in call.trailers + call.headers
            if k.endswith("-bin") and (v := decode_bin(raw)) is not None
        ]
        return classify(code, unquote(fields.get("grpc-message", "")), retry_delay_s(binary))
    try:
        response = _message(call.data, headers.get("grpc-encoding"))
    except (ValueError, zlib.error) as err:
        # The data was accepted; an unreadable response only loses the rejection count.
        logger.warning("backend sent an unreadable %s export response: %s", signal.value, err)
        return ExportResult.success()
    rejected, message = rejected_items(signal, response)
    return ExportResult.success(min(rejected, items), message)


class GrpcH2Exporter(Exporter):
    """OTLP/gRPC export over one HTTP/2 connection (module doc). Use on one event loop."""

    name = "otlp_grpc_h2"

    def __init__(self, config: BackendConfig) -> None:
        if config.url is None:
            raise ValueError("GrpcH2Exporter needs backend.url")
        parts = urlsplit(config.url)
        self._tls: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self._tls = ssl.create_default_context()
            self._tls.set_alpn_protocols(["h2"])
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._tls else 4317)
        host = f"[{self._host}]" if ":" in self._host else self._host
        self.target = f"{host}:{self._port}"
        self._timeout_s = config.timeout_s
        self._gzip = config.compression == "gzip"
        self._level = config.compression_level
        millis = min(int(config.timeout_s * 1000), 99_999_999)
        self._headers: dict[Signal, list[tuple[str, str]]] = {
            signal: [
                (":method", "POST"),
                (":scheme", "https" if self._tls else "http"),
                (":path", method),
                (":authority", self.target),
                ("te", "trailers"),
                ("content-type", "application/grpc"),
                ("user-agent", "gym-sidecar-grpc-h2"),
                ("grpc-timeout", f"{millis}m"),
                ("grpc-accept-encoding", "identity,gzip"),
                *([("grpc-encoding", "gzip")] if self._gzip else []),
                *((k.lower(), v) for k, v in config.headers.items()),
            ]
            for signal, method in ((s, spec.grpc_method) for s, spec in SPECS.items())
        }
        self._conn: _Connection | None = None
        self._connect_lock = asyncio.Lock()
        self._closed = False
        self._closing: set[asyncio.Future[None]] = set()
        quiet_frame_reprs()
        if self._gzip:
            logger.info("OTLP/gRPC export: gzip with %s at level %d", gzip_library(), self._level)

    async def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and conn.usable:
            return conn
        async with self._connect_lock:
            conn = self._conn
            if conn is None or not conn.usable:
                if conn is not None:
                    # Let calls still running on a GOAWAY'd connection finish; close it after.
                    asyncio.get_running_loop().call_later(self._timeout_s, self._retire, conn)
                try:
                    conn = await _Connection.open(self._host, self._port, self._tls, self.target)
                except (OSError, ssl.SSLError) as err:
                    raise _CallFailed(
                        StatusCode.UNAVAILABLE, f"cannot connect to {self.target}: {err}"
                    ) from None
                self._conn = conn
            return conn

    def _retire(self, conn: _Connection) -> None:
        task = asyncio.ensure_future(conn.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _call(self, signal: Signal, payload: bytes, items: int) -> ExportResult:
        if self._gzip:
            if len(payload) < _INLINE_GZIP_BYTES:
                body = gzip_body(payload, self._level)
            else:
                body = await asyncio.to_thread(gzip_body, payload, self._level)
            prefix = struct.pack(">BI", 1, len(body))
        else:
            body = payload
            prefix = struct.pack(">BI", 0, len(body))
        conn = await self._connection()
        stream_id, call = conn.start(self._headers[signal])
        try:
            # The prefix goes as its own 5-byte DATA frame so that the body is never
            # concatenated to it (a copy of the whole batch).
            await conn.send_body(stream_id, call, (prefix, body) if body else (prefix,))
            await call.done
        except BaseException:
            conn.cancel(stream_id)
            raise
        conn.forget(stream_id)
        if call.error is not None:
            raise call.error
        return _outcome(signal, call, items)

    async def export(self, signal: Signal, payload: bytes, items: int) -> ExportResult:
        if self._closed:
            return ExportResult.retryable("exporter closed")
        try:
            return await asyncio.wait_for(self._call(signal, payload, items), self._timeout_s)
        except TimeoutError:
            return classify(
                StatusCode.DEADLINE_EXCEEDED, f"no answer within {self._timeout_s}s", None
            )
        except _CallFailed as err:
            return classify(err.code, err.message, None)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
