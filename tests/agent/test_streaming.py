"""``gym_telemetry.streaming``: a model span ends with its SSE body and reads Gym's
failure events (the real Gym server is exercised in tests/gym/test_gym_coverage.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from gym_telemetry import streaming
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from starlette.responses import StreamingResponse

RESPONSES_FAILED = (
    'event: response.failed\ndata: {"type": "response.failed", "response": '
    '{"status": "failed", "error": {"code": "server_error", "message": "boom"}}}\n\n'
)
CHAT_ERROR = 'event: error\ndata: {"error": {"message": "HTTP 500", "code": 500}}\n\n'


@pytest.mark.parametrize(
    ("chunk", "expected"),
    [
        (RESPONSES_FAILED, ("response.failed", "server_error")),
        (CHAT_ERROR.encode(), ("error", "500")),
        ("event: error\ndata: not json\n\n", ("error", "_OTHER")),
        ('event: response.output_text.delta\ndata: {"delta": "error"}\n\n', None),
        (b": keep-alive\n\n", None),
    ],
)
def test_failure_in_event(chunk: str | bytes, expected: tuple[str, str] | None) -> None:
    assert streaming.failure_in_event(chunk) == expected


def _span() -> tuple[InMemorySpanExporter, object]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider.get_tracer("t").start_span("gym.model.chat_completions")


async def _drain(response: StreamingResponse, stop_after: int | None = None) -> list[object]:
    got = []
    iterator = response.body_iterator
    async for chunk in iterator:
        got.append(chunk)
        if stop_after is not None and len(got) >= stop_after:
            await iterator.aclose()  # type: ignore[attr-defined]
            break
    return got


async def _events(*chunks: str | bytes) -> AsyncIterator[str | bytes]:
    for chunk in chunks:
        await asyncio.sleep(0)
        yield chunk


def test_span_ends_with_the_stream_and_reads_the_failure() -> None:
    exporter, span = _span()
    response = StreamingResponse(_events(b": keep-alive\n\n", CHAT_ERROR))
    assert streaming.watch(response, span)  # type: ignore[arg-type]
    assert exporter.get_finished_spans() == ()  # not ended when the handler returns
    assert len(asyncio.run(_drain(response))) == 2
    [done] = exporter.get_finished_spans()
    assert done.status.status_code is StatusCode.ERROR
    assert done.attributes is not None
    assert done.attributes["error.type"] == "500"
    assert done.attributes[streaming.STREAM_EVENTS] == 1


def test_a_stream_cut_short_is_a_disconnect() -> None:
    exporter, span = _span()
    response = StreamingResponse(_events("data: 1\n\n", "data: 2\n\n", "data: [DONE]\n\n"))
    streaming.watch(response, span)  # type: ignore[arg-type]
    asyncio.run(_drain(response, stop_after=1))
    [done] = exporter.get_finished_spans()
    assert done.status.status_code is StatusCode.ERROR
    assert done.attributes is not None
    assert done.attributes["error.type"] == streaming.CLIENT_DISCONNECTED
    assert done.attributes[streaming.STREAM_DISCONNECTED] is True


def test_a_complete_stream_is_unset() -> None:
    exporter, span = _span()
    response = StreamingResponse(iter(["data: 1\n\n", "data: [DONE]\n\n"]))
    streaming.watch(response, span)  # type: ignore[arg-type]
    asyncio.run(_drain(response))
    [done] = exporter.get_finished_spans()
    assert done.status.status_code is StatusCode.UNSET
