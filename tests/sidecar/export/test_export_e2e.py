"""The export half through a real sidecar process: retries, permanent errors, backpressure.

Clients are real (the OpenTelemetry SDK's OTLP exporters, plain gRPC and HTTP); the
backends are real servers (RecordingSink over gRPC, a stdlib HTTP server over HTTP).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from testkit.otlp_samples import grpc_export, http_post
from testkit.sink import RecordingSink
from tests.sidecar.export.helpers import trace_request, wait_for
from tests.sidecar.export.http_backend import ScriptedHttpBackend
from tests.support.sidecar_proc import SidecarProcess

FAST_RETRY = {
    "retry_initial_interval_s": 0.05,
    "retry_max_interval_s": 0.2,
    "batch_timeout_s": 0.05,
}


def sdk_spans(tag: str, n: int) -> Sequence[ReadableSpan]:
    """``n`` finished SDK spans named ``{tag}-{i}`` (collected, not exported)."""
    collected: list[ReadableSpan] = []

    class Collect(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            collected.extend(spans)
            return SpanExportResult.SUCCESS

    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"svc-{tag}"}))
    provider.add_span_processor(SimpleSpanProcessor(Collect()))
    tracer = provider.get_tracer("tests.export")
    for i in range(n):
        with tracer.start_as_current_span(f"{tag}-{i}", attributes={"tag": tag, "index": i}):
            pass
    provider.shutdown()
    return collected


def names(sink: RecordingSink, prefix: str) -> set[str]:
    return {s.span.name for s in sink.spans() if s.span.name.startswith(prefix)}


def test_unavailable_then_accepting_backend_gets_everything() -> None:
    with RecordingSink() as sink:
        sink.fail_next(4, grpc.StatusCode.UNAVAILABLE)
        with SidecarProcess(backend=sink.endpoint, config={"queue": FAST_RETRY}) as sc:
            exporter = GrpcSpans(endpoint=sc.grpc_endpoint, insecure=True)
            assert exporter.export(sdk_spans("u", 20)) is SpanExportResult.SUCCESS
            assert sink.wait_for(lambda: len(names(sink, "u-")) == 20)
            errors = sc.metric("gym_sidecar_export_errors_total", kind="retryable")
            assert errors == 4
            # Counted when the backend's answer arrives, which may be just after the sink saw them.
            assert sink.wait_for(
                lambda: sc.metric("gym_sidecar_exported_items_total", signal="traces") == 20
            )
        assert sc.returncode == 0, sc.log_text()
        assert sink.rejected_calls == 4


def test_503_then_accepting_http_backend_gets_everything() -> None:
    with ScriptedHttpBackend() as backend:
        backend.fail_next(2, 503, retry_after="0")
        backend.fail_next(1, 429)
        with SidecarProcess(
            backend=backend.url,
            extra_args=["--backend-protocol", "http/protobuf", "--backend-compression", "gzip"],
            config={"queue": FAST_RETRY},
        ) as sc:
            grpc_export(sc.grpc_endpoint, "traces", trace_request("h", 10))
            assert wait_for(lambda: len(backend.span_names()) == 10)
            assert sc.metric("gym_sidecar_export_errors_total", kind="retryable") == 3
        assert sc.returncode == 0, sc.log_text()
        assert backend.statuses == [503, 503, 429, 200]


def test_invalid_argument_is_dropped_counted_and_the_sidecar_carries_on() -> None:
    with RecordingSink() as sink:
        sink.fail_next(1, grpc.StatusCode.INVALID_ARGUMENT)
        with SidecarProcess(backend=sink.endpoint, config={"queue": FAST_RETRY}) as sc:
            grpc_export(sc.grpc_endpoint, "traces", trace_request("bad", 3))
            assert sink.wait_for(
                lambda: (
                    sc.metric(
                        "gym_sidecar_dropped_items_total", signal="traces", reason="permanent_error"
                    )
                    == 3
                )
            )
            grpc_export(sc.grpc_endpoint, "traces", trace_request("good", 4))
            assert sink.wait_for(lambda: len(names(sink, "good-")) == 4)
            assert sc.metric("gym_sidecar_export_errors_total", kind="permanent") == 1
        assert sc.returncode == 0, sc.log_text()
        assert names(sink, "bad-") == set()
        assert sink.calls == 2  # dropped, not retried


def _retry_info_delay(err: grpc.RpcError) -> float | None:
    for key, value in err.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    return None


def test_full_queue_pushes_back_and_sdk_retries_then_succeed() -> None:
    queue: dict[str, Any] = {
        "max_bytes": 4096,
        "batch_max_bytes": 4096,
        "max_in_flight": 1,
        "retry_initial_interval_s": 0.25,
        "retry_max_interval_s": 0.25,
        "retry_jitter": 0.0,
        # The Python SDK exporters honour this hint and make at most 6 attempts, so their
        # patience is ~5 x the hint: 2 s gives ~10 s against the ~3 s outage below.
        "backpressure_retry_after_s": 2.0,
        "batch_timeout_s": 0.0,
    }
    with RecordingSink() as sink:
        # The backend fails for ~3 s (12 attempts x 0.25 s): the queue stays full meanwhile.
        sink.fail_next(12, grpc.StatusCode.UNAVAILABLE)
        with SidecarProcess(backend=sink.endpoint, config={"queue": queue}) as sc:
            accepted = 0
            code = None
            for i in range(50):
                try:
                    grpc_export(sc.grpc_endpoint, "traces", trace_request(f"fill{i}", 3))
                    accepted += 1
                except grpc.RpcError as err:
                    code = err.code()  # type: ignore[attr-defined]
                    assert _retry_info_delay(err) == 2.0
                    break
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert accepted > 0
            resp = http_post(sc.http_url, "traces", trace_request("h429", 3).SerializeToString())
            assert resp.status_code == 429
            assert float(resp.headers["Retry-After"]) == 2
            refused_before = sc.metric("gym_sidecar_refused_items_total", reason="queue_full")
            assert refused_before >= 6

            results: dict[str, SpanExportResult] = {}
            exporters = {
                "sg": GrpcSpans(endpoint=sc.grpc_endpoint, insecure=True, timeout=30),
                "sh": HttpSpans(endpoint=sc.http_url + "/v1/traces", timeout=30),
            }
            threads = [
                threading.Thread(
                    target=lambda t=tag, e=exp: results.__setitem__(t, e.export(sdk_spans(t, 5)))
                )
                for tag, exp in exporters.items()
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert results == {"sg": SpanExportResult.SUCCESS, "sh": SpanExportResult.SUCCESS}
            # The SDK clients were refused at least once before their retries got through.
            assert sc.metric("gym_sidecar_refused_items_total", reason="queue_full") > (
                refused_before
            )
            assert sink.wait_for(
                lambda: len(names(sink, "sg-")) == 5 and len(names(sink, "sh-")) == 5
            )
            assert sink.wait_for(lambda: len(names(sink, "fill")) == 3 * accepted)
            # The sink records a batch before it answers; the queue frees its bytes on the answer.
            assert sink.wait_for(lambda: sc.metric("gym_sidecar_queue_bytes") == 0)
        assert sc.returncode == 0, sc.log_text()


def test_no_backend_counts_drops_and_warns() -> None:
    # --no-local-store: without it the sidecar would write into its embedded store
    with SidecarProcess(backend=None, extra_args=["--no-local-store"]) as sc:
        grpc_export(sc.grpc_endpoint, "traces", trace_request("n", 6))
        assert sc.metric("gym_sidecar_dropped_items_total", reason="no_backend") == 6
    assert "no backend configured" in sc.log_text()


def test_sigterm_drains_the_queue_into_a_slow_backend() -> None:
    # A 10 s linger: the last partial batch can only leave through the shutdown drain.
    queue = {"batch_max_bytes": 4096, "max_in_flight": 1, "batch_timeout_s": 10.0}
    with RecordingSink() as sink:
        sink.delay_s = 0.05
        sc = SidecarProcess(backend=sink.endpoint, config={"queue": queue}).start()
        try:
            for i in range(30):
                grpc_export(sc.grpc_endpoint, "traces", trace_request(f"t{i}-", 10))
        finally:
            assert sc.stop() == 0, sc.log_text()
        assert len(names(sink, "t")) == 300
        assert "could not be sent" not in sc.log_text()


def test_shutdown_deadline_logs_the_count_that_could_not_be_sent() -> None:
    with RecordingSink() as sink:
        sink.fail_next(10_000, grpc.StatusCode.UNAVAILABLE)
        sc = SidecarProcess(
            backend=sink.endpoint, config={"queue": FAST_RETRY, "shutdown_timeout_s": 1.0}
        ).start()
        try:
            grpc_export(sc.grpc_endpoint, "traces", trace_request("lost", 7))
            assert wait_for(lambda: sink.rejected_calls >= 2)
        finally:
            assert sc.stop() == 0, sc.log_text()
        assert "7 traces items" in sc.log_text()
