"""Interop of the h2 gRPC exporter with a real grpc-go server: Jaeger v2 (built from the
Go module proxy by the real-backends tooling) with memory storage, checked through
Jaeger's own HTTP query API. Plain and gzip (compressed-flagged messages)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from gym_sidecar.core.exporter import Outcome
from gym_sidecar.core.stage import Signal
from gym_sidecar.export.config import BackendConfig
from gym_sidecar.export.grpc_h2 import GrpcH2Exporter

from tests.sidecar.export.helpers import run, trace_request
from tests.support.ports import free_port, wait_listening
from tests.support.wait import wait_for

pytestmark = pytest.mark.peer

_CANDIDATES = (
    os.environ.get("GYM_TELEMETRY_JAEGER", ""),
    str(Path("~/.cache/gym-telemetry/peers/jaeger-v1.76.0/bin/jaeger").expanduser()),
)


def _binary() -> Path | None:
    for c in _CANDIDATES:
        if c and os.access(c, os.X_OK):
            return Path(c)
    return None


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(OTLP/gRPC URL, query API base URL) of a Jaeger with memory storage."""
    binary = _binary()
    if binary is None:
        pytest.skip("no Jaeger v2 binary (built by the real-backends tooling) on this machine")
    grpc_port, http_port, query_port, query_grpc = (free_port() for _ in range(4))
    config = {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query"],
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["batch"],
                    "exporters": ["jaeger_storage_exporter"],
                }
            },
            "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
        },
        "extensions": {
            "jaeger_query": {
                "storage": {"traces": "mem"},
                "http": {"endpoint": f"127.0.0.1:{query_port}"},
                "grpc": {"endpoint": f"127.0.0.1:{query_grpc}"},
            },
            "jaeger_storage": {"backends": {"mem": {"memory": {"max_traces": 10000}}}},
        },
        "receivers": {
            "otlp": {
                "protocols": {
                    "grpc": {"endpoint": f"127.0.0.1:{grpc_port}"},
                    "http": {"endpoint": f"127.0.0.1:{http_port}"},
                }
            }
        },
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "mem"}},
    }
    work = tmp_path_factory.mktemp("jaeger")
    (work / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with (work / "jaeger.log").open("wb") as log:
        proc = subprocess.Popen(
            [str(binary), "--config", str(work / "config.yaml")], stdout=log, stderr=log
        )
    try:
        wait_listening(grpc_port, timeout_s=60)
        wait_listening(query_port, timeout_s=60)
        yield f"http://127.0.0.1:{grpc_port}", f"http://127.0.0.1:{query_port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
