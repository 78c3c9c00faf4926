"""The export stage end to end in-process: QueueStage -> Sender -> OTLP/gRPC -> RecordingSink.

Every test that uses the ``sink`` fixture runs once per gRPC client
(``backend.grpc_client``: the sidecar's own h2 framing, and grpc.aio)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import grpc
import pytest
from gym_sidecar.assemble import build_export_stage
from gym_sidecar.core.exporter import Outcome
from gym_sidecar.core.stage import Backpressure, Signal
from gym_sidecar.export.config import BackendConfig, QueueConfig
from gym_sidecar.export.otlp_grpc import OtlpGrpcExporter, classify, grpc_target
from gym_sidecar.export.stage import QueueStage
from gym_sidecar.selfmetrics import SelfMetrics

from testkit.sink import RecordingSink
from tests.sidecar.export.helpers import (
    dropped,
    exported,
    run,
    sample,
    trace_batch,
    wait_until,
)

FAST = {"retry_initial_interval_s": 0.01, "retry_max_interval_s": 0.05, "batch_timeout_s": 0.0}


_CLIENTS: dict[str, str] = {}
"""The gRPC client each sink fixture's test runs with (by sink endpoint)."""


@pytest.fixture(params=["h2", "grpcio"])
def sink(request: pytest.FixtureRequest) -> Iterator[RecordingSink]:
    with RecordingSink() as s:
        _CLIENTS[s.endpoint] = request.param
        yield s


def make_stage(
    sink: RecordingSink, metrics: SelfMetrics, compression: str = "none", **queue: object
) -> QueueStage:
    backend = BackendConfig(
        url=f"http://{sink.endpoint}",
        compression=compression,  # type: ignore[arg-type]
        grpc_client=_CLIENTS.get(sink.endpoint, "auto"),  # type: ignore[arg-type]
    )
    stage = build_export_stage(backend, QueueConfig(**{**FAST, **queue}), metrics)  # type: ignore[arg-type]
    assert isinstance(stage, QueueStage)
    return stage


def seen(sink: RecordingSink, metrics: SelfMetrics) -> Callable[[], str]:
    """What a classification test was waiting on, for its timeout message."""

    def describe() -> str:
        return (
            f"spans={sink.span_count} calls={sink.calls} rejected={sink.rejected_calls} "
            f"exported={exported(metrics)} dropped_permanent={dropped(metrics, 'permanent_error')} "
            "retryable_errors="
            + str(
                sample(
                    metrics, "gym_sidecar_export_errors_total", signal="traces", kind="retryable"
                )
            )
        )

    return describe


def test_unavailable_is_retried_until_everything_arrives(sink: RecordingSink) -> None:
    async def body() -> None:
        metrics = SelfMetrics()
        stage = make_stage(sink, metrics, max_in_flight=1)
        sink.fail_next(3, grpc.StatusCode.UNAVAILABLE)
        await stage.consume(trace_batch("r", 4))
        await stage.start()
        assert await wait_until(lambda: sink.span_count == 4, describe=seen(sink, metrics))
        await stage.shutdown(5)
        assert (sink.calls, sink.rejected_calls) == (4, 3)
        assert sample(metrics, "gym_sidecar_export_attempts_total", signal="traces") == 4
        errors = sample(
            metrics, "gym_sidecar_export_errors_total", signal="traces", kind="retryable"
        )
        assert errors == 3
        assert exported(metrics) == 4
        assert {s.attributes["test.tag"] for s in sink.spans()} == {"r"}
        assert sample(metrics, "gym_sidecar_queue_bytes") == 0

    run(body())


