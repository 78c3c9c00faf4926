"""Export side: the processor switch and export tracking."""

from __future__ import annotations

from collections.abc import Sequence

from gym_telemetry._export.processor import GymSpanProcessor, TrackingExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class Flaky(SpanExporter):
    def __init__(self) -> None:
        self.result = SpanExportResult.SUCCESS
        self.calls = 0
        self.names: list[str] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        self.names.extend(s.name for s in spans)
        if self.result is SpanExportResult.FAILURE:
            raise ConnectionError("sidecar down")
        return self.result

    def shutdown(self) -> None:
        return None


def test_tracking_exporter_counts_and_never_raises() -> None:
    inner = Flaky()
    tracking = TrackingExporter(inner)
    assert tracking.export([]) is SpanExportResult.SUCCESS
    assert not tracking.unreachable()
    inner.result = SpanExportResult.FAILURE
    assert tracking.export([]) is SpanExportResult.FAILURE
    assert tracking.unreachable()
    tracking.shutdown()
    tracking.shutdown()  # idempotent


def test_processor_switch_drops_oldest_and_counts_when_full() -> None:
    exporter = Flaky()
    batch = BatchSpanProcessor(
        exporter, max_queue_size=10, max_export_batch_size=10, schedule_delay_millis=60_000
    )
    switch = GymSpanProcessor()
    switch.plug(batch, TrackingExporter(exporter))
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(switch)
    tracer = provider.get_tracer("t")
    # The worker wakes at 10 queued spans and may take a batch meanwhile: which of the
    # early spans it exported is up to the thread, but the newest 10 were never dropped,
    # and every span is either exported or dropped and counted, none twice.
    for i in range(200):
        tracer.start_span(f"s{i}").end()
    assert batch.force_flush(30_000)
    exported = exporter.names
    assert len(set(exported)) == len(exported)
    assert {f"s{i}" for i in range(190, 200)} <= set(exported), exported
    assert switch.dropped == 200 - len(exported) > 0
    old, _ = switch.plug(None)
    assert old is batch
    tracer.start_span("after-unplug").end()  # no exporter behind the switch: dropped quietly
    batch.shutdown()
