"""The local store on Gym's own telemetry: its rollouts listed and counted like the
agent's, its failures read from the status; and the outermost rule applied from the
trace (``store/nesting.py``) where a producer marks no nested rollout."""

from __future__ import annotations

import asyncio
import os
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from gym_sidecar.core.exporter import Outcome
from gym_sidecar.core.stage import Signal
from gym_sidecar.store import db, nesting, queries, stats
from gym_sidecar.store.config import LocalStoreConfig
from gym_sidecar.store.exporter import LocalStoreExporter
from gym_sidecar.store.writer import StoreMetrics
from gym_telemetry_semconv import gym_dialect
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from testkit.otlp_samples import set_attrs
from testkit.rollout_requests import GYM_AGENT, GYM_RESOURCES, Rollout, gym_dialect_request

NOW = time.time_ns()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "store" / "traces.db"


def export(path: Path, *requests: ExportTraceServiceRequest) -> None:
    """Each request in its own write, in order (the writer's thread marks nesting after
    each)."""

    async def body() -> None:
        exporter = LocalStoreExporter(path, LocalStoreConfig(), StoreMetrics())
        for req in requests:
            result = await exporter.export(Signal.TRACES, req.SerializeToString(), 1)
            assert result.outcome is Outcome.SUCCESS, result
        await exporter.close()

    asyncio.run(body())


def test_gym_rollouts_are_listed_with_their_verify_outcome(path: Path) -> None:
    rollouts = [
        Rollout(f"{i}-0", NOW - 10**9 + i * 10**6, 800.0, verify_ok=i < 16) for i in range(20)
    ]
    export(path, gym_dialect_request(rollouts))
    with closing(db.connect(path, readonly=True)) as conn:
        rows = queries.rollouts(conn, limit=100)
        assert len(rows) == 20
        assert queries.store_counts(conn)["rollouts"] == 20
        failed = queries.rollouts(conn, failed_only=True, limit=100)
        assert len(failed) == 4
        assert all(r.error and r.verify == "failed" for r in failed)
        assert {r.verify for r in rows} == {"ok", "failed"}
        # no rollout id on Gym's spans (observability_enabled off): the trace names it
        assert all(r.rollout_id.startswith("(trace ") for r in rows)
        assert rows[0].services == tuple(
            sorted((GYM_AGENT, GYM_RESOURCES, "nemo-gym/policy_model"))
        )
        summary = stats.compute(conn, None)
        assert summary.rollout_spans.count == 20
        assert summary.verify_spans.count == 20
        # the waterfall has the exception event
        verify = next(
            s
            for s in queries.trace_spans(conn, failed[0].trace_id)
            if s.name == semconv.SPAN_VERIFY
        )
        assert verify.scope == gym_dialect.SCOPE_LENS_HELPERS
        [event] = verify.events
        assert event.attributes[gym_dialect.EXCEPTION_TYPE] == "__main__.VerifierCrash"
        # other Gym spans are not rows of their own
        names = {r["name"] for r in conn.execute("SELECT DISTINCT name FROM gym_spans")}
        assert names == {semconv.SPAN_ROLLOUT, semconv.SPAN_VERIFY}


def _span(ss: object, trace: bytes, parent: bytes, name: str, start: int, end: int) -> Span:
    span: Span = ss.spans.add()  # type: ignore[attr-defined]
    span.trace_id, span.span_id, span.parent_span_id = trace, os.urandom(8), parent
    span.name, span.start_time_unix_nano, span.end_time_unix_nano = name, start, end
    return span