def test_invalid_argument_is_dropped_counted_and_the_sender_carries_on(
    sink: RecordingSink,
) -> None:
    async def body() -> None:
        metrics = SelfMetrics()
        stage = make_stage(sink, metrics, max_in_flight=1)
        sink.fail_next(1, grpc.StatusCode.INVALID_ARGUMENT)
        await stage.start()
        await stage.consume(trace_batch("bad", 2))
        assert await wait_until(lambda: sink.calls == 1, describe=seen(sink, metrics))
        await stage.consume(trace_batch("good", 3))
        assert await wait_until(lambda: sink.span_count == 3, describe=seen(sink, metrics))
        await stage.shutdown(5)
        assert sink.calls == 2  # the permanent error was not retried
        assert dropped(metrics, "permanent_error") == 2
        assert exported(metrics) == 3
        assert {s.attributes["test.tag"] for s in sink.spans()} == {"good"}

    run(body())


def test_retry_info_delay_is_honoured_over_a_long_backoff(sink: RecordingSink) -> None:
    # The backoff would wait ~60 s; the server's RetryInfo says 50 ms. Delivery within
    # the wait below is only possible if the hint replaces the backoff.
    async def body() -> None:
        metrics = SelfMetrics()
        stage = make_stage(
            sink,
            metrics,
            retry_initial_interval_s=60.0,
            retry_max_interval_s=60.0,
            retry_jitter=0.0,
        )
        sink.fail_next(1, grpc.StatusCode.UNAVAILABLE, retry_after_s=0.05)
        sink.fail_next(1, grpc.StatusCode.RESOURCE_EXHAUSTED, retry_after_s=0.05)
        await stage.consume(trace_batch("hint", 2))
        await stage.start()
        assert await wait_until(
            lambda: sink.span_count == 2, timeout_s=20, describe=seen(sink, metrics)
        )
        await stage.shutdown(5)
        assert (sink.calls, sink.rejected_calls) == (3, 2)

    run(body())


def test_resource_exhausted_without_retry_info_is_permanent(sink: RecordingSink) -> None:
    async def body() -> None:
        metrics = SelfMetrics()
        stage = make_stage(sink, metrics)
        sink.fail_next(1, grpc.StatusCode.RESOURCE_EXHAUSTED)
        await stage.consume(trace_batch("x", 5))
        await stage.start()
        assert await wait_until(
            lambda: dropped(metrics, "permanent_error") == 5, describe=seen(sink, metrics)
        )
        await stage.shutdown(5)
        assert sink.calls == 1

    run(body())


def test_queue_full_raises_backpressure_and_counts_refused(sink: RecordingSink) -> None:
    async def body() -> None:
        metrics = SelfMetrics()
        one = len(trace_batch("q", 3).message.SerializeToString())
        stage = make_stage(
            sink,
            metrics,
            max_bytes=one * 3 + 1,
            batch_max_bytes=one,
            backpressure_retry_after_s=2.5,
        )
        # Sender not started: nothing leaves the queue.
        for _ in range(3):
            await stage.consume(trace_batch("q", 3))
        with pytest.raises(Backpressure) as info:
            await stage.consume(trace_batch("q", 3))
        assert info.value.retry_after_s == 2.5 and info.value.reason == "queue_full"
        assert sample(metrics, "gym_sidecar_limit_hits_total", limit="export_queue.queue_full") == 1
        refused = sample(
            metrics,
            "gym_sidecar_stage_items_total",
            stage="queue",
            signal="traces",
            outcome="refused",
        )
        assert refused == 3
        assert sample(metrics, "gym_sidecar_queue_bytes") == one * 3
        assert sample(metrics, "gym_sidecar_queue_capacity_bytes") == one * 3 + 1
        await stage.start()
        await stage.shutdown(10)  # drains what was accepted
        assert sink.span_count == 9

    run(body())


def test_queued_requests_are_batched_into_one_valid_request(sink: RecordingSink) -> None:
    async def body() -> None:
        metrics = SelfMetrics()
        stage = make_stage(sink, metrics, max_in_flight=1, batch_timeout_s=0.2)
        for i in range(5):
            await stage.consume(trace_batch(f"b{i}", 2))
        await stage.start()
        assert await wait_until(lambda: sink.span_count == 10)
        await stage.shutdown(5)
        assert sink.calls == 1
        (request,) = sink.requests["traces"]
        assert [rs.resource.attributes[0].value.string_value for rs in request.resource_spans] == [
            f"svc-b{i}" for i in range(5)
        ]

    run(body())


