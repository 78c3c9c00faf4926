"""One OTLP/gRPC ``Export`` call, transport aside: request message in, gRPC answer out.

The transport (:mod:`.grpc_h2`) hands over the call's one message, inflated and checked
against the transport limits; :func:`export` decodes it with the functions the HTTP
receiver shares (:mod:`.otlp`), submits it to the pipeline and says how to answer:

- OK with the serialized Export*ServiceResponse (``partial_success`` when a stage
  rejected items);
- INVALID_ARGUMENT for a message over ``limits.grpc_max_message_bytes``, one that does not
  decode, nests deeper than ``limits.max_message_depth`` or holds more than
  ``limits.max_request_messages`` messages (counted in ``limit_hits`` and
  ``bad_requests``);
- RESOURCE_EXHAUSTED with a retry delay on backpressure (the items counted as refused).
"""

from __future__ import annotations

from dataclasses import dataclass

from gym_sidecar.config import LimitsConfig
from gym_sidecar.core.grpc_status import StatusCode
from gym_sidecar.core.otlp import SignalSpec
from gym_sidecar.core.stage import Stage
from gym_sidecar.core.traces import ScanSpec
from gym_sidecar.receiver.otlp import BadRequest, build_response, decode_batch, submit
from gym_sidecar.selfmetrics import SelfMetrics

TRANSPORT = "grpc"


@dataclass(frozen=True, slots=True)
class Answer:
    """How a call ends: a status, and the response message when it is OK."""

    code: StatusCode
    message: str = ""
    response: bytes = b""
    retry_after_s: float | None = None
    """With RESOURCE_EXHAUSTED: the delay sent as ``google.rpc.RetryInfo``."""


OK_EMPTY = Answer(StatusCode.OK)
"""An OK answer with an empty response (what every fully accepted request gets)."""


def invalid(message: str) -> Answer:
    return Answer(StatusCode.INVALID_ARGUMENT, message)


async def export(
    spec: SignalSpec,
    request: bytes,
    *,
    peer: str | None,
    head: Stage,
    scan: ScanSpec,
    limits: LimitsConfig,
    metrics: SelfMetrics,
) -> Answer:
    """Decode ``request`` (traces into their wire view, reading what ``scan`` asks for),
    hand it to ``head`` and say how to answer (module doc)."""
    max_bytes = limits.grpc_max_message_bytes
    if len(request) > max_bytes:
        metrics.limit_hits.labels("grpc_max_message_bytes").inc()
        metrics.bad_requests.labels(TRANSPORT, "too_large").inc()
        return invalid(f"message of {len(request)} bytes exceeds the limit of {max_bytes} bytes")
    try:
        batch = decode_batch(
            spec,
            request,
            json=False,
            max_depth=limits.max_message_depth,
            max_messages=limits.max_request_messages,
            scan=scan,
            peer=peer,
        )
    except BadRequest as exc:
        if exc.limit is not None:
            metrics.limit_hits.labels(exc.limit).inc()
        metrics.bad_requests.labels(TRANSPORT, exc.reason).inc()
        return invalid(str(exc))
    backpressure = await submit(head, batch, TRANSPORT, metrics)
    if backpressure is not None:
        return Answer(
            StatusCode.RESOURCE_EXHAUSTED,
            f"sidecar {spec.signal.value} pipeline is full ({backpressure.reason})",
            retry_after_s=backpressure.retry_after_s,
        )
    if batch.rejected == 0:
        return OK_EMPTY
    return Answer(StatusCode.OK, response=build_response(spec, batch).SerializeToString())
