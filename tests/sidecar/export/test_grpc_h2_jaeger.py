"""Interop of the h2 gRPC exporter with a real grpc-go server: Jaeger v2 (built from the
Go module proxy by the real-backends tooling on first use, minutes; cached after) with
memory storage, run by :class:`tests.support.jaeger.JaegerServer` and checked through
Jaeger's own HTTP query API. Plain and gzip (compressed-flagged messages)."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator

import pytest
from gym_sidecar.core.exporter import Outcome
from gym_sidecar.core.stage import Signal
from gym_sidecar.export.config import BackendConfig
from gym_sidecar.export.grpc_h2 import GrpcH2Exporter

from testkit.wait import wait_for
from tests.sidecar.export.helpers import run, trace_request
from tests.support.jaeger import JaegerServer, jaeger_binary

# The first use builds Jaeger from the Go module proxy (minutes on a cold machine).
pytestmark = [pytest.mark.peer, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(OTLP/gRPC URL, query API base URL) of a Jaeger with memory storage: the runner the
    real-backends tier uses, with the binary it builds on first use (cached after)."""
    try:
        binary = jaeger_binary()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    with JaegerServer(tmp_path_factory.mktemp("jaeger"), binary) as server:
        yield server.otlp_grpc_endpoint, server.query_url


def _spans(query: str, service: str) -> list[dict[str, object]]:
    url = f"{query}/api/traces?service={service}&limit=1000"
    with urllib.request.urlopen(url, timeout=10) as resp:
        data = json.load(resp).get("data") or []
    return [span for trace in data for span in trace["spans"]]


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_jaeger_stores_every_span_the_h2_exporter_sent(
    jaeger: tuple[str, str], compression: str
) -> None:
    otlp, query = jaeger
    tag = f"h2-{compression}"
    req = trace_request(tag, 40)
    now = time.time_ns()
    for span in req.resource_spans[0].scope_spans[0].spans:
        span.start_time_unix_nano, span.end_time_unix_nano = now - 5_000_000, now  # recent
        span.trace_id = os.urandom(16)  # its own traces: Jaeger merges spans by trace id
    payload = req.SerializeToString()

    async def send() -> None:
        exporter = GrpcH2Exporter(BackendConfig(url=otlp, compression=compression))  # type: ignore[arg-type]
        result = await exporter.export(Signal.TRACES, payload, 40)
        await exporter.close()
        assert result.outcome is Outcome.SUCCESS, result.message

    run(send())
    assert wait_for(lambda: len(_spans(query, f"svc-{tag}")) == 40, timeout_s=30)
    spans = _spans(query, f"svc-{tag}")
    assert sorted(s["operationName"] for s in spans) == sorted(f"{tag}-{i}" for i in range(40))  # type: ignore[type-var]
    tags = {t["key"]: t["value"] for t in spans[0]["tags"]}  # type: ignore[attr-defined]
    assert tags["test.tag"] == tag
