"""End to end: a real FastAPI app instrumented with the agent's wrappers sends spans to a
real sidecar process, which derives metrics and forwards them to a real OTLP sink.

Ground truth is the app's own record of every span it ended (ids, start/end nanos), so
counts, sums and bucket counts are checked exactly, not within timing tolerances.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import httpx
import pytest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from testkit.sink import RecordingSink
from tests.sidecar.metrics.collect import points
from tests.support.ports import free_port, wait_listening
from tests.support.sidecar_proc import SidecarProcess

ROLLOUT_BOUNDS = [100.0, 400.0, 2000.0]
VERIFY_BOUNDS = [50.0, 200.0, 1000.0]
SERVICE = "math_with_judge"
REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as s:
        yield s


@pytest.fixture
def sidecar(sink: RecordingSink, request: pytest.FixtureRequest) -> Iterator[SidecarProcess]:
    """A sidecar forwarding to ``sink``; indirect parametrization overrides ``metrics``."""
    config = {
        "metrics": {
            "interval_s": 3600,  # the only export is the one SIGTERM flushes
            "cardinality_limit": 3,
            "rollout_buckets_ms": ROLLOUT_BOUNDS,
            "verify_buckets_ms": VERIFY_BOUNDS,
            **getattr(request, "param", {}),
        },
        # verify in `metrics` mode: the gate drops its spans *after* derivation
        "span_groups": {"spec": "all", "modes": {"verify": "metrics"}},
    }
    sc = SidecarProcess(backend=sink.endpoint, config=config).start()
    try:
        yield sc
    finally:
        sc.stop()


def _start_app(sidecar: SidecarProcess, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start the app on a free port and wait until it listens. A port taken between
    ``free_port`` and the app's bind (machines shared by parallel runs) gets a new port;
    any other early exit fails with the app's output."""
    for _ in range(3):
        port = free_port()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.sidecar.metrics.gym_app",
                    "--port",
                    str(port),
                    "--sidecar",
                    sidecar.grpc_endpoint,
                    "--service",
                    SERVICE,
                ],
                env={
                    "GYM_TELEMETRY_POLL_INTERVAL_S": "0",
                    "PATH": "/usr/bin:/bin",
                    "OTEL_BSP_SCHEDULE_DELAY": "100",
                },
                cwd=REPO_ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 90  # a cold start on a loaded 2-core machine
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                wait_listening(port, timeout_s=1)
                return proc, port
            except TimeoutError:
                pass
        output = log.read_text(errors="replace")
        _stop(proc)
        if "address already in use" not in output.lower():
            raise RuntimeError(f"app did not start (exit {proc.returncode}):\n{output}")
    raise RuntimeError("app could not find a free port in 3 tries")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def app(sidecar: SidecarProcess, tmp_path: Path) -> Iterator[str]:
    proc, port = _start_app(sidecar, tmp_path / "app.log")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


def bucket_index(bounds: list[float], value: float) -> int:
    return next((i for i, b in enumerate(bounds) if value <= b), len(bounds))


def prom_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]


