"""``gym-sidecar rollouts|trace|stats`` on a store filled through a real sidecar process.

Two OpenTelemetry SDK tracer providers (an agent service and a resources-server service)
emit Gym-shaped rollouts over OTLP/gRPC into a ``gym-sidecar run`` without a backend:
its local store is the default exporter. The sidecar is stopped with SIGTERM (which
flushes the derived metrics into the store too), then the commands run as processes,
reading the store from the same config file, and their printed tables are checked.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import gym_telemetry_semconv as semconv
import pytest
from gym_sidecar.store import db
from gym_sidecar.store.config import DB_FILE_NAME, LocalStoreConfig
from gym_sidecar.store.exporter import LocalStoreExporter, StoreOpenError
from gym_sidecar.store.writer import StoreMetrics
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from tests.support.sidecar_proc import SidecarProcess

ROLLOUTS = 20
FAILING = {3, 11, 17}
AGENT = "nemo-gym/simple_agent"
RESOURCES = "nemo-gym/weather_tool"


def _provider(service: str, endpoint: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({semconv.SERVICE_NAME: service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint, insecure=True)))
    return provider


def _emit(endpoint: str, base_ns: int) -> None:
    """ROLLOUTS rollouts; rollout i lasts (i + 1) * 10 ms; FAILING ones' verifier raises."""
    agent, resources = _provider(AGENT, endpoint), _provider(RESOURCES, endpoint)
    server = agent.get_tracer(semconv.scope_name(semconv.GROUP_SERVER))
    rollout_t = agent.get_tracer(semconv.scope_name(semconv.GROUP_ROLLOUT))
    client = agent.get_tracer(semconv.scope_name(semconv.GROUP_HTTP_CLIENT))
    res_server = resources.get_tracer(semconv.scope_name(semconv.GROUP_SERVER))
    verify_t = resources.get_tracer(semconv.scope_name(semconv.GROUP_VERIFY))
    for i in range(ROLLOUTS):
        rid = f"{i}-0"
        start = base_ns + i * 1_000_000_000
        end = start + (i + 1) * 10_000_000
        ok = i not in FAILING
        run = server.start_span(
            "POST /run", kind=SpanKind.SERVER, start_time=start, attributes={"http.route": "/run"}
        )
        ctx = trace.set_span_in_context(run)
        rollout = rollout_t.start_span(
            semconv.SPAN_ROLLOUT, ctx, start_time=start, attributes={semconv.ROLLOUT_ID: rid}
        )
        call = client.start_span(
            "POST /verify",  # the agent's CLIENT span, named by the HTTP semconv
            trace.set_span_in_context(rollout),
            kind=SpanKind.CLIENT,
            start_time=end - 3_000_000,
        )
        # the resources server continues the trace from the propagated client context
        remote = trace.set_span_in_context(trace.NonRecordingSpan(call.get_span_context()))
        route = res_server.start_span(
            "POST /verify",
            remote,
            kind=SpanKind.SERVER,
            start_time=end - 2_500_000,
            attributes={"http.route": "/verify"},
        )
        verify = verify_t.start_span(
            semconv.SPAN_VERIFY,
            trace.set_span_in_context(route),
            start_time=end - 2_000_000,
            attributes={semconv.ROLLOUT_ID: rid, semconv.VERIFY_SUCCEEDED: ok},
        )
        if not ok:
            verify.set_status(Status(StatusCode.ERROR, "VerifierCrash: on purpose"))
            verify.set_attribute(semconv.ERROR_TYPE, "VerifierCrash")
            rollout.set_status(Status(StatusCode.ERROR, "verify failed"))
        verify.end(end - 1_000_000)
        route.end(end - 500_000)
        call.end(end - 100_000)
        rollout.end(end)
        run.end(end + 100_000)
    for provider in (agent, resources):
        assert provider.force_flush(10_000)
        provider.shutdown()


@dataclass
class Store:
    config: Path
    store_dir: Path


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    workdir = tmp_path_factory.mktemp("inspect")
    store_dir = workdir / "store"
    sidecar = SidecarProcess(
        config={
            "local_store": {"data_dir": str(store_dir)},
            "metrics": {"interval_s": 3600},  # one export: the SIGTERM flush
            "span_groups": {"spec": "per_rollout"},  # keep the verify spans
        },
        log_dir=workdir,
    ).start()
    try:
        _emit(sidecar.grpc_endpoint, time.time_ns() - 600 * 1_000_000_000)
        deadline = time.monotonic() + 120  # generous: a loaded machine writes slowly
        while time.monotonic() < deadline:
            if (
                sidecar.metric("gym_sidecar_store_written_items_total", signal="traces")
                >= 5 * ROLLOUTS
            ):
                break
            time.sleep(0.1)
    finally:
        assert sidecar.stop() == 0
    assert sidecar.config_path is not None
    yield Store(sidecar.config_path, store_dir)