def test_batches_are_cut_at_batch_max_bytes(sink: RecordingSink) -> None:
    async def body() -> None:
        metrics = SelfMetrics()
        one = len(trace_batch("c0", 2).message.SerializeToString())
        stage = make_stage(sink, metrics, max_in_flight=1, batch_max_bytes=2 * one)
        for i in range(5):
            await stage.consume(trace_batch(f"c{i}", 2))
        await stage.start()
        assert await wait_until(lambda: sink.span_count == 10)
        await stage.shutdown(5)
        assert [len(r.resource_spans) for r in sink.requests["traces"]] == [2, 2, 1]

    run(body())


def test_shutdown_drains_everything_queued(sink: RecordingSink) -> None:
    async def body() -> None:
        metrics = SelfMetrics()
        sink.delay_s = 0.02
        one = len(trace_batch("d0", 5).message.SerializeToString())
        stage = make_stage(sink, metrics, batch_max_bytes=one * 3, compression="gzip")
        await stage.start()
        for i in range(40):
            await stage.consume(trace_batch(f"d{i}", 5))
        await stage.shutdown(20)
        assert sink.span_count == 200
        assert exported(metrics) == 200
        assert dropped(metrics, "shutdown") == 0
        with pytest.raises(Backpressure):
            await stage.consume(trace_batch("late", 1))

    run(body())


def test_shutdown_deadline_counts_and_logs_what_could_not_be_sent(
    sink: RecordingSink, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        metrics = SelfMetrics()
        stage = make_stage(sink, metrics)
        sink.fail_next(10_000, grpc.StatusCode.UNAVAILABLE)
        await stage.start()
        for i in range(3):
            await stage.consume(trace_batch(f"s{i}", 4))
        await stage.shutdown(0.3)
        assert dropped(metrics, "shutdown") == 12
        assert sink.span_count == 0

    with caplog.at_level(logging.WARNING, logger="gym_sidecar.export"):
        run(body())
    assert any("12 traces items" in r.getMessage() for r in caplog.records)


def test_no_backend_drops_counts_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        metrics = SelfMetrics()
        stage = build_export_stage(BackendConfig(), QueueConfig(), metrics)
        await stage.start()
        await stage.start()
        await stage.consume(trace_batch("n", 7))
        await stage.shutdown(1)
        assert dropped(metrics, "no_backend") == 7

    with caplog.at_level(logging.WARNING, logger="gym_sidecar.export"):
        run(body())
    assert sum("no backend configured" in r.getMessage() for r in caplog.records) == 1


def test_connection_refused_is_retryable() -> None:
    async def body() -> None:
        from tests.support.ports import free_port

        exporter = OtlpGrpcExporter(
            BackendConfig(url=f"http://127.0.0.1:{free_port()}", timeout_s=2)
        )
        payload = trace_batch("x", 1).message.SerializeToString()
        result = await exporter.export(Signal.TRACES, payload, 1)
        await exporter.close()
        assert result.outcome is Outcome.RETRYABLE

    run(body())


def test_status_mapping_and_targets() -> None:
    retryable = ["UNAVAILABLE", "ABORTED", "CANCELLED", "DEADLINE_EXCEEDED", "OUT_OF_RANGE"]
    for name in [*retryable, "DATA_LOSS"]:
        assert classify(grpc.StatusCode[name], "", None).outcome is Outcome.RETRYABLE
    for name in ["INVALID_ARGUMENT", "PERMISSION_DENIED", "UNIMPLEMENTED", "INTERNAL"]:
        assert classify(grpc.StatusCode[name], "", None).outcome is Outcome.PERMANENT
    assert classify(grpc.StatusCode.RESOURCE_EXHAUSTED, "", 1.0).retry_after_s == 1.0
    assert grpc_target("http://collector:4317/ignored") == ("collector:4317", False)
    assert grpc_target("https://[::1]") == ("[::1]:443", True)