def prom(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    found = [
        v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items())
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_metrics_from_real_wrapped_spans(
    sink: RecordingSink, sidecar: SidecarProcess, app: str
) -> None:
    with httpx.Client(base_url=app, timeout=30) as client:
        for ms in (5, 5, 5, 150, 150):
            assert client.post("/run", json={"sleep_ms": ms}).status_code == 200
        calls = [(5, "pass")] * 3 + [(80, "wrong")] * 2 + [(5, "raise_value")]
        for ms, outcome in calls:
            r = client.post("/verify", json={"sleep_ms": ms, "outcome": outcome})
            assert r.status_code == (500 if outcome.startswith("raise") else 200)
        # a third attribute set for gym.verify.*: past the limit of 3 (2 + overflow)
        assert (
            client.post("/verify", json={"sleep_ms": 5, "outcome": "raise_key"}).status_code == 500
        )
        assert client.post("/flush").json() == {"flushed": True}
        truth = client.get("/spans").json()

    rollouts = [s for s in truth if s["name"] == semconv.SPAN_ROLLOUT]
    verifies = [s for s in truth if s["name"] == semconv.SPAN_VERIFY]
    assert len(rollouts) == 5 and len(verifies) == 7
    ms = {s["span_id"]: (s["end"] - s["start"]) / 1e6 for s in truth}
    ok = [s for s in verifies if s["attributes"].get(semconv.VERIFY_SUCCEEDED) is True]
    value_err = [s for s in verifies if s["attributes"].get(semconv.ERROR_TYPE) == "ValueError"]
    key_err = [s for s in verifies if s["attributes"].get(semconv.ERROR_TYPE) == "KeyError"]
    assert (len(ok), len(value_err), len(key_err)) == (5, 1, 1)

    # -- admin /metrics, before any OTLP export ----------------------------------------
    status, text = sidecar.admin_get("/metrics")
    assert status == 200
    got = prom_samples(text)
    res = {
        "service_name": SERVICE,
        "nemo_gym_server_name": SERVICE,
        "nemo_gym_server_type": "resources",
    }
    assert prom(got, "gym_rollout_duration_ms_count", **res) == 5
    assert prom(got, "gym_rollout_duration_ms_sum", **res) == pytest.approx(
        sum(ms[s["span_id"]] for s in rollouts), rel=1e-9
    )
    for i, le in enumerate(ROLLOUT_BOUNDS):
        expected = sum(1 for s in rollouts if bucket_index(ROLLOUT_BOUNDS, ms[s["span_id"]]) <= i)
        assert prom(got, "gym_rollout_duration_ms_bucket", le=str(le), **res) == expected
    assert prom(got, "gym_verify_count_total", succeeded="true", **res) == 5
    assert (
        prom(got, "gym_verify_count_total", succeeded="false", error_type="ValueError", **res) == 1
    )
    assert prom(got, "gym_verify_count_total", otel_metric_overflow="true") == 1
    assert (
        prom(got, "gym_sidecar_derived_overflow_points_total", metric=semconv.METRIC_VERIFY_COUNT)
        == 1
    )
    assert prom(got, "gym_sidecar_limit_hits_total", limit="metrics.cardinality_limit") == 2
    assert sink.metric_requests() == []  # interval 3600 s: nothing exported yet

    # OpenMetrics (what Prometheus asks for with exemplar storage on) carries exemplars
    om = urllib.request.Request(
        sidecar.admin_url + "/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
    )
    with urllib.request.urlopen(om, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        om_text = resp.read().decode()
    linked = {
        (s.exemplar.labels["trace_id"], s.exemplar.labels["span_id"])
        for fam in openmetrics_families(om_text)
        for s in fam.samples
        if s.name == "gym_rollout_duration_ms_bucket" and s.exemplar is not None
    }
    assert linked and linked <= {(s["trace_id"], s["span_id"]) for s in rollouts}

    # the gate ran after derivation: rollout spans forwarded, verify spans (metrics) not
    assert sink.wait_spans(5)
    names = [s.span.name for s in sink.spans()]
    assert names.count(semconv.SPAN_ROLLOUT) == 5 and semconv.SPAN_VERIFY not in names

    # -- SIGTERM: the last partial interval arrives -------------------------------------
    assert sidecar.stop() == 0
    [req] = sink.metric_requests()
    by_metric = {
        name: points(req, name)
        for name in (
            semconv.METRIC_ROLLOUT_DURATION,
            semconv.METRIC_VERIFY_DURATION,
            semconv.METRIC_VERIFY_COUNT,
            semconv.METRIC_VERIFY_SUCCESS_RATE,
        )
    }

    [r] = by_metric[semconv.METRIC_ROLLOUT_DURATION]
    assert {
        k: r.resource[k] for k in (semconv.SERVICE_NAME, semconv.SERVER_NAME, semconv.SERVER_TYPE)
    } == {
        semconv.SERVICE_NAME: SERVICE,
        semconv.SERVER_NAME: SERVICE,
        semconv.SERVER_TYPE: "resources",
    }
    assert semconv.ROLLOUT_ID not in r.attrs
    assert r.point.count == 5
    assert r.point.sum == pytest.approx(sum(ms[s["span_id"]] for s in rollouts), rel=1e-12)
    expected_buckets = [0] * (len(ROLLOUT_BOUNDS) + 1)
    for s in rollouts:
        expected_buckets[bucket_index(ROLLOUT_BOUNDS, ms[s["span_id"]])] += 1
    assert list(r.point.bucket_counts) == expected_buckets
    assert expected_buckets[0] >= 3 and sum(expected_buckets[1:3]) == 2  # sanity of sleeps
    check_exemplars(r.point, rollouts, ms)

    verify_pts = {
        tuple(sorted(p.attrs.items())): p for p in by_metric[semconv.METRIC_VERIFY_DURATION]
    }
    ok_key = ((semconv.VERIFY_SUCCEEDED, True),)
    err_key = ((semconv.ERROR_TYPE, "ValueError"), (semconv.VERIFY_SUCCEEDED, False))
    over_key = (("otel.metric.overflow", True),)
    assert set(verify_pts) == {ok_key, err_key, over_key}
    assert verify_pts[ok_key].point.count == 5
    assert verify_pts[ok_key].point.sum == pytest.approx(
        sum(ms[s["span_id"]] for s in ok), rel=1e-12
    )
    assert verify_pts[err_key].point.count == 1
    assert verify_pts[over_key].point.count == 1 and verify_pts[over_key].resource == {}
    check_exemplars(verify_pts[ok_key].point, ok, ms)
    check_exemplars(verify_pts[over_key].point, key_err, ms)

    counts = {
        tuple(sorted(p.attrs.items())): p.point.as_int
        for p in by_metric[semconv.METRIC_VERIFY_COUNT]
    }
    assert counts == {ok_key: 5, err_key: 1, over_key: 1}
    [rate] = by_metric[semconv.METRIC_VERIFY_SUCCESS_RATE]
    assert rate.point.as_double == pytest.approx(5 / 7)


@pytest.mark.parametrize("sidecar", [{"interval_s": 0.5, "temporality": "delta"}], indirect=True)
def test_periodic_delta_exports_add_up(
    sink: RecordingSink, sidecar: SidecarProcess, app: str
) -> None:
    def rollout_points() -> list[Any]:
        return [
            p.point
            for req in sink.metric_requests()
            for p in points(req, semconv.METRIC_ROLLOUT_DURATION)
        ]

    with httpx.Client(base_url=app, timeout=30) as client:
        sent = 0
        for batch in (4, 3):
            for _ in range(batch):
                assert client.post("/run", json={"sleep_ms": 2}).status_code == 200
            assert client.post("/flush").json() == {"flushed": True}
            sent += batch
            # the timer, not shutdown, exports each batch
            assert sink.wait_for(
                lambda n=sent: sum(p.count for p in rollout_points()) == n,
                timeout_s=30,
            )
        truth = [s for s in client.get("/spans").json() if s["name"] == semconv.SPAN_ROLLOUT]

    assert sidecar.metric("gym_rollout_duration_ms_count") == 7  # Prometheus: cumulative
    assert sidecar.stop() == 0
    pts = rollout_points()
    assert len(pts) >= 2  # two periodic exports at least, each with only its new points
    assert sum(p.count for p in pts) == 7  # and nothing repeated by the shutdown flush
    assert sum(p.sum for p in pts) == pytest.approx(
        sum((s["end"] - s["start"]) / 1e6 for s in truth), rel=1e-9
    )
    for prev, cur in itertools.pairwise(pts):
        assert cur.start_time_unix_nano == prev.time_unix_nano  # contiguous windows
    temporalities = {
        p.temporality
        for req in sink.metric_requests()
        for p in points(req, semconv.METRIC_ROLLOUT_DURATION)
    }
    assert temporalities == {AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA}


def check_exemplars(point: Any, spans: list[dict[str, Any]], ms: dict[str, float]) -> None:
    """Every exemplar names one of ``spans`` (real ids) and carries its exact duration."""
    by_id = {(s["trace_id"], s["span_id"]) for s in spans}
    assert len(point.exemplars) >= 1
    for ex in point.exemplars:
        key = (ex.trace_id.hex(), ex.span_id.hex())
        assert key in by_id
        assert ex.as_double == pytest.approx(ms[key[1]], rel=1e-12)
