"""The derived metrics as the admin /metrics renders them (Prometheus text format)."""

from __future__ import annotations

import asyncio

import gym_telemetry_semconv as semconv
from gym_sidecar.metrics.config import MetricsConfig
from gym_sidecar.metrics.prometheus import resource_labels, sanitize_name
from gym_sidecar.metrics.stage import build_derive_stage
from gym_sidecar.selfmetrics import SelfMetrics
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
from prometheus_client.parser import text_string_to_metric_families

from testkit.otlp_samples import trace_batch
from tests.sidecar.metrics.traces import (
    ROLLOUT_SCOPE,
    VERIFY_SCOPE,
    request,
    rollout,
    set_attrs,
    verify,
)
from tests.support.collect_stage import CollectStage

LABELS = {
    "service_name": "math_with_judge",
    "nemo_gym_server_name": "math_with_judge",
    "nemo_gym_server_type": "resources",
}


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset({**LABELS, **labels}.items())


def test_histograms_counters_and_rate_render_with_resource_labels() -> None:
    metrics = SelfMetrics()
    stage = build_derive_stage(MetricsConfig(temporality="delta"), CollectStage(metrics), metrics)
    slow = verify(2000)
    req = request(
        {
            ROLLOUT_SCOPE: [rollout(800), rollout(2500), rollout(45_000)],
            VERIFY_SCOPE: [
                verify(20),
                verify(30, reward=0.0),
                slow,
                verify(7, succeeded=False, error_type="ValueError"),
            ],
        }
    )

    async def go() -> None:
        await stage.consume(trace_batch(req))
        await stage.flush()  # closes the success-rate window; Prometheus stays cumulative
        await stage.consume(trace_batch(request({ROLLOUT_SCOPE: [rollout(900)]})))

    asyncio.run(go())
    got = samples(metrics.render().decode())
    r = "gym_rollout_duration_ms"
    assert got[key(r + "_bucket", le="500.0")] == 0
    assert got[key(r + "_bucket", le="1000.0")] == 2
    assert got[key(r + "_bucket", le="2500.0")] == 3
    assert got[key(r + "_bucket", le="30000.0")] == 3
    assert got[key(r + "_bucket", le="60000.0")] == 4
    assert got[key(r + "_bucket", le="+Inf")] == 4
    assert got[key(r + "_count")] == 4
    assert got[key(r + "_sum")] == 800 + 2500 + 45_000 + 900

    v = "gym_verify_duration_ms"
    assert got[key(v + "_count", succeeded="true")] == 3
    assert got[key(v + "_sum", succeeded="true")] == 2050
    assert got[key(v + "_bucket", succeeded="true", le="25.0")] == 1
    assert got[key(v + "_count", succeeded="false", error_type="ValueError")] == 1
    assert got[key("gym_verify_count_total", succeeded="true")] == 3
    assert got[key("gym_verify_count_total", succeeded="false", error_type="ValueError")] == 1
    assert got[key("gym_verify_success_rate")] == 0.75
    assert got[("gym_sidecar_derived_spans_total", frozenset({("span", "gym.rollout")}))] == 4

    # exemplars appear in the OpenMetrics format, with the span's real ids
    om = openmetrics(metrics.registry).decode()
    assert f'trace_id="{slow.trace_id.hex()}"' in om
    assert f'span_id="{slow.span_id.hex()}"' in om


def test_label_names_are_sanitized_and_collisions_joined() -> None:
    assert sanitize_name("service.name") == "service_name"
    assert sanitize_name("k8s.pod.name") == "k8s_pod_name"
    assert sanitize_name("0day") == "key_0day"
    assert sanitize_name("__x") == "key__x"
    res = Resource()
    set_attrs(res.attributes, {"a.b": "1", "a_b": "2", "flag": True, "n": 3})
    assert resource_labels(res) == {"a_b": "1;2", "flag": "true", "n": "3"}


def test_metric_names_follow_semconv() -> None:
    assert sanitize_name(semconv.METRIC_VERIFY_SUCCESS_RATE) == "gym_verify_success_rate"
