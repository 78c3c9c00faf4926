"""The client end of gRPC over HTTP/2 (``h2``): one connection carrying unary calls, as
the h2 exporter (:mod:`gym_sidecar.export.grpc_h2`) uses it.

One HTTP/2 connection (:class:`~.connection.H2Connection`, shared with the receiver's
server connection; this module does the I/O) multiplexes the concurrent calls; each
call is one stream: the caller's HEADERS, then DATA frames carrying the length-prefixed
message (:mod:`.grpc_framing`), sent as flow control allows and uncopied
(:meth:`~.connection.H2Connection.send_data_unsplit`). The answer is collected on a
:class:`Call`: HEADERS (``:status``), DATA, trailers; or trailers only. What the answer
means is the caller's.

How a call fails without an answer from the server (:class:`CallFailed`, with the gRPC
code grpc core would report): a refused connection, a connection lost mid-call, an
HTTP/2 protocol error and a GOAWAY before the call was processed are UNAVAILABLE; a
reset stream maps as grpc core maps it (REFUSED_STREAM is UNAVAILABLE, CANCEL is
CANCELLED, ENHANCE_YOUR_CALM RESOURCE_EXHAUSTED, INADEQUATE_SECURITY PERMISSION_DENIED,
everything else INTERNAL). A GOAWAY lets the calls the server still serves finish; the
connection then takes no new call (:attr:`ClientConnection.usable`). The client's own
GOAWAY (closing, or after an HTTP/2 error from the server) reaches the server before the
close: the write side shuts down after it and the reader drains until the server closes,
:data:`CLOSE_LINGER_S` at most.

Loop-confined: one event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field

import h2.errors
import h2.events
import h2.exceptions

from gym_sidecar.core.grpc_status import StatusCode
from gym_sidecar.wire.http2.connection import H2Connection

_RESET_TO_GRPC = {
    h2.errors.ErrorCodes.REFUSED_STREAM: StatusCode.UNAVAILABLE,
    h2.errors.ErrorCodes.CANCEL: StatusCode.CANCELLED,
    h2.errors.ErrorCodes.ENHANCE_YOUR_CALM: StatusCode.RESOURCE_EXHAUSTED,
    h2.errors.ErrorCodes.INADEQUATE_SECURITY: StatusCode.PERMISSION_DENIED,
}
"""RST_STREAM codes grpc core maps to something other than INTERNAL."""

READ_BYTES = 256 * 1024
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
"""A response's DATA beyond this fails the call (RESOURCE_EXHAUSTED)."""
_LAST_STREAM_ID = 2**31 - 1
CLOSE_LINGER_S = 2.0
"""How long a closing connection drains the server's bytes after its GOAWAY, at most
(the listeners' ``limits.close_linger_s`` default)."""


