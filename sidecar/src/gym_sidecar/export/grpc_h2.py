"""OTLP/gRPC exporter that speaks gRPC's wire format over HTTP/2 itself, with ``h2``.

Why not ``grpc.aio`` (the :mod:`.otlp_grpc` exporter, still selectable with
``backend.grpc_client: grpcio``): grpc core compresses a message itself, with zlib at its
default level, on the event-loop thread, and grpc Python cannot send a message the
caller compressed already. Profiled in the sidecar under load, that compression was
~43% of its samples, and it kept gRPC/gzip export at 0.65-0.86x rotel's spans per
CPU-second (docs/benchmarks.md). This exporter compresses at
``backend.compression_level`` (ISA-L or zlib-ng, :mod:`gym_sidecar.wire.deflate`) in a
worker thread (the GIL is released while it deflates) and sends the result as a gRPC
message with the compressed flag set and ``grpc-encoding: gzip``, exactly what grpc
core would put on the wire. Without compression it is the default too: then importing
grpc at all (~13 MiB resident) is what it saves (docs/benchmarks.md, "Round 4").

The call itself (one HTTP/2 stream on one shared connection, the message sent as flow
control allows and uncopied, the answer collected) is the wire layer's
(:mod:`gym_sidecar.wire.http2.grpc_client`, over the connection the receiver uses too);
this module builds the request headers (``:method POST``, ``:path`` the method,
``content-type: application/grpc``, ``te: trailers``, ``grpc-timeout``, the configured
headers as metadata), compresses and frames the message (:mod:`.grpc_framing
<gym_sidecar.wire.http2.grpc_framing>`), and reads the answer: HEADERS (``:status``),
DATA (one length-prefixed response message, possibly gzip'd) and trailers
(``grpc-status``, ``grpc-message``, ``grpc-status-details-bin``, other ``-bin`` metadata
base64-encoded), or trailers only.

Outcomes are those of :mod:`.otlp_grpc` (the same :func:`~.grpc_outcome.classify`,
:func:`~gym_sidecar.core.grpc_status.retry_delay_s` and ``rejected_items``): a refused
connection, a connection lost mid-call, GOAWAY before the call was processed and a
timeout are retryable (UNAVAILABLE / DEADLINE_EXCEEDED, as grpc core reports them); an
HTTP status other than 200 maps to a gRPC code as the gRPC spec's HTTP-to-gRPC table
says; a reset stream maps as grpc core maps it (:mod:`~gym_sidecar.wire.http2.grpc_client`);
an HTTP/2 protocol error on the connection is UNAVAILABLE. A GOAWAY lets the calls the
server still serves finish. A broken connection is replaced at the next call.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from collections.abc import Iterable, Sequence
from urllib.parse import unquote, urlsplit

from gym_sidecar.core.exporter import Exporter, ExportResult
from gym_sidecar.core.grpc_status import StatusCode, decode_bin, retry_delay_s
from gym_sidecar.core.signals import SPECS, rejected_items
from gym_sidecar.core.stage import Signal
from gym_sidecar.export.body import Piece, body_size, coalesced, gzip_parts
from gym_sidecar.export.config import BackendConfig
from gym_sidecar.export.grpc_outcome import classify
from gym_sidecar.wire import deflate
from gym_sidecar.wire.http2 import grpc_framing
from gym_sidecar.wire.http2.connection import quiet_frame_reprs
from gym_sidecar.wire.http2.grpc_client import (
    MAX_RESPONSE_BYTES,
    Call,
    CallFailed,
    ClientConnection,
)

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

_INLINE_GZIP_BYTES = 64 * 1024
"""Smaller payloads are compressed on the loop: a thread hop costs more than they do."""


def _message(data: bytearray, encoding: str | None) -> bytes:
    """The one response message of a unary call (empty when there is none)."""
    if len(data) < grpc_framing.PREFIX_BYTES:
        return b""
    flag, length = grpc_framing.read_prefix(data)
    end = grpc_framing.PREFIX_BYTES + length
    if not flag:
        return bytes(data[grpc_framing.PREFIX_BYTES : end])
    name = (encoding or "").encode("latin-1")
    if name not in grpc_framing.ENCODINGS:
        raise ValueError(f"response compressed with unsupported encoding {encoding!r}")
    return grpc_framing.inflate([bytes(data[:end])], name, MAX_RESPONSE_BYTES)


def _outcome(signal: Signal, call: Call, items: int) -> ExportResult:
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
    except (ValueError, grpc_framing.InflateError) as err:
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
        self._headers: dict[Signal, list[tuple[str, str]]] = {
            signal: [
                (":method", "POST"),
                (":scheme", "https" if self._tls else "http"),
                (":path", method),
                (":authority", self.target),
                ("te", "trailers"),
                ("content-type", "application/grpc"),
                ("user-agent", "gym-sidecar-grpc-h2"),
                ("grpc-timeout", grpc_framing.format_timeout(config.timeout_s)),
                ("grpc-accept-encoding", "identity,gzip"),
                *([("grpc-encoding", "gzip")] if self._gzip else []),
                *((k.lower(), v) for k, v in config.headers.items()),
            ]
            for signal, method in ((s, spec.grpc_method) for s, spec in SPECS.items())
        }
        self._conn: ClientConnection | None = None
        self._connect_lock = asyncio.Lock()
        self._closed = False
        self._closing: set[asyncio.Future[None]] = set()
        quiet_frame_reprs()
        if self._gzip:
            logger.info(
                "OTLP/gRPC export: gzip with %s at level %d",
                deflate.deflate_library(self._level),
                self._level,
            )

    async def _connection(self) -> ClientConnection:
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
                    conn = await ClientConnection.open(
                        self._host, self._port, self._tls, self.target
                    )
                except (OSError, ssl.SSLError) as err:
                    raise CallFailed(
                        StatusCode.UNAVAILABLE, f"cannot connect to {self.target}: {err}"
                    ) from None
                self._conn = conn
            return conn

    def _retire(self, conn: ClientConnection) -> None:
        task = asyncio.ensure_future(conn.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _call(self, signal: Signal, parts: Sequence[Piece], items: int) -> ExportResult:
        body: Iterable[Piece]
        if self._gzip:
            size = body_size(parts)
            if size < _INLINE_GZIP_BYTES:
                compressed = gzip_parts(parts, self._level)
            else:
                compressed = await asyncio.to_thread(gzip_parts, parts, self._level)
            size, body = len(compressed), (compressed,)
        else:  # the batch's pieces in chunks: never joined whole (.body)
            size, body = body_size(parts), coalesced(parts)
        prefix = grpc_framing.prefix(self._gzip, size)
        conn = await self._connection()
        stream_id, call = conn.start(self._headers[signal])
        try:
            # The prefix goes as its own 5-byte DATA frame so that the body is never
            # concatenated to it (a copy of the whole batch).
            await conn.send_body(stream_id, call, itertools.chain((prefix,), body))
            await call.done
        except BaseException:
            conn.cancel(stream_id)
            raise
        conn.forget(stream_id)
        if call.error is not None:
            raise call.error
        return _outcome(signal, call, items)

    async def export(self, signal: Signal, payload: bytes, items: int) -> ExportResult:
        return await self.export_parts(signal, (payload,), items)

    async def export_parts(
        self, signal: Signal, parts: Sequence[Piece], items: int
    ) -> ExportResult:
        if self._closed:
            return ExportResult.retryable("exporter closed")
        try:
            return await asyncio.wait_for(self._call(signal, parts, items), self._timeout_s)
        except TimeoutError:
            return classify(
                StatusCode.DEADLINE_EXCEEDED, f"no answer within {self._timeout_s}s", None
            )
        except CallFailed as err:
            return classify(err.code, err.message, None)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
