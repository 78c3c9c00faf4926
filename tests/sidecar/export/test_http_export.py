"""The export stage over OTLP/HTTP against a real aiohttp server that scripts its answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from gym_sidecar.assemble import build_export_stage
from gym_sidecar.core.exporter import Outcome
from gym_sidecar.core.stage import Signal
from gym_sidecar.export.config import BackendConfig, QueueConfig
from gym_sidecar.export.otlp_http import classify_status, parse_retry_after, signal_urls
from gym_sidecar.export.stage import QueueStage
from gym_sidecar.selfmetrics import SelfMetrics
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.sidecar.export.helpers import dropped, exported, run, sample, trace_batch, wait_until
from tests.support.ports import free_port


@dataclass
class HttpBackend:
    """Answers POST /v1/<signal> from a script of (status, headers, body), then 200."""

    port: int
    script: list[tuple[int, dict[str, str], bytes]] = field(default_factory=list)
    received: list[tuple[str, dict[str, str], ExportTraceServiceRequest]] = field(
        default_factory=list
    )
    statuses: list[int] = field(default_factory=list)
    ok_body: bytes = b""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def span_count(self) -> int:
        return sum(
            len(ss.spans)
            for _, _, r in self.received
            for rs in r.resource_spans
            for ss in rs.scope_spans
        )

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()  # aiohttp inflates a Content-Encoding: gzip body
        status, headers, answer = self.script.pop(0) if self.script else (200, {}, self.ok_body)
        self.statuses.append(status)
        if status == 200:
            msg = ExportTraceServiceRequest.FromString(body)
            self.received.append((request.path, dict(request.headers), msg))
            return web.Response(
                status=200, body=answer, headers={"Content-Type": "application/x-protobuf"}
            )
        return web.Response(status=status, body=answer, headers=headers)


@asynccontextmanager
async def http_backend(prefix: str = "") -> AsyncIterator[HttpBackend]:
    backend = HttpBackend(free_port())
    app = web.Application()
    app.router.add_post(prefix + "/v1/{signal}", backend.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", backend.port)
    await site.start()
    try:
        yield backend
    finally:
        await runner.cleanup()


def make_stage(url: str, metrics: SelfMetrics, **backend: object) -> QueueStage:
    cfg = BackendConfig(url=url, protocol="http/protobuf", **backend)  # type: ignore[arg-type]
    queue = QueueConfig(
        retry_initial_interval_s=30.0,
        retry_max_interval_s=30.0,
        batch_timeout_s=0.0,
        max_in_flight=1,
    )
    stage = build_export_stage(cfg, queue, metrics)
    assert isinstance(stage, QueueStage)
    return stage


def test_503_502_and_429_with_retry_after_are_retried_then_everything_arrives() -> None:
    # Backoff is 30 s; only honouring Retry-After (0 s, and a date in the past) lets the
    # batch through within the wait.
    async def body() -> None:
        async with http_backend() as backend:
            backend.script = [
                (503, {"Retry-After": "0"}, b"busy"),
                (502, {"Retry-After": "0"}, b"bad gateway"),  # a proxy whose upstream fell over
                (429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, b"slow down"),
                (504, {"Retry-After": "0"}, b""),
            ]
            metrics = SelfMetrics()
            stage = make_stage(backend.url, metrics, compression="gzip", headers={"X-Tenant": "t1"})
            await stage.consume(trace_batch("h", 4))
            await stage.start()
            assert await wait_until(lambda: backend.span_count() == 4)
            await stage.shutdown(5)
        assert backend.statuses == [503, 502, 429, 504, 200]
        path, headers, _ = backend.received[0]
        assert path == "/v1/traces"
        assert headers["X-Tenant"] == "t1"
        assert headers["Content-Type"] == "application/x-protobuf"
        assert headers["Content-Encoding"] == "gzip"
        assert exported(metrics) == 4
        errors = sample(
            metrics, "gym_sidecar_export_errors_total", signal="traces", kind="retryable"
        )
        assert errors == 4

    run(body())


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (400, Outcome.PERMANENT),
        (401, Outcome.PERMANENT),
        (404, Outcome.PERMANENT),
        (413, Outcome.PERMANENT),
        (429, Outcome.RETRYABLE),
        (500, Outcome.PERMANENT),
        (501, Outcome.PERMANENT),
        (502, Outcome.RETRYABLE),
        (503, Outcome.RETRYABLE),
        (504, Outcome.RETRYABLE),
    ],
)
def test_each_status_is_classified_as_the_otlp_spec_says(status: int, outcome: Outcome) -> None:
    """OTLP/HTTP: 429, 502, 503, 504 are retryable; other non-2xx statuses are not."""
    result = classify_status(status, None, "upstream said no")
    assert result.outcome is outcome
    assert result.message == f"HTTP {status}: upstream said no"  # what the drop log quotes


def test_400_is_dropped_and_counted_and_the_sender_carries_on() -> None:
    async def body() -> None:
        async with http_backend() as backend:
            backend.script = [(400, {}, b"bad data")]
            metrics = SelfMetrics()
            stage = make_stage(backend.url, metrics)
            await stage.start()
            await stage.consume(trace_batch("bad", 2))
            assert await wait_until(lambda: len(backend.statuses) == 1)
            await stage.consume(trace_batch("good", 3))
            assert await wait_until(lambda: backend.span_count() == 3)
            await stage.shutdown(5)
        assert backend.statuses == [400, 200]
        assert dropped(metrics, "permanent_error") == 2
        assert exported(metrics) == 3

    run(body())


def test_partial_success_counts_rejected_items_as_dropped() -> None:
    async def body() -> None:
        async with http_backend(prefix="/otlp") as backend:
            response = ExportTraceServiceResponse()
            response.partial_success.rejected_spans = 2
            response.partial_success.error_message = "two spans too old"
            backend.ok_body = response.SerializeToString()
            metrics = SelfMetrics()
            # A URL ending in /v1/traces is the per-signal form: its base is kept.
            stage = make_stage(backend.url + "/otlp/v1/traces", metrics)
            await stage.consume(trace_batch("p", 5))
            await stage.start()
            assert await wait_until(lambda: backend.span_count() == 5)
            await stage.shutdown(5)
        assert backend.received[0][0] == "/otlp/v1/traces"
        assert exported(metrics) == 3
        assert dropped(metrics, "backend_rejected") == 2

    run(body())


def test_urls_and_retry_after_parsing() -> None:
    assert signal_urls("http://h:4318") == {
        Signal.TRACES: "http://h:4318/v1/traces",
        Signal.METRICS: "http://h:4318/v1/metrics",
        Signal.LOGS: "http://h:4318/v1/logs",
    }
    assert signal_urls("https://h/base/")[Signal.LOGS] == "https://h/base/v1/logs"
    assert signal_urls("http://h/x/v1/metrics")[Signal.TRACES] == "http://h/x/v1/traces"
    assert parse_retry_after("7") == 7.0
    # "retry now" and a date already past are 0 s, never a made-up minimum
    assert parse_retry_after("0") == 0.0
    assert parse_retry_after("0.25") == 0.25
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now=784111777 + 60) == 0.0
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now=784111777 - 5) == 5.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None
