"""Shared helpers for the export tests: OTLP batches, metric reads, async waiting."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from gym_sidecar.core.stage import Batch, Signal
from gym_sidecar.selfmetrics import SelfMetrics
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from testkit.otlp_samples import trace_view
from testkit.wait import wait_for  # noqa: F401  (re-exported for the export tests)
from testkit.wait import wait_for_async as wait_until  # noqa: F401  (re-exported)


def trace_request(tag: str, spans: int = 3) -> ExportTraceServiceRequest:
    """One ResourceSpans with ``spans`` spans named ``{tag}-{i}``, each with attributes."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(
        KeyValue(key="service.name", value=AnyValue(string_value=f"svc-{tag}"))
    )
    ss = rs.scope_spans.add()
    ss.scope.name = "gym.test"
    for i in range(spans):
        sp = ss.spans.add()
        sp.name = f"{tag}-{i}"
        sp.trace_id = bytes([i + 1]) * 16
        sp.span_id = bytes([i + 1]) * 8
        sp.attributes.append(KeyValue(key="test.tag", value=AnyValue(string_value=tag)))
        sp.attributes.append(KeyValue(key="test.index", value=AnyValue(int_value=i)))
    return req


def trace_batch(tag: str, spans: int = 3) -> Batch:
    """A traces batch as the pipeline carries it (the request's wire view)."""
    return Batch(Signal.TRACES, trace_view(trace_request(tag, spans)), spans)


def sample(metrics: SelfMetrics, name: str, **labels: str) -> float:
    """Current value of a sample (0 when the labelled child does not exist yet)."""
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def dropped(metrics: SelfMetrics, reason: str, signal: str = "traces") -> float:
    return sample(metrics, "gym_sidecar_dropped_items_total", signal=signal, reason=reason)


def exported(metrics: SelfMetrics, signal: str = "traces") -> float:
    return sample(metrics, "gym_sidecar_exported_items_total", signal=signal)


def run(coro: Coroutine[Any, Any, None], timeout_s: float = 60.0) -> None:
    """Run an async test body on a fresh loop, with an overall timeout."""
    asyncio.run(asyncio.wait_for(coro, timeout_s))
