"""The agent follows the sidecar's span groups: a real sidecar process, the real poller,
and a real agent process serving a wrapped FastAPI app."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from gym_telemetry import environment_variables as env_vars
from gym_telemetry import remote_config, span_groups
from gym_telemetry.endpoints import traced_verify_endpoint
from gym_telemetry.remote_config import RemoteConfigPoller
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from testkit.otlp_samples import add_resource
from testkit.sink import RecordingSink
from tests.support.ports import free_port, wait_listening
from tests.support.sidecar_proc import SidecarProcess

TOKEN = "agent-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
VERIFY_SCOPE = semconv.scope_name(semconv.GROUP_VERIFY)
SERVICE = "res-under-test"
POLL_INTERVAL_S = 0.3
SERVER_KIND = Span.SpanKind.SPAN_KIND_SERVER


def request(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=5) as resp:
        raw = resp.read()
        return json.loads(raw) if raw else None


def wait_until(predicate: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as s:
        yield s


@pytest.fixture
def sidecar(sink: RecordingSink) -> Iterator[SidecarProcess]:
    sc = SidecarProcess(
        backend=sink.endpoint,
        config={
            "span_groups": {"spec": "default,verify", "token": TOKEN},
            "metrics": {"interval_s": 0.5},
        },
    ).start()
    try:
        yield sc
    finally:
        sc.stop()


def put(sc: SidecarProcess, doc: dict[str, Any]) -> Any:
    return request("PUT", sc.admin_url + "/v1/span-groups", doc, AUTH)


# --- the poller against a real sidecar -------------------------------------------------


def test_poller_applies_answers_uses_etags_and_keeps_last_set(sidecar: SidecarProcess) -> None:
    applied: list[frozenset[str]] = []
    poller = RemoteConfigPoller(
        sidecar.admin_url, SERVICE, 60.0, apply=lambda g: applied.append(frozenset(g))
    )
    assert poller.poll_once()
    assert applied[-1] == semconv.PRESETS["default"] | {
        semconv.GROUP_VERIFY,
        semconv.GROUP_MODEL_CALL,
    }
    assert not poller.poll_once()  # same ETag: 304, nothing applied
    assert poller.not_modified == 1 and len(applied) == 1

    put(sidecar, {"spec": "default", "modes": {"verify": "metrics", "job": "off"}})
    assert poller.poll_once()
    assert semconv.GROUP_VERIFY in applied[-1]  # metrics mode: agents still create them
    assert semconv.GROUP_JOB not in applied[-1]

    sidecar.stop()
    assert not poller.poll_once()
    assert poller.failures == 1 and len(applied) == 2
    assert poller.last_groups == applied[-1]


def test_unreachable_from_start_keeps_local_config() -> None:
    span_groups.configure_from_env({env_vars.GYM_TELEMETRY_SPAN_GROUPS: "default,sandbox"})
    before = span_groups.enabled_groups()
    port = free_port()  # nothing listens there
    poller = remote_config.start_polling(
        SERVICE,
        environ={
            env_vars.GYM_TELEMETRY_SIDECAR_ADMIN_URL: f"http://127.0.0.1:{port}",
            env_vars.GYM_TELEMETRY_POLL_INTERVAL_S: "0.05",
        },
    )
    try:
        assert poller is not None and poller.running
        assert wait_until(lambda: poller.failures >= 3)
        assert span_groups.enabled_groups() == before
        assert poller.last_groups is None
    finally:
        remote_config.stop_polling()
    assert not poller.running and remote_config.current_poller() is None
    assert (
        remote_config.start_polling(SERVICE, {env_vars.GYM_TELEMETRY_POLL_INTERVAL_S: "0"}) is None
    )


class _RecordedWaits(threading.Event):
    """The poller's stop event, recording each wait between polls instead of sleeping;
    set after ``limit`` waits, which ends the poller's loop."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        if len(self.waits) >= self.limit:
            self.set()
        return self.is_set()


def test_waits_between_polls_are_jittered() -> None:
    # Nothing listens: every poll fails at once; the loop goes on with jittered waits.
    poller = RemoteConfigPoller(f"http://127.0.0.1:{free_port()}", SERVICE, 10.0)
    waits = _RecordedWaits(limit=30)
    poller._stop = waits
    poller.start()
    assert poller._thread is not None
    poller._thread.join(60)
    assert not poller.running and poller.polls == 30
    timeouts = [w for w in waits.waits if w is not None]
    assert len(timeouts) == 30
    low, high = 10.0 * (1 - remote_config.JITTER), 10.0 * (1 + remote_config.JITTER)
    assert all(low <= w <= high for w in timeouts)
    assert len(set(timeouts)) > 1  # not every agent of a fleet polls in step