def relayed(trace: bytes, start: int, inner_failed: bool) -> tuple[Any, Any]:
    """A mixed fleet's relayed rollout: a relay on the agent (its own ``gym.rollout``,
    unmarked as the outermost) in front of an agent on Gym's own telemetry (whose
    ``gym.rollout`` carries no nested marker). Two requests: the inner process's and the
    relay's (which ends, so exports, last)."""
    inner = ExportTraceServiceRequest()
    relay = ExportTraceServiceRequest()
    rs = relay.resource_spans.add()
    set_attrs(rs.resource.attributes, {semconv.SERVICE_NAME: "nemo-gym/relay"})
    server = rs.scope_spans.add()
    server.scope.name = semconv.scope_name(semconv.GROUP_SERVER)
    outer_scope = rs.scope_spans.add()
    outer_scope.scope.name = semconv.scope_name(semconv.GROUP_ROLLOUT)
    client = rs.scope_spans.add()
    client.scope.name = semconv.scope_name(semconv.GROUP_HTTP_CLIENT)
    run = _span(server, trace, b"", "POST /run", start, start + 10**9)
    outer = _span(outer_scope, trace, run.span_id, semconv.SPAN_ROLLOUT, start + 1, start + 10**9)
    set_attrs(outer.attributes, {semconv.ROLLOUT_ID: "7-0"})
    hop = _span(client, trace, outer.span_id, "POST /run", start + 2, start + 10**9 - 2)
    ags = inner.resource_spans.add()
    set_attrs(ags.resource.attributes, {semconv.SERVICE_NAME: GYM_AGENT})
    fastapi = ags.scope_spans.add()
    fastapi.scope.name = "opentelemetry.instrumentation.fastapi"
    lens = ags.scope_spans.add()
    lens.scope.name = gym_dialect.SCOPE_LENS_HELPERS
    route = _span(fastapi, trace, hop.span_id, "POST /run", start + 3, start + 10**9 - 3)
    agent_rollout = _span(
        lens, trace, route.span_id, semconv.SPAN_ROLLOUT, start + 4, start + 10**9 - 4
    )
    if inner_failed:
        agent_rollout.status.code = Status.STATUS_CODE_ERROR
    return inner, relay


def test_a_relayed_rollout_of_a_mixed_fleet_is_one_row(path: Path) -> None:
    """The inner ``gym.rollout`` has a ``gym.rollout`` ancestor in its trace (through
    the relay's CLIENT and its own SERVER span): nested, folded into the relay's row,
    whose outcome it still decides; the agent's own marker is not needed."""
    traces = [os.urandom(16) for _ in range(3)]
    writes = []
    for i, trace in enumerate(traces):
        writes += relayed(trace, NOW - 10**9 + i * 10**6, inner_failed=i == 1)
    export(path, *writes)
    with closing(db.connect(path, readonly=True)) as conn:
        rows = queries.rollouts(conn, limit=10)
        assert len(rows) == 3
        assert all("nemo-gym/relay" in r.services and GYM_AGENT in r.services for r in rows)
        assert [r.error for r in sorted(rows, key=lambda r: r.start_ns)] == [False, True, False]
        assert queries.store_counts(conn)["rollouts"] == 3
        assert stats.compute(conn, None).rollout_spans.count == 3
        marked = conn.execute(
            "SELECT count(*) FROM gym_spans WHERE json_extract(attributes, ?) IS 1",
            (f'$."{nesting.NESTED_KEY}"',),
        ).fetchone()[0]
        assert marked == 3


def test_sibling_rollouts_of_one_trace_are_each_a_rollout(path: Path) -> None:
    """Gym's ``default`` preset with ``job`` on: every rollout of a collection run hangs
    off one ``gym.job``. Two rollouts there are siblings, not nested."""
    trace = os.urandom(16)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    set_attrs(rs.resource.attributes, {semconv.SERVICE_NAME: GYM_AGENT})
    lens = rs.scope_spans.add()
    lens.scope.name = gym_dialect.SCOPE_LENS_HELPERS
    job = _span(lens, trace, b"", gym_dialect.SPAN_JOB, NOW - 10**9, NOW)
    for i in range(2):
        _span(lens, trace, job.span_id, semconv.SPAN_ROLLOUT, NOW - 10**9 + i, NOW - i)
    export(path, req)
    with closing(db.connect(path, readonly=True)) as conn:
        assert len(queries.rollouts(conn)) == 2


def test_nested_spans_follows_parents_and_stops_on_cycles() -> None:
    parents = {b"r1": b"", b"c": b"r1", b"s": b"c", b"r2": b"s", b"x": b"y", b"y": b"x"}
    assert nesting.nested_spans(parents, [b"r1", b"r2"]) == {b"r2"}
    assert nesting.nested_spans(parents, [b"x"]) == set()  # a forged cycle ends
    assert nesting.nested_spans(parents, [b"r2"]) == set()  # its ancestor is no rollout
