"""OTLP/HTTP receiver: a minimal raw ASGI app for ``/v1/traces|metrics|logs``.

Accepted: ``POST`` with ``Content-Type: application/x-protobuf`` or
``application/json`` (OTLP/JSON), ``Content-Encoding: gzip`` or none.

Answers (the body is encoded like the request; protobuf when that is unknown):
- 200 + Export*ServiceResponse (``partial_success`` when a stage rejected items);
- 400 + google.rpc.Status for an undecodable body (garbage, truncated, invalid JSON,
  broken gzip) and for one nested deeper than ``limits.max_message_depth``;
- 413 when the body exceeds ``limits.http_max_body_bytes`` as sent or
  ``limits.http_max_decompressed_bytes`` once inflated, or holds more than
  ``limits.max_request_messages`` messages (counted before decoding); inflation stops at
  the limit (``max_length``; ``wire.deflate`` inflates), so a gzip bomb costs at most
  that much memory;
- 415 for another content type or content encoding; 404/405 for other paths/methods;
- 408 when the body does not arrive within ``limits.http_body_timeout_s``;
- 429 + ``Retry-After`` on backpressure (the OTel SDK exporters retry on it), and when
  ``limits.http_max_concurrent_requests`` requests are already in flight (checked
  before the body is read).

Every limit that bites is counted in ``limit_hits{limit=...}`` and every refused request
in ``bad_requests{transport="http", reason=...}``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from google.protobuf.message import Message
from google.rpc import code_pb2, status_pb2  # type: ignore[import-untyped]

from gym_sidecar.config import LimitsConfig
from gym_sidecar.core.signals import JSON, PROTOBUF, SPECS, SignalSpec
from gym_sidecar.core.stage import Stage, pipeline_trace_scan
from gym_sidecar.receiver.request import BadRequest, build_response, decode_batch, submit
from gym_sidecar.selfmetrics import SelfMetrics
from gym_sidecar.wire import deflate
from gym_sidecar.wire.protobuf.bounds import TOO_MANY_MESSAGES

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

TRANSPORT = "http"

_BY_PATH: dict[str, SignalSpec] = {spec.http_path: spec for spec in SPECS.values()}


class _Refusal(Exception):
    """Answer the request with ``status`` and a google.rpc.Status saying ``message``."""

    def __init__(self, status: int, message: str, reason: str, limit: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.limit = limit


_RPC_CODE = {
    400: code_pb2.INVALID_ARGUMENT,
    404: code_pb2.NOT_FOUND,
    408: code_pb2.DEADLINE_EXCEEDED,
    405: code_pb2.UNIMPLEMENTED,
    413: code_pb2.INVALID_ARGUMENT,
    415: code_pb2.INVALID_ARGUMENT,
    429: code_pb2.RESOURCE_EXHAUSTED,
}


def _content_type(scope: Scope) -> str:
    """The request's media type, lower-cased, without parameters ("" when absent)."""
    for name, value in scope["headers"]:
        if name.lower() == b"content-type":
            return str(value.decode("latin-1").split(";", 1)[0].strip().lower())
    return ""


def _encode(message: Message, content_type: str) -> bytes:
    if content_type == JSON:
        from google.protobuf import json_format  # OTLP/JSON only (see decode_json)

        return json_format.MessageToJson(message, indent=None).encode()
    return message.SerializeToString()