def cli(*args: str) -> tuple[int, str]:
    out = subprocess.run(
        [sys.executable, "-m", "gym_sidecar.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )
    return out.returncode, out.stdout + out.stderr


def _ids(text: str) -> list[str]:
    """Rollout ids in table rows, in printed order."""
    return [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")]


def test_rollouts_lists_every_rollout_newest_first(store: Store) -> None:
    code, text = cli("rollouts", "--config", str(store.config), "--limit", "50")
    assert code == 0, text
    assert _ids(text) == [f"{i}-0" for i in reversed(range(ROLLOUTS))]
    assert "simple_agent, weather_tool" in text
    assert text.count("failed") == len(FAILING)


def test_rollouts_filters(store: Store) -> None:
    flags = ("--store-dir", str(store.store_dir))
    code, text = cli("rollouts", *flags, "--failed")
    assert code == 0
    assert sorted(_ids(text)) == sorted(f"{i}-0" for i in FAILING)
    _, text = cli("rollouts", *flags, "--slowest", "3")
    assert _ids(text) == ["19-0", "18-0", "17-0"]
    _, text = cli("rollouts", *flags, "--since", "5m", "--limit", "50")
    # rollout i started 600 - i seconds ago: only i > 300 would be in 5 minutes
    assert _ids(text) == []
    assert "no rollouts match" in text
    _, text = cli("rollouts", *flags, "--since", "1h", "--limit", "50")
    assert len(_ids(text)) == ROLLOUTS  # ... and a window that holds them all lists them
    _, text = cli("rollouts", *flags, "--service", "weather_tool", "--limit", "3")
    assert _ids(text) == ["19-0", "18-0", "17-0"]
    _, text = cli("rollouts", *flags, "--service", "math_with_judge")
    assert _ids(text) == []


def test_trace_by_rollout_id_and_trace_id_prefix(store: Store) -> None:
    code, text = cli("trace", "--store-dir", str(store.store_dir), "11-0")
    assert code == 0, text
    for name in (
        "POST /run",
        semconv.SPAN_ROLLOUT,
        "POST /verify",
        semconv.SPAN_VERIFY,
    ):
        assert name in text
    assert text.count("POST /verify") == 2  # the agent's CLIENT span and the SERVER span
    assert "⇢ weather_tool" in text  # the cross-process edge: client -> resources server
    assert "error.type=VerifierCrash" in text
    assert "5 spans" in text
    trace_id = text.split("trace ", 1)[1].split()[0]
    code, again = cli("trace", "--store-dir", str(store.store_dir), trace_id[:12])
    assert code == 0 and trace_id in again and "rollout 11-0" in again


def test_trace_unknown_id_exits_1(store: Store) -> None:
    code, text = cli("trace", "--store-dir", str(store.store_dir), "no-such-rollout")
    assert code == 1
    assert "no rollout or trace" in text


def test_stats(store: Store) -> None:
    code, text = cli("stats", "--config", str(store.config))
    assert code == 0, text
    spans_row = next(
        line for line in text.splitlines() if "rollout duration" in line and "spans" in line
    )
    # nearest rank over 10, 20, ... 200 ms
    assert [c.strip() for c in spans_row.split("│")[-4:-1]] == ["100", "190", "200"]
    points_row = next(line for line in text.splitlines() if semconv.METRIC_ROLLOUT_DURATION in line)
    assert points_row.split("│")[3].strip() == str(ROLLOUTS)  # flushed on SIGTERM
    ok = ROLLOUTS - len(FAILING)
    assert f"85.0% ({ok}/{ROLLOUTS})" in text
    assert text.count(f"({ok}/{ROLLOUTS})") == 2  # from spans and from gym.verify.count


def test_missing_store_and_bad_flags(tmp_path: Path) -> None:
    code, text = cli("rollouts", "--store-dir", str(tmp_path / "nothing"))
    assert code == 1
    assert "cannot open the local store" in text
    code, text = cli("rollouts", "--store-dir", str(tmp_path), "--since", "soon")
    assert code == 2
    assert "not a duration" in text


def test_old_schema_store_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    store_dir = tmp_path / "old"
    with closing(db.connect(store_dir / DB_FILE_NAME)) as conn:
        conn.execute(f"PRAGMA user_version={db.SCHEMA_VERSION - 1}")  # an older release's
    for command in ("rollouts", "stats"):
        code, text = cli(command, "--store-dir", str(store_dir))
        assert code == 1, text
        said = " ".join(text.split())  # rich wraps long lines
        assert f"schema version {db.SCHEMA_VERSION - 1}" in said, text
        assert "move the file away" in said, text
        assert "Traceback" not in text
    # the sidecar refuses it too, as a start failure with the same reason
    with pytest.raises(StoreOpenError, match="schema version"):
        LocalStoreExporter(store_dir / DB_FILE_NAME, LocalStoreConfig(), StoreMetrics())