class CallFailed(Exception):
    """A call ended without a gRPC status from the server (connection, reset, GOAWAY)."""

    def __init__(self, code: StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Call:
    """One unary call (one HTTP/2 stream) waiting for its answer."""

    done: asyncio.Future[None]
    headers: list[tuple[str, str]] = field(default_factory=list)
    trailers: list[tuple[str, str]] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    error: CallFailed | None = None

    def finish(self, error: CallFailed | None = None) -> None:
        if not self.done.done():
            self.error = error
            self.done.set_result(None)


def _text(value: bytes | str) -> str:
    return value if isinstance(value, str) else value.decode("latin-1")


class ClientConnection:
    """One HTTP/2 connection: a reader task dispatches frames to the calls on it."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        self.peer = peer
        self._reader = reader
        self._writer = writer
        self.h2 = H2Connection.for_grpc(client_side=True)
        self.h2.initiate_connection()
        self.calls: dict[int, Call] = {}
        self.closed: CallFailed | None = None
        self.going_away = False
        self._quiet = False  # closing: see _go_quiet
        self._window = asyncio.Event()
        self.flush()
        self._task = asyncio.create_task(self._read(), name=f"grpc-h2-reader-{peer}")

    @classmethod
    async def open(
        cls, host: str, port: int, tls: ssl.SSLContext | None, peer: str
    ) -> ClientConnection:
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=host if tls else None, limit=READ_BYTES
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
            self._fail_all(CallFailed(StatusCode.UNAVAILABLE, f"{self.peer}: {err}"))

    def start(self, headers: list[tuple[str, str]]) -> tuple[int, Call]:
        """Open a stream with ``headers``; raises CallFailed when the connection cannot."""
        if self.closed is not None:
            raise self.closed
        try:
            stream_id = self.h2.get_next_available_stream_id()
            self.h2.send_headers(stream_id, headers)
        except (h2.exceptions.NoAvailableStreamIDError, h2.exceptions.TooManyStreamsError) as err:
            self.going_away = True
            raise CallFailed(StatusCode.UNAVAILABLE, f"{self.peer}: {err!r}") from None
        call = Call(asyncio.get_running_loop().create_future())
        self.calls[stream_id] = call
        self.flush()
        return stream_id, call

    async def send_body(
        self, stream_id: int, call: Call, parts: Iterable[bytes | memoryview]
    ) -> None:
        """Send ``parts`` (the message prefix, then the body's pieces) on ``stream_id`` as
        flow control allows, in as few DATA frames as the peer's frame size allows, then
        end the stream. Pieces go out uncopied (slices of a piece the windows cut are
        views); ``parts`` is read lazily, one piece ahead of the one being sent."""
        conn = self.h2
        pieces = iter(parts)
        part = next(pieces, None)
        ended = False
        while part is not None:
            following = next(pieces, None)
            last = following is None
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
                chunk = part if pos == 0 and end == size else memoryview(part)[pos:end]
                ended = last and end == size
                try:
                    conn.send_data_unsplit(stream_id, chunk, end_stream=ended)
                except h2.exceptions.StreamClosedError:
                    return  # the server ended or reset the stream; its answer tells why
                pos = end
                self.flush()
                await self.drain()
            part = following
        if not ended:
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
        """GOAWAY, then the lingering close (:meth:`_go_quiet`): the reader drains until
        the server closes, :data:`CLOSE_LINGER_S` at most; then the socket closes."""
        if self.closed is None:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.close_connection()
                self.flush()
        self._fail_all(CallFailed(StatusCode.UNAVAILABLE, "exporter closed"))
        self._go_quiet()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(self._task), CLOSE_LINGER_S)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    def _go_quiet(self) -> None:
        """Read nothing more into ``h2`` (the reader discards until EOF) and shut the
        write side down once what was written (a GOAWAY) is out, so the server reads it
        instead of a reset (the same close as the listeners', :mod:`gym_sidecar.wire.linger`)."""
        if self._quiet:
            return
        self._quiet = True
        if self._writer.can_write_eof() and not self._writer.is_closing():
            with contextlib.suppress(OSError, RuntimeError):
                self._writer.write_eof()

    def _fail_all(self, error: CallFailed) -> None:
        if self.closed is None:
            self.closed = error
        for call in self.calls.values():
            call.finish(error)
        self.calls.clear()
        self._window.set()

    async def _read(self) -> None:
        try:
            while True:
                data = await self._reader.read(READ_BYTES)
                if not data:
                    self._fail_all(
                        CallFailed(StatusCode.UNAVAILABLE, f"{self.peer} closed connection")
                    )
                    return
                if self._quiet:
                    continue  # closing: drained, not read
                try:
                    events = self.h2.receive_data(data)
                except h2.exceptions.ProtocolError as err:
                    # Retryable, like a connection lost mid-call: the server may not have
                    # processed the calls; retrying risks a duplicate, dropping a loss.
                    self._fail_all(
                        CallFailed(StatusCode.UNAVAILABLE, f"{self.peer}: HTTP/2 error {err!r}")
                    )
                    self.flush()  # h2's GOAWAY, then the lingering close
                    self._go_quiet()
                    continue
                for event in events:
                    self._dispatch(event)
                self.flush()
        except (ConnectionError, OSError) as err:
            self._fail_all(CallFailed(StatusCode.UNAVAILABLE, f"{self.peer}: {err}"))

    def _dispatch(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            if event.flow_controlled_length:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            call = self.calls.get(event.stream_id)
            if call is not None and event.data:
                if len(call.data) + len(event.data) > MAX_RESPONSE_BYTES:
                    self.cancel(event.stream_id)
                    call.finish(CallFailed(StatusCode.RESOURCE_EXHAUSTED, "response too large"))
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
                call.finish(CallFailed(code, f"stream reset by {self.peer}: {event.error_code!r}"))
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
                    CallFailed(StatusCode.UNAVAILABLE, f"{self.peer} sent GOAWAY")
                )
            if event.error_code != h2.errors.ErrorCodes.NO_ERROR:
                self._fail_all(
                    CallFailed(
                        StatusCode.UNAVAILABLE,
                        f"{self.peer} closed the connection: {event.error_code!r}",
                    )
                )