class OtlpHttpApp:
    """The ASGI app. ``head`` is the first pipeline stage. Safe for concurrent requests."""

    def __init__(self, head: Stage, limits: LimitsConfig, metrics: SelfMetrics) -> None:
        self.head = head
        self.limits = limits
        self.metrics = metrics
        self.trace_scan = pipeline_trace_scan(head)
        self._in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if self._in_flight >= self.limits.http_max_concurrent_requests:
            self.metrics.limit_hits.labels("http_max_concurrent_requests").inc()
            status = status_pb2.Status(
                code=code_pb2.RESOURCE_EXHAUSTED,
                message="sidecar is handling too many requests at once; retry later",
            )
            reply_type = JSON if _content_type(scope) == JSON else PROTOBUF
            await _respond(
                send,
                429,
                _encode(status, reply_type),
                reply_type,
                [("retry-after", max(1, math.ceil(self.limits.overload_retry_after_s)))],
            )
            return
        self._in_flight += 1
        try:
            await self._handle(scope, receive, send)
        finally:
            self._in_flight -= 1

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        content_type = _content_type(scope)
        reply_type = JSON if content_type == JSON else PROTOBUF
        try:
            spec = _BY_PATH.get(scope["path"])
            if spec is None:
                raise _Refusal(404, f"no OTLP endpoint at {scope['path']}", "not_found")
            if scope["method"] != "POST":
                raise _Refusal(405, "OTLP/HTTP endpoints accept POST only", "method")
            if content_type not in (PROTOBUF, JSON):
                raise _Refusal(
                    415,
                    f"unsupported content type {content_type!r}; use {PROTOBUF} or {JSON}",
                    "content_type",
                )
            encoding = headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("gzip", "identity", ""):
                raise _Refusal(
                    415, f"unsupported content encoding {encoding!r}; use gzip", "encoding"
                )
            try:
                body = await asyncio.wait_for(
                    self._read_body(headers, receive), self.limits.http_body_timeout_s
                )
            except TimeoutError:
                raise _Refusal(
                    408,
                    f"body not received within {self.limits.http_body_timeout_s}s",
                    "timeout",
                    "http_body_timeout_s",
                ) from None
            if encoding == "gzip":
                body = self._gunzip(body)
            client = scope.get("client")
            try:
                batch = decode_batch(
                    spec,
                    body,
                    json=content_type == JSON,
                    max_depth=self.limits.max_message_depth,
                    max_messages=self.limits.max_request_messages,
                    scan=self.trace_scan,
                    peer=f"{client[0]}:{client[1]}" if client else None,
                )
            except BadRequest as exc:
                status = 413 if exc.reason == TOO_MANY_MESSAGES else 400
                raise _Refusal(status, str(exc), exc.reason, exc.limit) from None
        except _Refusal as refusal:
            await self._refuse(send, refusal, reply_type)
            return

        backpressure = await submit(self.head, batch, TRANSPORT, self.metrics)
        if backpressure is not None:
            retry_after = max(1, math.ceil(backpressure.retry_after_s))
            status = status_pb2.Status(
                code=code_pb2.RESOURCE_EXHAUSTED,
                message=f"sidecar pipeline is full ({backpressure.reason}); retry later",
            )
            await _respond(
                send, 429, _encode(status, reply_type), reply_type, [("retry-after", retry_after)]
            )
            return
        await _respond(send, 200, _encode(build_response(spec, batch), reply_type), reply_type)

    async def _read_body(self, headers: dict[str, str], receive: Receive) -> bytes:
        limit = self.limits.http_max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _Refusal(
                413,
                f"body of {declared} bytes exceeds the limit of {limit} bytes",
                "too_large",
                "http_max_body_bytes",
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            event = await receive()
            if event["type"] == "http.disconnect":
                raise _Refusal(400, "client disconnected before sending the body", "disconnect")
            chunk = event.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _Refusal(
                    413,
                    f"body exceeds the limit of {limit} bytes",
                    "too_large",
                    "http_max_body_bytes",
                )
            chunks.append(chunk)
            if not event.get("more_body", False):
                return b"".join(chunks)

    def _gunzip(self, data: bytes) -> bytes:
        """Inflate at most ``http_max_decompressed_bytes``; never more, whatever the input."""
        limit = self.limits.http_max_decompressed_bytes
        inflater = deflate.inflater(deflate.GZIP_WBITS)
        try:
            # max_length=limit+1 distinguishes "exactly at the limit" from "over it".
            out = inflater.decompress(data, limit + 1)
        except deflate.inflate_errors() as exc:
            raise _Refusal(400, f"body is not valid gzip: {exc}", "bad_gzip") from None
        if len(out) > limit or inflater.unconsumed_tail:
            raise _Refusal(
                413,
                f"body inflates beyond the limit of {limit} bytes",
                "too_large",
                "http_max_decompressed_bytes",
            )
        if not inflater.eof:
            raise _Refusal(400, "body is truncated gzip", "bad_gzip")
        return out

    async def _refuse(self, send: Send, refusal: _Refusal, reply_type: str) -> None:
        if refusal.limit is not None:
            self.metrics.limit_hits.labels(refusal.limit).inc()
        self.metrics.bad_requests.labels(TRANSPORT, refusal.reason).inc()
        logger.debug("refused OTLP/HTTP request (%s): %s", refusal.status, refusal)
        status = status_pb2.Status(code=_RPC_CODE[refusal.status], message=str(refusal))
        await _respond(send, refusal.status, _encode(status, reply_type), reply_type)


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: str,
    extra_headers: list[tuple[str, Any]] | None = None,
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    for name, value in extra_headers or []:
        headers.append((name.encode(), str(value).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
