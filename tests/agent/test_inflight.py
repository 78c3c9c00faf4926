"""issue 41: the registry of in-flight rollouts (``gym_telemetry.inflight``) and the
rollout wrapper's use of it: insert at start, delete at end, steps and turns from hops."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from gym_telemetry import inflight, span_groups
from gym_telemetry.endpoints import traced_rollout_endpoint
from gym_telemetry.rollout_correlation import ENCLOSING_ROLLOUT
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from tests.agent.conftest import Spans


def _span(trace_id: int, span_id: int) -> NonRecordingSpan:
    return NonRecordingSpan(SpanContext(trace_id, span_id, False, TraceFlags(1)))


@pytest.fixture(autouse=True)
def _empty_registry() -> Iterator[None]:
    inflight.IN_FLIGHT.clear()
    yield
    inflight.IN_FLIGHT.clear()


def test_begin_and_end() -> None:
    record = inflight.begin(_span(1, 2), "0-0", nested=False)
    assert inflight.for_trace(1) is record
    assert inflight.snapshot() == [record]
    assert inflight.in_flight() == 1
    inflight.end(record)
    assert inflight.for_trace(1) is None
    assert inflight.snapshot() == [] and inflight.IN_FLIGHT == {}


def test_hops_write_the_step_and_count_turns() -> None:
    record = inflight.begin(_span(1, 2), None, nested=False)
    assert (record.step, record.step_ns, record.turns) == (None, 0, 0)
    record.hop("POST /seed_session", "weather", model_call=False, relay=False)
    first_ns = record.step_ns
    assert first_ns > 0 and record.turns == 0 and record.target == "weather"
    record.hop("POST /v1/responses", "policy", model_call=True, relay=False)
    assert (record.step, record.target, record.turns) == ("POST /v1/responses", "policy", 1)
    assert record.step_ns >= first_ns
    assert not record.relayed
    record.hop("POST /run", "other_agent", model_call=False, relay=True)
    assert record.relayed and record.turns == 1


def test_a_rollout_of_the_same_trace_shadows_until_it_ends() -> None:
    outer = inflight.begin(_span(7, 1), "a", nested=False)
    inner = inflight.begin(_span(7, 2), "a", nested=True)
    other = inflight.begin(_span(8, 3), "b", nested=False)
    assert inflight.for_trace(7) is inner
    assert inflight.snapshot() == [outer, inner, other]
    inflight.end(inner)
    assert inflight.for_trace(7) is outer
    inflight.end(outer)
    inflight.end(other)
    assert inflight.IN_FLIGHT == {}


def test_a_shadowed_rollout_ending_first_is_skipped() -> None:
    outer = inflight.begin(_span(7, 1), None, nested=False)
    inner = inflight.begin(_span(7, 2), None, nested=True)
    inflight.end(outer)
    assert inflight.snapshot() == [inner]
    inflight.end(inner)
    assert inflight.IN_FLIGHT == {}


def test_the_rollout_wrapper_registers_while_it_runs(spans: Spans) -> None:
    span_groups.set_enabled({"rollout"})
    seen: list[object] = []

    async def run() -> dict[str, float]:
        record = ENCLOSING_ROLLOUT.get()
        assert isinstance(record, inflight.InFlight)
        seen.append(record)
        assert inflight.snapshot() == [record]
        record.hop("POST /v1/responses", "policy", model_call=True, relay=False)
        record.hop("POST /v1/responses", "policy", model_call=True, relay=False)
        return {"reward": 0.5}

    asyncio.run(traced_rollout_endpoint(run)())
    assert inflight.IN_FLIGHT == {} and ENCLOSING_ROLLOUT.get() is False
    span = spans.one("gym.rollout")
    assert span.attributes["nemo.gym.rollout.turns"] == 2  # type: ignore[index]
    assert span.attributes["nemo.gym.reward"] == 0.5  # type: ignore[index]
    record = seen[0]
    assert isinstance(record, inflight.InFlight)
    assert record.trace_id == span.context.trace_id  # type: ignore[union-attr]


def test_a_rollout_that_raised_keeps_its_turns(spans: Spans) -> None:
    span_groups.set_enabled({"rollout"})

    async def run() -> None:
        record = ENCLOSING_ROLLOUT.get()
        assert isinstance(record, inflight.InFlight)
        record.hop("POST /v1/responses", "policy", model_call=True, relay=False)
        raise RuntimeError("model down")

    with pytest.raises(RuntimeError):
        asyncio.run(traced_rollout_endpoint(run)())
    span = spans.one("gym.rollout")
    assert span.attributes["nemo.gym.rollout.turns"] == 1  # type: ignore[index]
    assert "nemo.gym.reward" not in (span.attributes or {})
    assert inflight.IN_FLIGHT == {}


def test_a_relaying_rollout_leaves_turns_and_tokens_to_the_one_it_reached(spans: Spans) -> None:
    span_groups.set_enabled({"rollout"})

    async def relay() -> dict[str, object]:
        record = ENCLOSING_ROLLOUT.get()
        assert isinstance(record, inflight.InFlight)
        record.hop("POST /run", "inner_agent", model_call=False, relay=True)
        return {"reward": 1.0, "response": {"usage": {"input_tokens": 1, "output_tokens": 1}}}

    asyncio.run(traced_rollout_endpoint(relay)())
    attributes = spans.one("gym.rollout").attributes or {}
    assert attributes["nemo.gym.reward"] == 1.0
    assert not any(
        key.startswith("nemo.gym.rollout.") for key in attributes if key != "nemo.gym.rollout.id"
    )


def test_no_rollout_group_no_registry(spans: Spans) -> None:
    span_groups.set_enabled(set())

    async def run() -> bool:
        return bool(ENCLOSING_ROLLOUT.get()) or bool(inflight.IN_FLIGHT)

    assert asyncio.run(traced_rollout_endpoint(run)()) is False
