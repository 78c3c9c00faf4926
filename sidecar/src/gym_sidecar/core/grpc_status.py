"""gRPC status codes and the ``RetryInfo`` hint as they travel in trailers, without grpcio.

The receiver and the gRPC exporters speak gRPC's wire format over ``h2`` themselves
(receiver/grpc_h2.py, export/grpc_h2.py), so the sidecar never imports grpc core in its
default configuration (~13 MiB resident: docs/benchmarks.md, sidecar RSS). What they
share with each other and with the grpcio exporter lives here:

- :class:`StatusCode`: the 17 codes of the gRPC spec, named as grpcio names them;
- :func:`status_trailers`: the trailers of a failed call, ``grpc-status``,
  ``grpc-message`` (percent-encoded as the spec asks), and for RESOURCE_EXHAUSTED with a
  retry hint the ``google.rpc.RetryInfo`` twice: as a detail of the
  ``grpc-status-details-bin`` status (the richer-error model the Go and Java SDKs and the
  Collector read) and as a bare ``google.rpc.retryinfo-bin`` trailer (the only place the
  OpenTelemetry Python SDK's exporter reads it);
- :func:`retry_delay_s`: the inverse, reading that hint from a failed call's trailers.
"""

from __future__ import annotations

import base64
import enum
from collections.abc import Iterable

from google.protobuf import duration_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]


class StatusCode(enum.IntEnum):
    """gRPC status codes (https://grpc.github.io/grpc/core/md_doc_statuscodes.html)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16

    @classmethod
    def parse(cls, value: str | int | None) -> StatusCode:
        """The code a ``grpc-status`` value names; UNKNOWN for anything else."""
        try:
            return cls(int(value))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return cls.UNKNOWN


STATUS_DETAILS_TRAILER = "grpc-status-details-bin"
RETRY_INFO_TRAILER = "google.rpc.retryinfo-bin"
"""The bare RetryInfo trailer: the only place the OTel Python gRPC exporter reads a delay."""

_UNRESERVED = frozenset(range(0x20, 0x7F)) - {ord("%")}


def percent_encode(message: str) -> str:
    """``grpc-message`` encoding: UTF-8, with bytes outside 0x20-0x7E and ``%`` as %XX."""
    return "".join(
        chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in message.encode("utf-8", "replace")
    )


def retry_info(retry_after_s: float) -> bytes:
    """A serialized ``google.rpc.RetryInfo`` with that delay."""
    seconds = int(retry_after_s)
    delay = duration_pb2.Duration(seconds=seconds, nanos=int((retry_after_s - seconds) * 1e9))
    return error_details_pb2.RetryInfo(retry_delay=delay).SerializeToString()  # type: ignore[no-any-return]


def status_trailers(
    code: StatusCode, message: str, retry_after_s: float | None = None
) -> list[tuple[str, str]]:
    """The trailers of a call ending with ``code`` (module doc); ``-bin`` values base64."""
    out = [("grpc-status", str(int(code)))]
    if message:
        out.append(("grpc-message", percent_encode(message)))
    if retry_after_s is not None:
        info = retry_info(retry_after_s)
        status = status_pb2.Status(code=int(code), message=message)
        status.details.add(type_url="type.googleapis.com/google.rpc.RetryInfo", value=info)
        out.append((STATUS_DETAILS_TRAILER, _b64(status.SerializeToString())))
        out.append((RETRY_INFO_TRAILER, _b64(info)))
    return out


def _b64(data: bytes) -> str:
    # gRPC allows -bin values with or without padding; grpc core sends them unpadded.
    return base64.b64encode(data).decode("ascii").rstrip("=")


def decode_bin(value: str | bytes) -> bytes | None:
    """A ``-bin`` metadata value as sent (base64, padded or not); None when it is not."""
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        return None


def _seconds(info: error_details_pb2.RetryInfo) -> float:
    delay_s: float = info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    return max(0.0, delay_s)


def retry_delay_s(trailing_metadata: Iterable[tuple[str, bytes | str]] | None) -> float | None:
    """The RetryInfo delay a failed call's trailers carry, if any.

    ``trailing_metadata``: (key, value) pairs whose ``-bin`` values are already decoded
    to bytes (as grpcio hands them over). Read from the standard status details
    (``grpc-status-details-bin``) and, as a fallback, from a bare
    ``google.rpc.retryinfo-bin`` trailer. Unparsable details count as no hint.
    """
    for key, value in trailing_metadata or ():
        if not isinstance(value, bytes):
            continue
        try:
            if key == RETRY_INFO_TRAILER:
                return _seconds(error_details_pb2.RetryInfo.FromString(value))
            if key != STATUS_DETAILS_TRAILER:
                continue
            status = status_pb2.Status.FromString(value)
        except DecodeError:
            return None
        for detail in status.details:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                detail.Unpack(info)
                return _seconds(info)
    return None
