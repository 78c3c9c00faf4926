"""One OTLP/gRPC ``Export`` call, HTTP/2 aside: what gRPC puts on top of a stream.

The server connection (:mod:`.grpc_server`) hands over a call's request headers and its
message bytes; this module says how to answer, and counts every refusal:

- :func:`check_headers`: the method (``:path``, ``:method``), ``content-type``, the
  metadata's size against ``limits.http_max_header_bytes``, ``grpc-encoding`` and
  ``grpc-timeout`` (:class:`CallHeaders`);
- :func:`check_prefix`: the 5-byte length prefix of the one request message (the
  compressed flag, the encoding, ``limits.grpc_transport_max_bytes`` and
  ``limits.grpc_max_message_bytes``), checked before the message is buffered;
- :func:`inflate`: a compressed message inflated from its chunks, stopping at
  ``limits.grpc_max_message_bytes``;
- :func:`too_large`: the refusal of a message over ``limits.grpc_max_message_bytes``.

What a whole message becomes (decoded, handed to the pipeline, answered) is the
receiver's (:func:`gym_sidecar.receiver.grpc.export`).

Pure functions of their arguments (plus the counters); no I/O.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from gym_sidecar.config import LimitsConfig
from gym_sidecar.core.grpc_status import StatusCode
from gym_sidecar.core.signals import SPECS, SignalSpec
from gym_sidecar.selfmetrics import SelfMetrics

TRANSPORT = "grpc"

ENCODINGS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
"""``grpc-encoding`` values the receiver inflates, and their zlib window bits."""
ACCEPT_ENCODING = b"identity,gzip,deflate"
"""The ``grpc-accept-encoding`` the receiver announces."""
CONTENT_TYPES = frozenset({b"application/grpc", b"application/grpc+proto"})
"""Content types served (the gRPC spec's, with the protobuf subtype or none)."""

_METHODS: dict[bytes, SignalSpec] = {spec.grpc_method.encode(): spec for spec in SPECS.values()}
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_SHOWN = 128
"""Characters of a client's header value quoted back in a refusal, at most."""


@dataclass(frozen=True, slots=True)
class Answer:
    """How a call ends: a status, and the response message when it is OK."""

    code: StatusCode
    message: str = ""
    response: bytes = b""
    retry_after_s: float | None = None
    """With RESOURCE_EXHAUSTED: the delay sent as ``google.rpc.RetryInfo``."""
    http_status: bytes = b"200"


OK_EMPTY = Answer(StatusCode.OK)
"""An OK answer with an empty response (what every fully accepted request gets)."""


def invalid(message: str) -> Answer:
    return Answer(StatusCode.INVALID_ARGUMENT, message)


@dataclass(frozen=True, slots=True)
class CallHeaders:
    """What a call's request headers say, once :func:`check_headers` accepted them."""

    spec: SignalSpec
    encoding: bytes | None
    """``grpc-encoding``, when sent."""
    timeout_s: float | None
    """``grpc-timeout`` in seconds, when sent and well-formed."""


def _shown(value: bytes | None) -> str:
    if value is None:
        return "none"
    text = value[:_SHOWN].decode("latin-1")
    return repr(text + ("..." if len(value) > _SHOWN else ""))


def parse_timeout(value: bytes) -> float | None:
    """``grpc-timeout`` (1-8 ASCII digits and a unit, H M S m u n) in seconds; None when
    it is not that (grpc core ignores such a value, and so does the receiver)."""
    digits, unit = value[:-1], value[-1:]
    if not 1 <= len(digits) <= 8 or not digits.isdigit() or unit not in _TIMEOUT_UNITS:
        return None
    return int(digits) * _TIMEOUT_UNITS[unit]


def check_headers(
    headers: list[tuple[bytes, bytes]], limits: LimitsConfig, metrics: SelfMetrics
) -> CallHeaders | Answer:
    """The call's headers read, or the answer refusing it (counted):

    - ``:path`` not one of the three ``Export`` methods: UNIMPLEMENTED;
      ``:method`` not POST: UNIMPLEMENTED;
    - ``content-type`` not in :data:`CONTENT_TYPES`: HTTP 415 with INVALID_ARGUMENT, as
      grpc-go answers (parameters after ``;`` are ignored);
    - metadata (every header but the pseudo-headers, name plus value bytes) over
      ``limits.http_max_header_bytes``: RESOURCE_EXHAUSTED without RetryInfo.
    """
    method = path = content_type = encoding = timeout = None
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
        elif name == b"grpc-timeout":
            timeout = value
    spec = _METHODS.get(path or b"")
    if spec is None:
        metrics.bad_requests.labels(TRANSPORT, "unimplemented").inc()
        return Answer(StatusCode.UNIMPLEMENTED, f"unknown method {_shown(path)}")
    if method != b"POST":
        metrics.bad_requests.labels(TRANSPORT, "method").inc()
        return Answer(
            StatusCode.UNIMPLEMENTED, f"gRPC calls are POST requests, not {_shown(method)}"
        )
    base = content_type.split(b";", 1)[0].strip().lower() if content_type is not None else None
    if base not in CONTENT_TYPES:
        metrics.bad_requests.labels(TRANSPORT, "content_type").inc()
        return Answer(
            StatusCode.INVALID_ARGUMENT,
            f"content-type {_shown(content_type)} is not application/grpc(+proto)",
            http_status=b"415",
        )
    if metadata > limits.http_max_header_bytes:
        metrics.limit_hits.labels("http_max_header_bytes").inc()
        metrics.bad_requests.labels(TRANSPORT, "metadata_too_large").inc()
        return Answer(
            StatusCode.RESOURCE_EXHAUSTED,
            f"request metadata of {metadata} bytes exceeds {limits.http_max_header_bytes} bytes",
        )
    timeout_s = parse_timeout(timeout) if timeout is not None else None
    return CallHeaders(spec, encoding, timeout_s)


def check_prefix(
    flag: int, length: int, encoding: bytes | None, limits: LimitsConfig, metrics: SelfMetrics
) -> Answer | None:
    """None when a message with this 5-byte prefix may be buffered; else the refusal
    (counted):

    - a flag other than 0 or 1: INTERNAL; the compressed flag without a
      ``grpc-encoding`` (or with ``identity``): INTERNAL (what grpc core answers);
      with an encoding not in :data:`ENCODINGS`: UNIMPLEMENTED (the spec's answer);
    - a length over ``limits.grpc_transport_max_bytes``: RESOURCE_EXHAUSTED;
    - an uncompressed length over ``limits.grpc_max_message_bytes``: INVALID_ARGUMENT.
    """
    if flag > 1:
        metrics.bad_requests.labels(TRANSPORT, "bad_flag").inc()
        return Answer(StatusCode.INTERNAL, f"invalid message flag {flag}")
    if flag and encoding not in ENCODINGS:
        metrics.bad_requests.labels(TRANSPORT, "encoding").inc()
        if encoding in (None, b"identity"):
            return Answer(StatusCode.INTERNAL, "compressed message without grpc-encoding")
        return Answer(
            StatusCode.UNIMPLEMENTED, f"grpc-encoding {_shown(encoding)} is not supported"
        )
    if length > limits.grpc_transport_max_bytes:
        metrics.limit_hits.labels("grpc_transport_max_bytes").inc()
        metrics.bad_requests.labels(TRANSPORT, "too_large").inc()
        return Answer(
            StatusCode.RESOURCE_EXHAUSTED,
            f"message of {length} bytes exceeds the transport limit of "
            f"{limits.grpc_transport_max_bytes} bytes",
        )
    if not flag and length > limits.grpc_max_message_bytes:
        return too_large(f"message of {length} bytes", limits, metrics)
    return None


def too_large(what: str, limits: LimitsConfig, metrics: SelfMetrics) -> Answer:
    metrics.limit_hits.labels("grpc_max_message_bytes").inc()
    metrics.bad_requests.labels(TRANSPORT, "too_large").inc()
    return invalid(f"{what} exceeds the limit of {limits.grpc_max_message_bytes} bytes")


def inflate(
    chunks: list[bytes], encoding: bytes, limits: LimitsConfig, metrics: SelfMetrics
) -> bytes | Answer:
    """The compressed message in ``chunks`` (its DATA as received, the first chunk
    starting with the 5-byte prefix) inflated, or the refusal (counted).

    Inflated chunk by chunk, each chunk let go (emptied in ``chunks``) once inflated, so
    the compressed message is never joined into one more copy. More than
    ``limits.grpc_max_message_bytes`` inflated is INVALID_ARGUMENT (inflation stops
    there, so a gzip bomb costs at most that much); broken or truncated data, or data
    after the end of the compressed stream, is INVALID_ARGUMENT.
    """
    name = encoding.decode("latin-1")
    room = limits.grpc_max_message_bytes + 1
    inflater = zlib.decompressobj(ENCODINGS[encoding])
    out: list[bytes] = []
    for index in range(len(chunks)):
        data = memoryview(chunks[index])[5:] if index == 0 else chunks[index]
        chunks[index] = b""
        try:
            piece = inflater.decompress(data, room)
        except zlib.error as exc:
            metrics.bad_requests.labels(TRANSPORT, "bad_gzip").inc()
            return invalid(f"message is not valid {name}: {exc}")
        room -= len(piece)
        if room <= 0:
            return too_large("message inflated", limits, metrics)
        if piece:
            out.append(piece)
    if not inflater.eof or inflater.unused_data:
        metrics.bad_requests.labels(TRANSPORT, "bad_gzip").inc()
        what = "truncated" if not inflater.eof else "followed by data past its end"
        return invalid(f"message is {what} ({name})")
    return out[0] if len(out) == 1 else b"".join(out)
