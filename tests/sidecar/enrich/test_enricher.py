"""In-process tests of the enricher: precedence, overwrite rules, the per-resource cache,
all three signals, and Docker lookups that fill the cache in the background."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gym_sidecar.core.stage import Batch, Signal
from gym_sidecar.core.traces import TraceRequest
from gym_sidecar.enrich.config import EnrichConfig
from gym_sidecar.enrich.enricher import Enricher, resource_blocks
from gym_sidecar.enrich.stage import build_enrich_stage
from gym_sidecar.selfmetrics import SelfMetrics
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from testkit.otlp_samples import parsed, trace_view
from testkit.sink import attrs
from testkit.wait import wait_for_async as wait_for
from tests.support.collect_stage import CollectStage
from tests.support.docker_engine import EngineContractServer, FakeContainer

CID = "c0ffee00" * 8


def traces(*resources: dict[str, str]) -> TraceRequest:
    """A trace request with one ResourceSpans per resource, as the receivers hand it on."""
    req = ExportTraceServiceRequest()
    for resource in resources:
        rs = req.resource_spans.add()
        for k, v in resource.items():
            kv = rs.resource.attributes.add()
            kv.key = k
            kv.value.string_value = v
        rs.scope_spans.add().spans.add(name="s")
    return trace_view(req)


def enricher(cfg: dict[str, Any], environ: dict[str, str] | None = None) -> Enricher:
    base: dict[str, Any] = {"host": False, "docker": {"enabled": False}}
    base.update(cfg)
    return Enricher.from_config(EnrichConfig.model_validate(base), SelfMetrics(), environ or {})


def resource_of(req: Any, index: int = 0) -> dict[str, Any]:
    if isinstance(req, TraceRequest):
        return attrs(parsed(req).resource_spans[index].resource.attributes)
    return attrs(resource_blocks(req)[index].resource.attributes)


def test_precedence_among_sources(tmp_path: Path) -> None:
    (tmp_path / "labels").write_text('app="from-k8s"\n')
    env = {
        "OTEL_RESOURCE_ATTRIBUTES": "k.all=env,k.env=env,nemo.gym.server.name=env-name",
        "K8S_POD_NAME": "pod-1",
        "GYM_SIDECAR_PODINFO_DIR": str(tmp_path),
    }
    e = enricher(
        {
            "attributes": {"k.all": "static", "k8s.pod.name": "static-pod"},
            "server_name": "cfg-name",
            "server_type": "model",
        },
        env,
    )
    req = traces({"service.name": "svc"})
    e.enrich(req, None)
    assert resource_of(req) == {
        "service.name": "svc",
        "k.all": "static",  # attributes > environment
        "k.env": "env",
        "nemo.gym.server.name": "env-name",  # environment > gym
        "nemo.gym.server.type": "model",
        "k8s.pod.name": "static-pod",  # attributes > kubernetes
        "k8s.pod.label.app": "from-k8s",
    }


def test_agent_keys_kept_by_default_and_overwrite_rules() -> None:
    agent = {"service.name": "agent-svc", "team": "agent", "nemo.gym.server.type": "agent"}
    cfg: dict[str, Any] = {
        "attributes": {"service.name": "cfg-svc", "team": "cfg", "extra": "x"},
        "server_type": "model",
    }
    req = traces(agent)
    enricher(cfg).enrich(req, None)
    assert resource_of(req) == {**agent, "extra": "x"}

    req = traces(agent)
    enricher({**cfg, "overwrite": {"keys": ["team"]}}).enrich(req, None)
    assert resource_of(req) == {**agent, "team": "cfg", "extra": "x"}

    req = traces(agent)
    enricher({**cfg, "overwrite": {"sources": ["gym"]}}).enrich(req, None)
    assert resource_of(req) == {**agent, "nemo.gym.server.type": "model", "extra": "x"}


def test_metrics_and_logs_resources_are_enriched() -> None:
    e = enricher({"attributes": {"deployment.environment.name": "ci"}})
    metrics = ExportMetricsServiceRequest()
    metrics.resource_metrics.add().scope_metrics.add()
    logs = ExportLogsServiceRequest()
    logs.resource_logs.add().scope_logs.add()
    logs.resource_logs.add()
    e.enrich(metrics, None)
    e.enrich(logs, None)
    assert resource_of(metrics) == {"deployment.environment.name": "ci"}
    assert resource_of(logs, 0) == resource_of(logs, 1) == {"deployment.environment.name": "ci"}


def test_computed_once_per_distinct_resource_with_bounded_lru() -> None:
    e = enricher({"attributes": {"a": "1"}, "cache_max_entries": 2})
    for _ in range(50):
        e.enrich(traces({"service.name": "x"}, {"service.name": "y"}), None)
    assert e.computed == 2
    for name in ("x", "y", "z") * 3:  # three resources through a cache of two
        e.enrich(traces({"service.name": name}), None)
    assert e.computed > 3


def test_oversize_resource_enriched_but_not_cached() -> None:
    e = enricher({"attributes": {"a": "1"}, "max_resource_bytes": 64})
    for _ in range(3):
        req = traces({"service.name": "s", "big": "x" * 100})
        e.enrich(req, None)
        assert resource_of(req)["a"] == "1"
    assert e.computed == 3
    sample = e.metrics.registry.get_sample_value(
        "gym_sidecar_limit_hits_total", {"limit": "enrich_max_resource_bytes"}
    )
    assert sample == 3


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[EngineContractServer]:
    with EngineContractServer(tmp_path / "docker.sock") as server:
        server.add(
            FakeContainer(
                CID,
                "gym-model-1",
                "gym/model:1.2",
                {"com.docker.compose.project": "gym", "com.docker.compose.service": "model"},
                {"gym_default": "172.18.0.5"},
            )
        )
        yield server


def docker_enricher(engine: EngineContractServer, **docker: Any) -> Enricher:
    cfg = {"base_url": engine.base_url, "api_version": "1.45", **docker}
    return enricher({"docker": cfg})


def test_docker_miss_enriches_without_docker_then_fills(engine: EngineContractServer) -> None:
    engine.delay_s = 0.3

    async def run() -> None:
        e = docker_enricher(engine)
        try:
            first = traces({"container.id": CID})
            e.enrich(first, "10.1.1.1:555")
            assert "container.name" not in resource_of(first)  # not waited for

            def enriched() -> bool:
                req = traces({"container.id": CID})
                e.enrich(req, "10.1.1.1:555")
                return resource_of(req).get("container.name") == "gym-model-1"

            assert await wait_for(enriched)
            req = traces({"container.id": CID})
            e.enrich(req, None)
            assert resource_of(req) == {
                "container.id": CID,
                "container.name": "gym-model-1",
                "container.image.name": "gym/model",
                "container.image.tags": ["1.2"],
                "container.image.tag": "1.2",
                "container.label.com.docker.compose.project": "gym",
                "container.label.com.docker.compose.service": "model",
            }
            assert engine.count(f"/containers/{CID}/json") == 1
        finally:
            e.close()

    asyncio.run(run())


def test_docker_by_peer_address_and_negative_cache(engine: EngineContractServer) -> None:
    async def run() -> None:
        e = docker_enricher(engine)
        try:

            def by_peer() -> bool:
                req = traces({"service.name": "m"})
                e.enrich(req, "172.18.0.5:40000")
                return resource_of(req).get("container.id") == CID

            assert await wait_for(by_peer)
            unknown = "ab" * 32
            for _ in range(20):
                e.enrich(traces({"container.id": unknown}), None)
                await asyncio.sleep(0.01)
            await wait_for(lambda: engine.count(f"/containers/{unknown}/json") >= 1)
            await asyncio.sleep(0.1)
            assert engine.count(f"/containers/{unknown}/json") == 1  # negative result cached
            # Loopback peers (the sidecar-per-pod case) are never looked up.
            e.enrich(traces({"service.name": "local"}), "127.0.0.1:5000")
            await asyncio.sleep(0.1)
            assert engine.count("/containers/json") == 1
        finally:
            e.close()

    asyncio.run(run())


def test_docker_pending_lookups_are_bounded(engine: EngineContractServer) -> None:
    engine.delay_s = 0.2

    async def run() -> None:
        e = docker_enricher(engine, max_pending_lookups=2, lookup_threads=1)
        try:
            for i in range(5):
                e.enrich(traces({"container.id": f"{i:012x}"}), None)
            sample = e.metrics.registry.get_sample_value(
                "gym_sidecar_limit_hits_total", {"limit": "enrich_docker_pending"}
            )
            assert sample == 3
        finally:
            e.close()

    asyncio.run(run())


def test_stage_counts_and_passes_on() -> None:
    metrics = SelfMetrics()
    tail = CollectStage(metrics)
    cfg = EnrichConfig.model_validate({"attributes": {"a": "1"}, "docker": {"enabled": False}})
    stage = build_enrich_stage(cfg, tail, metrics)
    batch = Batch(Signal.TRACES, traces({"service.name": "s"}), items=1, peer="10.0.0.1:1")
    assert isinstance(batch.message, TraceRequest)

    async def run() -> None:
        await stage.start()
        await stage.consume(batch)
        await stage.shutdown(1.0)
        await stage.shutdown(1.0)

    asyncio.run(run())
    assert tail.batches == [batch]
    assert resource_of(batch.message)["a"] == "1"
    for outcome in ("received", "passed"):
        value = metrics.registry.get_sample_value(
            "gym_sidecar_stage_items_total",
            {"stage": "enrich", "signal": "traces", "outcome": outcome},
        )
        assert value == 1
