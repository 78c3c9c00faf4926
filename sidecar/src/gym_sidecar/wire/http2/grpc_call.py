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

from dataclasses import dataclass

from gym_sidecar.config import LimitsConfig
from gym_sidecar.core.grpc_status import StatusCode
from gym_sidecar.core.signals import SPECS, SignalSpec
from gym_sidecar.selfmetrics import SelfMetrics
from gym_sidecar.wire.http2 import grpc_framing
from gym_sidecar.wire.http2.grpc_framing import ENCODINGS, parse_timeout

TRANSPORT = "grpc"

ACCEPT_ENCODING = b"identity,gzip,deflate"
"""The ``grpc-accept-encoding`` the receiver announces."""
CONTENT_TYPES = frozenset({grpc_framing.CONTENT_TYPE, b"application/grpc+proto"})
"""Content types served (the gRPC spec's, with the protobuf subtype or none)."""

_METHODS: dict[bytes, SignalSpec] = {spec.grpc_method.encode(): spec for spec in SPECS.values()}
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
    chunks: list[bytes | memoryview], encoding: bytes, limits: LimitsConfig, metrics: SelfMetrics
) -> bytes | Answer:
    """The compressed message in ``chunks`` inflated (:func:`.grpc_framing.inflate`, up
    to ``limits.grpc_max_message_bytes``), or the refusal (counted): more is
    INVALID_ARGUMENT (``too_large``), broken or truncated data or data after the end of
    the compressed stream INVALID_ARGUMENT (``bad_gzip``)."""
    try:
        return grpc_framing.inflate(chunks, encoding, limits.grpc_max_message_bytes)
    except grpc_framing.InflateError as exc:
        if exc.reason == "too_large":
            return too_large(str(exc), limits, metrics)
        metrics.bad_requests.labels(TRANSPORT, exc.reason).inc()
        return invalid(str(exc))