def test_bad_answers_are_failures_not_changes(sidecar: SidecarProcess) -> None:
    # The sidecar's OTLP/HTTP port answers 404/405 for this path: not a span-group answer.
    applied: list[frozenset[str]] = []
    poller = RemoteConfigPoller(sidecar.http_url, SERVICE, 1.0, apply=applied.append)
    assert not poller.poll_once()
    assert poller.failures == 1 and applied == []


# --- a real agent process --------------------------------------------------------------


class AgentApp:
    """``tests.agent.span_groups_app`` in a subprocess, pointed at ``sidecar``."""

    def __init__(
        self, sidecar: SidecarProcess, log_dir: Path, extra_args: tuple[str, ...] = ()
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_"))}
        env.update(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{sidecar.grpc_endpoint}",
                "OTEL_BSP_SCHEDULE_DELAY": "100",
                # Local config without verify: the sidecar's answer must bring it back.
                "GYM_TELEMETRY_SPAN_GROUPS": "default,-verify",
                env_vars.GYM_TELEMETRY_SIDECAR_ADMIN_URL: sidecar.admin_url,
                env_vars.GYM_TELEMETRY_POLL_INTERVAL_S: str(POLL_INTERVAL_S),
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.log_path = log_dir / "agent.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.agent.span_groups_app",
                    "--port",
                    str(self.port),
                    "--service",
                    SERVICE,
                    *extra_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=Path(__file__).resolve().parents[2],
            )
        try:
            wait_listening(self.port, timeout_s=60)
        except TimeoutError:
            self.stop()
            raise AssertionError(self.log_path.read_text()) from None

    def stats(self) -> dict[str, Any]:
        doc: dict[str, Any] = request("GET", self.url + "/_stats")
        return doc

    def created(self, group: str) -> int:
        return int(self.stats()["created"].get(group, 0))

    def verify(self, n: int) -> None:
        for i in range(n):
            assert request(
                "POST", self.url + "/verify", {"n": i}, {"Content-Type": "application/json"}
            )

    def wait_polls(self, count: int) -> None:
        """Wait until the poller has completed ``count`` more polls (not a time)."""
        start = self.stats()["polls"]
        assert wait_until(lambda: self.stats()["polls"] >= start + count)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def verify_spans_at(sink: RecordingSink) -> int:
    return sum(1 for s in sink.spans() if s.scope == VERIFY_SCOPE)


def test_agent_follows_the_sidecar(
    sidecar: SidecarProcess, sink: RecordingSink, tmp_path: Path
) -> None:
    agent = AgentApp(sidecar, tmp_path)
    try:
        # The sidecar's answer replaces the local config (default, without verify).
        assert wait_until(lambda: "verify" in agent.stats()["enabled"])
        agent.verify(5)
        assert agent.created("verify") == 5
        assert sink.wait_for(lambda: verify_spans_at(sink) == 5)

        # verify off: within two poll intervals the agent stops creating verify spans.
        put(sidecar, {"spec": "default,-verify"})
        agent.wait_polls(2)
        assert "verify" not in agent.stats()["enabled"]
        agent.verify(5)
        assert agent.created("verify") == 5
        # Stale agents' verify spans that still arrive are dropped by the sidecar.
        stale = ExportTraceServiceRequest()
        add_resource(stale, SERVICE, {VERIFY_SCOPE: 3})
        request(
            "POST",
            sidecar.http_url + "/v1/traces",
            stale.SerializeToString(),
            {"Content-Type": "application/x-protobuf"},
        )
        dropped = "gym_sidecar_span_group_dropped_spans_total"
        assert wait_until(
            lambda: sidecar.metric(dropped, group="verify", service=SERVICE, mode="off") == 3
        )

        # metrics mode: spans are created and counted into derived metrics, never exported.
        put(sidecar, {"spec": "default,verify", "modes": {"verify": "metrics"}})
        agent.wait_polls(2)
        assert "verify" in agent.stats()["enabled"]
        agent.verify(4)
        assert agent.created("verify") == 9
        derived = "gym_verify_count_total"
        assert wait_until(lambda: sidecar.metric(derived, service_name=SERVICE) == 9)
        assert wait_until(
            lambda: sidecar.metric(dropped, group="verify", service=SERVICE, mode="metrics") == 4
        )
        assert verify_spans_at(sink) == 5

        # Sidecar down: the agent keeps its last known set (verify still enabled).
        sidecar.stop()
        assert wait_until(lambda: agent.stats()["failures"] >= 2)
        stats = agent.stats()
        assert "verify" in stats["enabled"] and "job" in stats["enabled"]
        agent.verify(1)
        assert agent.created("verify") == 10
    except AssertionError:
        # Shown by pytest on failure: what each side saw.
        print("--- agent stats:", agent.stats() if agent.proc.poll() is None else "exited")
        print("--- agent log:\n" + agent.log_path.read_text(errors="replace")[-4000:])
        print("--- sidecar log:\n" + sidecar.log_text()[-4000:])
        raise
    finally:
        agent.stop()


def test_a_hanging_sidecar_never_holds_up_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    # A socket that completes TCP handshakes (backlog) but never answers: the poller's
    # request hangs until its timeout while handlers keep running. The request timeout is
    # raised far above what 200 calls take on a loaded machine, so the check below does
    # not depend on speed; closing the socket at the end resets the hung request.
    monkeypatch.setattr(remote_config, "MAX_TIMEOUT_S", 120.0)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    span_groups.set_enabled({"verify"})
    poller = remote_config.start_polling(
        SERVICE,
        environ={
            env_vars.GYM_TELEMETRY_SIDECAR_ADMIN_URL: f"http://127.0.0.1:{silent.getsockname()[1]}",
            env_vars.GYM_TELEMETRY_POLL_INTERVAL_S: "300",
        },
    )
    try:
        assert poller is not None and poller.timeout_s == 120.0
        assert wait_until(lambda: poller.polls == 1)

        async def handler(n: int) -> int:
            return n

        wrapped = traced_verify_endpoint(handler)

        async def many() -> int:
            return sum([await wrapped(n=i) for i in range(200)])

        assert asyncio.run(many()) == sum(range(200))
        # All 200 calls finished while the first poll was still waiting for an answer.
        assert poller.failures == 0 and poller.updates == 0
        assert span_groups.enabled_groups() == frozenset({"verify"})
    finally:
        remote_config.stop_polling(0.1)
        silent.close()


def test_fastapi_builtin_spans_are_gated_as_server(
    sidecar: SidecarProcess, sink: RecordingSink, tmp_path: Path
) -> None:
    # FastAPI's own telemetry is not controlled by the agent's span groups: the sidecar
    # must recognise its real scope name and drop it when ``server`` is off.
    agent = AgentApp(sidecar, tmp_path, ("--fastapi-telemetry",))
    try:
        agent.verify(2)

        def fastapi_spans() -> int:
            return sum(1 for s in sink.spans() if s.scope == "fastapi")

        def server_spans() -> int:
            return sum(
                1 for s in sink.spans() if s.scope == "fastapi" and s.span.kind == SERVER_KIND
            )

        # A request's SERVER span ends after its children, so once both requests' SERVER
        # spans have arrived, none of their spans is still on its way.
        assert sink.wait_for(lambda: server_spans() == 2)
        per_request = fastapi_spans() // 2
        assert per_request >= 1
        put(sidecar, {"spec": "rollout,verify"})
        before = fastapi_spans()
        agent.verify(3)
        dropped = "gym_sidecar_span_group_dropped_spans_total"
        assert wait_until(
            lambda: (
                sidecar.metric(dropped, group="server", service=SERVICE, mode="off")
                == 3 * per_request
            )
        )
        assert fastapi_spans() == before
    finally:
        agent.stop()


def test_a_garbled_answer_is_a_failure_logged_on_one_escaped_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server answering a status line with terminal controls and a newline in it: the
    poll fails (it does not raise) and its log line quotes the bytes escaped."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"\x1b[2JNGARBLED \x1b]8;;x\x1b\\ok\x07\r\n\r\n")

    server = threading.Thread(target=answer, daemon=True)
    server.start()
    applied: list[frozenset[str]] = []
    poller = RemoteConfigPoller(f"http://127.0.0.1:{port}", SERVICE, 1.0, applied.append)
    try:
        with caplog.at_level(logging.WARNING, logger="gym_telemetry.remote_config"):
            assert not poller.poll_once()
    finally:
        server.join(30)
        listener.close()
    assert poller.failures == 1 and not applied
    messages = [r.getMessage() for r in caplog.records if "NGARBLED" in r.getMessage()]
    assert len(messages) == 1, [r.getMessage() for r in caplog.records]
    assert "\\x1b[2JNGARBLED" in messages[0] and "\\x07\\x0d\\x0a" in messages[0]
    assert not any(c in messages[0] for c in "\x1b\x07\r\n"), repr(messages[0])
