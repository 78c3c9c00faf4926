"""A raw HTTP/2 client for the gRPC receiver's tests: the ``h2`` library as a client over
a blocking socket, plus ways around it (raw frames, a preface sent in pieces, settings
and socket buffers of the test's choosing), so that a test can send what no gRPC client
would: floods, rapid resets, oversized frames, slow prefaces, zero windows, HPACK bombs.

Every read is bounded (:data:`ANSWER_BOUND_S` unless told otherwise): a server that
never answers fails the test instead of hanging it.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import h2.config
import h2.events
import h2.exceptions
import h2.settings
from gym_sidecar.wire.http2.connection import H2Connection

from testkit.otlp_samples import SERVICES

ANSWER_BOUND_S = 5.0
"""Every input is answered (status, reset, GOAWAY or close) within this."""
PATH = f"/{SERVICES['traces']}/Export"


def grpc_frame(message: bytes, compressed: bool = False, length: int | None = None) -> bytes:
    """The gRPC length-prefixed message: flag byte, 4-byte big-endian length, message."""
    declared = len(message) if length is None else length
    return struct.pack(">BI", 1 if compressed else 0, declared) + message


def request_headers(path: str = PATH, **extra: str) -> list[tuple[str, str]]:
    """A gRPC call's request headers; ``extra`` keys have ``_`` turned into ``-``."""
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    return headers + [(k.replace("_", "-"), v) for k, v in extra.items()]


def raw_frame(
    kind: int, flags: int, stream_id: int, payload: bytes, length: int | None = None
) -> bytes:
    """One HTTP/2 frame as bytes; ``length`` may lie about the payload's size."""
    size = len(payload) if length is None else length
    return struct.pack(">I", size)[1:] + struct.pack(">BBI", kind, flags, stream_id) + payload


@dataclass
class Outcome:
    """How the server ended one stream."""

    grpc_status: int | None = None
    grpc_message: str = ""
    http_status: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    trailers: dict[str, str] = field(default_factory=dict)
    reset: int | None = None
    goaway: int | None = None
    closed: bool = False
    data: bytes = b""
    events: list[str] = field(default_factory=list)

    @property
    def ended(self) -> bool:
        return (
            self.grpc_status is not None
            or self.reset is not None
            or self.goaway is not None
            or self.closed
        )


class H2Client:
    """One cleartext HTTP/2 connection (prior knowledge, as gRPC without TLS uses).

    ``preface``: send the client preface and SETTINGS at once (``settings`` among them);
    ``rcvbuf``: the socket's receive buffer, set before connecting (a client that reads
    little).
    """

    def __init__(
        self,
        port: int,
        *,
        preface: bool = True,
        settings: dict[int, int] | None = None,
        rcvbuf: int | None = None,
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        self.sock.settimeout(0.2)
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        # The sidecar's subclass: plain h2 refuses every frame after a GOAWAY, so a drain
        # (answers after GOAWAY) could not be observed (gym_sidecar.wire.http2.connection).
        self.conn = H2Connection(config=config)
        if settings:
            self.conn.local_settings = h2.settings.Settings(client=True, initial_values=settings)
        self.closed = False
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.remote_settings: dict[int, int] = {}
        self.outcomes: dict[int, Outcome] = {}
        self.raw = not preface
        """No preface sent: h2 (whose state machine starts with it) is not fed what the
        server sends; reads only tell whether the connection is closed."""
        if preface:
            self.conn.initiate_connection()
            self.flush()

    def flush(self) -> None:
        for piece in self.conn.take():  # the subclass's output (data_to_send misses DATA)
            self.sock.sendall(piece)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def start(self, headers: list[tuple[str, str]], end_stream: bool = False) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream_id, headers, end_stream=end_stream)
        self.flush()
        return stream_id

    def send(self, stream_id: int, data: bytes, end_stream: bool = True) -> None:
        """``data`` as DATA frames the windows allow right now (no waiting)."""
        view = memoryview(data)
        size = self.conn.max_outbound_frame_size
        if not data:
            self.conn.send_data(stream_id, b"", end_stream=end_stream)
        for start in range(0, len(data), size):
            last = start + size >= len(data)
            self.conn.send_data(
                stream_id, view[start : start + size], end_stream=end_stream and last
            )
        self.flush()

    def send_flow_controlled(
        self, stream_id: int, data: bytes, end_stream: bool = True, bound_s: float = 30.0
    ) -> None:
        """``data`` as flow control allows, reading WINDOW_UPDATEs while it waits; fails
        when the windows stay shut for ``bound_s``."""
        view = memoryview(data)
        pos = 0
        deadline = time.monotonic() + bound_s
        while pos < len(data):
            window = min(
                self.conn.local_flow_control_window(stream_id),
                self.conn.max_outbound_frame_size,
                len(data) - pos,
            )
            if window <= 0:
                assert time.monotonic() < deadline, f"windows shut for {bound_s}s at byte {pos}"
                self.read_once()
                continue
            end = pos + window
            self.conn.send_data(
                stream_id, view[pos:end], end_stream=end_stream and end == len(data)
            )
            self.flush()
            pos = end

    def read_once(self) -> list[h2.events.Event]:
        """One socket read (at most 0.2 s), fed to ``h2``; the events it made."""
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return []
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.closed = True
            return []
        if self.raw:
            return []
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.closed = True
            return []
        for event in events:
            self._apply(event)
        self.flush()
        return events

    def read_until(self, done: Callable[[], bool], bound_s: float = ANSWER_BOUND_S) -> bool:
        """Read until ``done()`` or the connection closes; whether ``done()`` held."""
        deadline = time.monotonic() + bound_s
        while not done() and not self.closed and time.monotonic() < deadline:
            self.read_once()
        return done()

    def wait(self, stream_id: int, bound_s: float = ANSWER_BOUND_S) -> Outcome:
        """Read until the stream ends; fail the test if that takes over ``bound_s``."""
        out = self.outcome(stream_id)
        self.read_until(lambda: out.ended, bound_s)
        if self.closed:
            out.closed = True
        assert out.ended, f"stream {stream_id} not answered in {bound_s}s: {out}"
        return out

    def wait_closed(self, bound_s: float = ANSWER_BOUND_S) -> bool:
        """Whether the server closed the connection within ``bound_s``."""
        self.read_until(lambda: False, bound_s)
        return self.closed

    def outcome(self, stream_id: int) -> Outcome:
        return self.outcomes.setdefault(stream_id, Outcome())

    def _apply(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = event
            for out in self.outcomes.values():
                out.goaway = int(event.error_code or 0)
            return
        if isinstance(event, h2.events.RemoteSettingsChanged):
            self.remote_settings.update(
                {int(k): v.new_value for k, v in event.changed_settings.items()}
            )
            return
        stream_id = getattr(event, "stream_id", None)
        if not stream_id:
            return
        out = self.outcome(stream_id)
        out.events.append(type(event).__name__)
        if isinstance(event, h2.events.StreamReset):
            out.reset = int(event.error_code)
        elif isinstance(event, h2.events.DataReceived):
            out.data += event.data
            self.conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
        elif isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
            headers = {str(k): str(v) for k, v in event.headers}
            if isinstance(event, h2.events.ResponseReceived):
                out.headers = headers
            else:
                out.trailers = headers
            out.http_status = headers.get(":status", out.http_status)
            if "grpc-status" in headers:
                out.grpc_status = int(headers["grpc-status"])
                out.grpc_message = headers.get("grpc-message", "")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> H2Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
